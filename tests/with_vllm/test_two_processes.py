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

import importlib.util

import pytest
from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


NEEDS_DEEPSPEED = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason='DeepSpeed is not installed: DS_BUILD_OPS=0 pip install -e ".[deepspeed]"')
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


@pytest.mark.parametrize("launch_config", ["multi_gpu", pytest.param("zero3", marks=NEEDS_DEEPSPEED)])
def test_every_process_engine_gets_the_policy_after_every_step(launch_config, tiny_vllm_model, tmp_path):
    """On 2 processes (data parallel, and DeepSpeed ZeRO-3 where each process holds a shard and TRL gathers them for the
    sync), each process's engine scores a fixed text as the full policy does right after every sync, and differs after
    the optimizer step."""
    import conftest
    from test_colocate_training import SYNC_TOLERANCE

    conftest._ENGINES.clear()
    output = tmp_path / "run"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / f"configs/accelerate/{launch_config}.yaml"), "--num_processes", "2", "--mixed_precision",
               "no", "--main_process_port", str(free_port()), str(REPO / "tests/with_vllm/_sync_worker.py"),
               tiny_vllm_model, str(output)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for rank in range(2):
        report = json.loads((output / f"sync_rank{rank}.json").read_text())
        print(launch_config, rank, report)
        assert report["processes"] == 2 and report["deepspeed"] == (launch_config == "zero3")
        assert len(report["records"]) == 3
        for step, record in enumerate(report["records"]):
            assert record["synced_gap"] <= SYNC_TOLERANCE, (rank, step, record)
            assert record["stale_gap"] > 10 * SYNC_TOLERANCE, (rank, step, record)
