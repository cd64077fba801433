"""``sharpgrpo-tiny-moe``: the tiny model as a mixture of experts (Qwen3-MoE architecture), for routing replay.

The same build as :mod:`sharpgrpo.models.tiny` (byte-level tokenizer, chat template, supervised warm start on the demo
task's text), with transformers' ``Qwen3MoeForCausalLM``: 2 layers, each a sparse MoE block of 4 experts of which each
token uses 2 (``num_experts_per_tok``; top-k probabilities renormalised, ``norm_topk_prob``), and the load-balancing
auxiliary loss at Qwen3-MoE's coefficient (0.001). Attention has 4 heads of size 32 (vLLM's CPU attention refuses 16).
About 0.2M parameters; built locally on first use into ``$SHARPGRPO_CACHE`` in seconds; nothing is downloaded.
Routing replay (``routing_replay``; docs/moe.md) is tested on it.
"""

from __future__ import annotations

from pathlib import Path

from sharpgrpo.models.prepared import register_prepared_model
from sharpgrpo.models.tiny import TINY_MODEL_VERSION, build_on_first_use

TINY_MOE_MODEL_NAME = "sharpgrpo-tiny-moe"
TINY_MOE_CONFIG = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
    "router_aux_loss_coef": 0.001,
    "head_dim": 32,
}


@register_prepared_model(TINY_MOE_MODEL_NAME)
def prepare_tiny_moe_model(cache_dir: Path) -> Path:
    return build_on_first_use(cache_dir / f"tiny-qwen3-moe-v{TINY_MODEL_VERSION}", TINY_MOE_MODEL_NAME,
                              "a 2-layer Qwen3-MoE", architecture="qwen3_moe", extra_config=TINY_MOE_CONFIG)
