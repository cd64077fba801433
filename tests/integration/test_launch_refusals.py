"""A launch that is not what was asked for stops in one line before the first step (issue 30, item 1).

Real ``accelerate launch`` runs of ``train.py`` on the CPU, two processes: an FSDP2 accelerate config (accelerate
builds FSDP on GPUs only, and without the check trains plain data parallel with no warning), and ``--use_cpu false``
on a machine without GPUs (each process initialises no process group and would train alone into the same
``output_dir``). The main process prints one ``error:`` line naming the accelerate config and what was built, the
other exits quietly with the same status, and nothing is trained. (The launcher's own ``ChildFailedError`` report
follows; it is torch's, not the workers'.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def launch_train(config_file: str, model_path: str, output_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    from test_multiprocess import free_port

    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file, "--num_processes", "2",
        "--mixed_precision", "no", "--main_process_port", str(free_port()), "train.py", "--config",
        "configs/demo.yaml", "--model_name_or_path", model_path, "--max_steps", "1", "--per_device_train_batch_size",
        "8", "--output_dir", str(output_dir), *extra,
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


def test_fsdp_config_on_the_cpu_refused(tiny_model_path, tmp_path):
    result = launch_train("configs/accelerate/fsdp2.yaml", tiny_model_path, tmp_path / "run")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]  # the main process's line only
    assert lines[0].startswith(
        "error: launch: the accelerate config configs/accelerate/fsdp2.yaml asks for FSDP (fsdp_version 2) but "
        "use_cpu is true"), lines[0]
    assert result.stderr.count("Traceback") <= 1  # the launcher's ChildFailedError report; none from the workers
    assert not (tmp_path / "run" / "trainer_state.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with GPUs, use_cpu false builds MULTI_GPU as asked")
def test_processes_that_each_see_only_themselves_refused(tiny_model_path, tmp_path):
    result = launch_train("configs/accelerate/multi_gpu.yaml", tiny_model_path, tmp_path / "run", "--use_cpu", "false")
    assert result.returncode != 0
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(
        "error: launch: the accelerate config configs/accelerate/multi_gpu.yaml launched 2 processes but each sees 1 "
        "(accelerate built NO with 1 process)"), lines[0]
    assert not (tmp_path / "run" / "trainer_state.json").exists()
