"""A colocated engine starts in a process that has loaded numba (``sharpgrpo.models.vllm_cpu``'s guard).

vLLM 0.31's CPU worker scans every loaded module when it starts and fails on llvmlite's library wrapper
(``AttributeError: '_lib_fn_wrapper' object has no attribute 'get'``); numba loads llvmlite, and ``bm25s``, the search
setting's index, loads numba. Each case runs in a fresh interpreter that imports numba first: vLLM's own ``LLM``,
started in that process as TRL starts its colocated engine, fails there without the guard (the upstream behaviour,
reproduced), and a training run and an evaluation with vLLM work with it. (An engine in its own process, vLLM's
default outside TRL, starts from a fresh interpreter and never met the problem.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM

TESTS = Path(__file__).resolve().parents[1]

BARE_ENGINE = """
import os, sys
import numba  # loads llvmlite.binding, as bm25s does
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as TRL's colocated one
from vllm import LLM
LLM(model=sys.argv[1], dtype="float32", max_model_len=256)
print("ENGINE STARTED")
"""

TRAIN_AND_EVALUATE = """
import gc, json, sys
import numba  # loads llvmlite.binding, as bm25s does
from helpers import binary_letters_reward, make_trainer, tiny_config
from sharpgrpo.evaluation.runner import evaluate

model, out = sys.argv[1], sys.argv[2]
args = tiny_config(out + "/run", use_vllm=True, vllm_mode="colocate", max_steps=1)
trainer = make_trainer(model, args, reward_funcs=[binary_letters_reward])
trainer.train()
print("TRAINED", trainer.state.global_step, trainer._last_loaded_step)
del trainer
gc.collect()
result = evaluate(model=model, task="kk", kk_people=[2], limit=1, max_new_tokens=8, dtype="float32", progress=False,
                  backend="vllm", output=out + "/eval.json")
print("EVALUATED", result["backend"])
"""


# TRL's colocated engine exports these into the test process (trl/generation/vllm_generation.py L331-335: RANK,
# LOCAL_RANK, WORLD_SIZE, then ensure_master_addr_port); a fresh user process has none of them.
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_script(script: str, *argv: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_ENV}
    env.update(PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env, timeout=600)


def test_vllm_alone_fails_to_start_an_engine_where_numba_is_loaded(tiny_vllm_model):
    result = run_script(BARE_ENGINE, tiny_vllm_model)
    assert "ENGINE STARTED" not in result.stdout, (
        "vLLM now starts an engine with numba loaded: its kernel scan was fixed upstream, and "
        "sharpgrpo.models.vllm_cpu.guard_kernel_rebinding can go")
    assert "'_lib_fn_wrapper' object has no attribute 'get'" in result.stderr, result.stderr[-3000:]


def test_training_and_evaluation_start_their_engines_where_numba_is_loaded(tiny_vllm_model, tmp_path):
    result = run_script(TRAIN_AND_EVALUATE, tiny_vllm_model, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "TRAINED 1 0" in result.stdout and "EVALUATED vllm" in result.stdout, result.stdout[-2000:]
