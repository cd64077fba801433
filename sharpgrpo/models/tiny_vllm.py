"""``sharpgrpo-tiny-vllm``: the tiny model at a size vLLM's CPU backend accepts.

vLLM's CPU attention refuses a head size of 16 (``sharpgrpo-tiny``: hidden 64, 4 heads); it accepts 32, 64, 80 and up.
This is the same build as :mod:`sharpgrpo.models.tiny` (byte-level tokenizer, chat template, supervised warm start on
the demo task's text), with hidden size 256 and 4 layers, so 4 heads of 64 (about 3.4M parameters). Built locally on
first use into ``$SHARPGRPO_CACHE``; nothing is downloaded. The vLLM tests (``pytest -m vllm``) generate with it.
"""

from __future__ import annotations

from pathlib import Path

from sharpgrpo.models.prepared import register_prepared_model
from sharpgrpo.models.tiny import TINY_MODEL_VERSION, build_tiny_model

TINY_VLLM_MODEL_NAME = "sharpgrpo-tiny-vllm"
TINY_VLLM_HIDDEN_SIZE = 256  # 4 attention heads of 64: a head size vLLM's CPU attention supports
TINY_VLLM_LAYERS = 4


@register_prepared_model(TINY_VLLM_MODEL_NAME)
def prepare_tiny_vllm_model(cache_dir: Path) -> Path:
    return build_tiny_model(cache_dir / f"tiny-vllm-qwen2-v{TINY_MODEL_VERSION}", hidden_size=TINY_VLLM_HIDDEN_SIZE,
                            num_layers=TINY_VLLM_LAYERS)
