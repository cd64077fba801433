"""Models the project prepares itself, by name: ``sharpgrpo-tiny`` and the others registered here.

A prepared model is built (or fetched and converted) once into the cache (``$SHARPGRPO_CACHE``, default
``~/.cache/sharpgrpo``) and from then on loaded like any local checkpoint, with the ordinary
``from_pretrained(path)``. Its name is accepted wherever a model name or path is: ``train.py``,
``sharpgrpo eval``, the diagnostics. A module adds one with ``@register_prepared_model("name")`` on a function
``builder(cache_dir: Path) -> Path`` that returns the prepared directory (reusing an earlier build).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

from sharpgrpo.registry import Registry
from sharpgrpo.settings import load_settings

# Modules whose import registers prepared models; with the settings' (sharpgrpo.settings), imported by the registry on
# its first lookup.
BUILTIN_MODEL_MODULES = ("sharpgrpo.models.tiny", "sharpgrpo.models.tiny_vllm", "sharpgrpo.models.tiny_moe",
                         "sharpgrpo.models.smol")


def _register_prepared_models() -> None:
    for module in BUILTIN_MODEL_MODULES:
        importlib.import_module(module)
    load_settings()


PREPARED_MODELS: Registry[Callable[[Path], Path]] = Registry("prepared model", load=_register_prepared_models)
register_prepared_model = PREPARED_MODELS.register


def default_cache_dir() -> Path:
    return Path(os.environ.get("SHARPGRPO_CACHE", Path.home() / ".cache" / "sharpgrpo"))


def prepared_model_names() -> list[str]:
    return PREPARED_MODELS.names()


def resolve_model_name(name_or_path: str) -> str:
    """A prepared model's name -> its built local directory (built on first use); anything else unchanged."""
    if name_or_path not in PREPARED_MODELS:
        return name_or_path
    return str(PREPARED_MODELS.get(name_or_path)(default_cache_dir()))
