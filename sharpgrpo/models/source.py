"""Where a model comes from: an existing model directory, a prepared model's name (``sharpgrpo-tiny``), or a Hub id;
checked before anything loads, with one line naming the field and what is wrong."""

from __future__ import annotations

import os
import re
from pathlib import Path

from sharpgrpo.paths import looks_like_local_path
from sharpgrpo.validation import ConfigError

# A Hugging Face Hub repo id: "name" or "org/name" (huggingface_hub's rule: letters, digits, "-", "_", ".").
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")


def check_model_source(name: str, field: str = "model_name_or_path", revision: str | None = None) -> None:
    """Refuse a model that is neither an existing model directory nor a possible Hub id, naming what is wrong."""
    from sharpgrpo.models.prepared import prepared_model_names

    if name.startswith("sharpgrpo-") and name in prepared_model_names():  # built locally on first use
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise ConfigError(
                f"{field}={name!r}: the directory {path.resolve()} has no config.json (not a saved model; "
                "a training run writes one into its output_dir at the end)."
            )
        return
    if path.exists():
        raise ConfigError(f"{field}={name!r}: {path.resolve()} is a file; give the model's directory or a Hub id.")
    if looks_like_local_path(name):
        raise ConfigError(
            f"{field}={name!r}: no such directory ({path.resolve()}), and it is not a Hugging Face Hub id "
            "(org/name)."
        )
    if not _HUB_ID.match(name):
        raise ConfigError(
            f"{field}={name!r}: neither an existing directory nor a valid Hugging Face Hub id (org/name: letters, "
            "digits, '-', '_', '.')."
        )
    if _offline() and not _in_hub_cache(name, revision):
        raise ConfigError(
            f"{field}={name!r}: no such directory ({path.resolve()}), and offline (HF_HUB_OFFLINE=1) the Hub "
            "cache has no model of that id; give a local model directory or download it first."
        )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(repo_id, f, revision=revision), str)
        for f in ("config.json", "adapter_config.json")
    )
