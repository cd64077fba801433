"""Two processes (``accelerate launch``, gloo on the CPU), each with its colocated vLLM engine, train 2 steps of the
demo with ``sharpgrpo train --use_vllm true``: every process syncs its policy into its own engine and generates its
share of the batch (TRL's colocate mode on several processes)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM
REPO = Path(__file__).resolve().parents[2]


def test_two_processes_train_two_steps_with_colocated_vllm(tiny_vllm_model, tmp_path):
    import conftest

    conftest._ENGINES.clear()  # this process's shared engine is not needed while the two others run
    output = tmp_path / "run"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "configs/accelerate/multi_gpu.yaml"), "--num_processes", "2", "--mixed_precision", "no",
               "-m", "sharpgrpo.cli.train", "--config", "demo", "--model_name_or_path", "sharpgrpo-tiny-vllm",
               "--use_vllm", "true", "--max_steps", "2", "--output_dir", str(output)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    state = json.loads((output / "trainer_state.json").read_text())
    logs = [entry for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 2 and len(logs) == 2
    assert all(math.isfinite(entry["loss"]) and math.isfinite(entry["reward"]) for entry in logs)
