"""Loading a checkpoint for evaluation: the tiny model's name, a local directory, a hub id, or a LoRA adapter.

A directory holding ``adapter_config.json`` is a PEFT adapter: its base model (``base_model_name_or_path``, itself
resolved the same way) is loaded and the adapter applied on top; ``merge=True`` folds the adapter into the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sharpgrpo.models.prepared import resolve_model_name
from sharpgrpo.models.source import adapter_base_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    """``auto`` is bfloat16 on a GPU and float32 elsewhere."""
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose auto or one of {', '.join(DTYPES)}.")
    return DTYPES[dtype]


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model or adapter directory (an adapter without tokenizer files uses its base's)."""
    from transformers import AutoTokenizer

    path = resolve_model_name(name_or_path)
    base = adapter_base_model(path)
    source = path
    if base is not None and not any((Path(path) / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        source = base
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_and_tokenizer(
    name_or_path: str, device: str | None = None, dtype: str = "auto", merge: bool = False
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` in eval mode on ``device``.

    Args:
        name_or_path: ``sharpgrpo-tiny``, a local model or adapter directory, or a hub id.
        device: ``cuda``, ``cpu``, ... (default: a GPU where there is one).
        dtype: ``auto`` (bfloat16 on GPU, float32 on CPU), ``float32``, ``bfloat16`` or ``float16``.
        merge: for an adapter directory, merge the adapter into the base weights (``merge_and_unload``).
    """
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    path = resolve_model_name(name_or_path)
    base = adapter_base_model(path)
    if base is None:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    else:
        from peft import PeftModel

        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype), path)
        if merge:
            model = model.merge_and_unload()
    model.to(device)
    model.eval()
    return model, load_tokenizer(name_or_path)


def merged_model_directory(name_or_path: str, directory: str | Path) -> str:
    """A directory vLLM can load: the model itself, or (for an adapter) base + adapter merged and saved there."""
    path = resolve_model_name(name_or_path)
    if adapter_base_model(path) is None:
        return path
    model, tokenizer = load_model_and_tokenizer(path, device="cpu", dtype="bfloat16", merge=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)
