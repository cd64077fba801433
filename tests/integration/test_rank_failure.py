"""A crash on one of several processes keeps the last good state (issue 30, item 4).

A real two-process ``accelerate launch`` of ``train.py`` (gloo on the CPU) whose reward function raises on process 1
only, at step 2's generation batch (tests/integration/_flaky_reward.py). The processes agree on the failure (one
all-reduce of an error flag after the rewards are gathered, sharpgrpo/training/rank_agreement.py), stop together,
save ``checkpoint-1`` (the last finished step) together, write ``trainer_state.json`` and the plot, and the run
prints one error line naming the process and the error, with no worker traceback. Before, process 0 waited in the
gather until the launcher killed it: nothing was saved ("No checkpoint was saved") and no plot was written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def test_reward_error_on_one_process_saves_the_last_finished_step(tiny_model_path, tmp_path):
    from test_multiprocess import free_port

    output_dir = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/multi_gpu.yaml",
        "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()), "train.py",
        "--config", "configs/demo.yaml", "--model_name_or_path", tiny_model_path, "--max_steps", "4",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
        "--reward_funcs", "_flaky_reward.reward_down_on_process_1", "--output_dir", str(output_dir),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests" / "integration"), env.get("PYTHONPATH")]))
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output[-4000:]
    line = lines[0]
    assert line.startswith("error: training stopped at step 2 by ProcessFailure: on process 1 of 2, reward function "
                           "'reward_down_on_process_1' raised ConnectionError: reward server unreachable."), line
    assert f"saved in {output_dir / 'checkpoint-1'}" in line
    assert output.count("Traceback") <= 1, output[-4000:]  # the launcher's own ChildFailedError report at most

    checkpoint = output_dir / "checkpoint-1"
    assert (checkpoint / "sharpgrpo_checkpoint_complete").exists()
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "optimizer.pt").exists()
    assert {p.name for p in checkpoint.glob("rng_state_*.pth")} == {"rng_state_0.pth", "rng_state_1.pth"}
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == 1
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [1]
    assert (output_dir / "training_curves.png").stat().st_size > 10_000
