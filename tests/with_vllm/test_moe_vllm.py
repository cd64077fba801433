"""vLLM's CPU build and the tiny mixture of experts (docs/moe.md): it loads ``sharpgrpo-tiny-moe`` and generates,
and cannot return the routes it used (``enable_return_routed_experts`` needs its Model Runner V2, which needs Triton),
which is why ``routing_replay`` is refused with ``use_vllm``."""

from __future__ import annotations

import subprocess
import sys

from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM

ENGINE = """
import os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as TRL's colocated one
from sharpgrpo.models.vllm_cpu import guard_kernel_rebinding
guard_kernel_rebinding()
from vllm import LLM, SamplingParams
try:
    LLM(model=sys.argv[1], dtype="float32", max_model_len=256, enable_return_routed_experts=True)
except Exception as error:
    print("ROUTES REFUSED:", error)
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=256, seed=0)
out = llm.generate([{"prompt_token_ids": [60, 61, 62]}], SamplingParams(max_tokens=4, min_tokens=4, seed=0))
print("GENERATED", len(out[0].outputs[0].token_ids), getattr(out[0].outputs[0], "routed_experts", None))
"""


def test_the_cpu_build_generates_with_the_moe_but_returns_no_routes(tmp_path):
    from sharpgrpo.models.prepared import resolve_model_name

    done = subprocess.run([sys.executable, "-c", ENGINE, resolve_model_name("sharpgrpo-tiny-moe")],
                          capture_output=True, text=True, timeout=600)
    assert "GENERATED 4 None" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert "ROUTES REFUSED:" in done.stdout and "Model Runner V2" in done.stdout
