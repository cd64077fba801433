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
        problem = model_folder_problem(path)
        if problem is not None:
            raise ConfigError(f"{field}={name!r}: the folder {path.resolve()} {problem}")
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


# What transformers and PEFT read from a model folder, by kind: any one file of each group must be there.
MODEL_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_folder_problem(path: Path) -> str | None:
    """What a model (or LoRA adapter) folder lacks before ``from_pretrained`` would fail inside transformers, as the
    rest of a sentence naming the file; None when it is complete. A model folder needs ``config.json``, its weights
    (every shard its index lists) and its tokenizer; an adapter folder ``adapter_config.json`` naming its base model
    and the adapter's weights (its tokenizer may come from the base)."""
    import json

    if (path / "adapter_config.json").is_file():
        try:
            config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            return f"has an adapter_config.json that is not valid JSON ({error})."
        if not isinstance(config, dict) or not config.get("base_model_name_or_path"):
            return "has an adapter_config.json that names no base_model_name_or_path (the adapter's base model)."
        if not any((path / f).is_file() for f in ADAPTER_WEIGHTS):
            return f"has adapter_config.json but no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})."
        return None
    if not (path / "config.json").is_file():
        return "has no config.json (not a saved model; a training run writes one into its output_dir at the end)."
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"has a config.json that is not valid JSON ({error})."
    weights = [f for f in MODEL_WEIGHTS if (path / f).is_file()]
    if not weights:
        return f"has config.json but no weights ({', '.join(MODEL_WEIGHTS)})."
    index = next((f for f in weights if f.endswith(".index.json")), None)
    if index is not None and not any(f in weights for f in ("model.safetensors", "pytorch_model.bin")):
        try:
            shards = set(json.loads((path / index).read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
            return f"has a {index} that is not a weight index ({type(error).__name__}: {error})."
        missing = sorted(shard for shard in shards if not (path / shard).is_file())
        if missing:
            return f"lacks {missing[0]}, a weight file its {index} lists" + (
                f" ({len(missing)} missing)." if len(missing) > 1 else ".")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        return f"has no tokenizer ({', '.join(TOKENIZER_FILES)}); save the tokenizer with the model."
    return None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(repo_id, f, revision=revision), str)
        for f in ("config.json", "adapter_config.json")
    )


def record_base_model(model, name: str) -> None:
    """Make a PEFT model's adapters name ``name`` (the model as the user gave it: a prepared name or a Hub id) as their
    base model, instead of the folder it was loaded from (a prepared model's folder in this machine's cache), so a
    saved or pushed adapter loads elsewhere. Does nothing for a model without adapters."""
    for config in (getattr(model, "peft_config", None) or {}).values():
        config.base_model_name_or_path = name


def adapter_base_model(path: str) -> str | None:
    """The base model named by a LoRA adapter directory (a prepared name resolved to its folder), or None if ``path``
    is not an adapter directory."""
    import json

    from sharpgrpo.models.prepared import resolve_model_name

    config_file = Path(path) / "adapter_config.json"
    if not config_file.is_file():
        return None
    base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{config_file} names no base_model_name_or_path; cannot load the adapter's base model.")
    return resolve_model_name(base)
