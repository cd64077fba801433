"""Nothing lost, nothing silent, with real ``python train.py`` runs of the tiny model: a reward function that raises
at step 2 (as a dead retrieval server or a bad row reached mid-run does) leaves the last good weights and optimizer
(a complete checkpoint-1), trainer_state.json and the plot, exits 1 with the error as the last line on screen (the
progress bar closed first), and resumes; a reward returning NaN mid-run stops naming the function and the value; a
second run on a folder a live run holds is refused; a reward that never differs within a group trains and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharpgrpo.run.lifecycle import COMPLETE_MARKER

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

FAULTY = '''
import os
import sys
def fails_at_step_2(prompts, completions, allowed, trainer_state=None, **kwargs):
    if os.environ.get("FAULT") == "constant":
        return [1.0] * len(completions)
    if trainer_state.global_step >= 1 and os.environ.get("FAULT") == "raise":
        raise RuntimeError("retrieval server at 127.0.0.1:8000 refused the connection")
    if trainer_state.global_step >= 1 and os.environ.get("FAULT") == "exit":
        sys.exit("reward server gone")
    if trainer_state.global_step >= 1 and os.environ.get("FAULT") == "interrupt":
        raise KeyboardInterrupt
    if trainer_state.global_step >= 1 and os.environ.get("FAULT") == "nan":
        return [0.5] * (len(completions) - 1) + [float("nan")]
    return [float(len(c) % 2) for c in completions]
'''


def run(output_dir: Path, tmp_path: Path, fault: str, *extra: str, steps: int = 3, wait: bool = True):
    (tmp_path / "faulty_rewards.py").write_text(FAULTY)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", FAULT=fault)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(tmp_path), env.get("PYTHONPATH", "")])
    command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/demo.yaml"),
               "--output_dir", str(output_dir), "--max_steps", str(steps), "--save_completions", "false",
               "--reward_funcs", "faulty_rewards.fails_at_step_2", *extra]  # fmt: skip
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, check=False)


def last_line(stderr: str) -> str:
    """What the terminal shows last: the text after the final newline or carriage return that is not blank."""
    return [part for part in stderr.replace("\r", "\n").split("\n") if part.strip()][-1]


def test_an_error_mid_run_saves_the_last_good_state_and_is_the_last_line(tmp_path):
    output_dir = tmp_path / "run"
    crashed = run(output_dir, tmp_path, "raise")
    assert crashed.returncode == 1, crashed.stderr[-3000:]
    assert last_line(crashed.stderr).startswith(
        "error: training stopped at step 2 by RuntimeError: retrieval server at 127.0.0.1:8000 refused the connection."
        f" The last good state (weights and optimizer after step 1) is saved in {output_dir / 'checkpoint-1'}"
    ), crashed.stderr[-2000:]
    checkpoint = output_dir / "checkpoint-1"
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", COMPLETE_MARKER):
        assert (checkpoint / name).is_file(), name
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1]
    assert (output_dir / "training_curves.png").stat().st_size > 10_000

    resumed = run(output_dir, tmp_path, "none", "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stderr
    assert "[sharpgrpo] done at step 3" in resumed.stderr


def test_a_nan_reward_mid_run_stops_naming_the_function_and_value(tmp_path):
    output_dir = tmp_path / "run"
    stopped = run(output_dir, tmp_path, "nan")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert last_line(stopped.stderr).startswith(
        "error: training stopped at step 2 by RewardOutputError: Reward function 'fails_at_step_2' returned nan for "
        "completion 15 of 16"
    ), stopped.stderr[-2000:]
    assert (output_dir / "checkpoint-1" / COMPLETE_MARKER).is_file()


def test_a_second_run_on_a_live_runs_folder_is_refused(tmp_path):
    output_dir = tmp_path / "run"
    first = run(output_dir, tmp_path, "none", steps=200, wait=False)
    try:
        deadline = time.time() + 300
        while not (output_dir / "training_args.json").is_file():  # written when training begins
            assert first.poll() is None and time.time() < deadline, first.stderr.read()[-3000:]
            time.sleep(0.2)
        second = run(output_dir, tmp_path, "none", "--overwrite_output_dir", "true")
        assert second.returncode == 1
        assert last_line(second.stderr).startswith(
            f"error: output_dir={str(output_dir)!r} is in use by another running training run (process {first.pid})"
        ), second.stderr[-2000:]
    finally:
        first.kill()
        first.communicate()


def test_a_reward_constant_for_the_whole_run_is_said_in_the_summary(tmp_path):
    """Every completion scores 1: every advantage is 0 and nothing is trained; the run ends normally and its summary
    line says so (TRL says nothing)."""
    done = run(tmp_path / "run", tmp_path, "constant", steps=2)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = last_line(done.stderr)
    assert summary.startswith("[sharpgrpo] done at step 2") and (
        "WARNING: the reward was the same 1 for every completion of every group at all 2 logged steps" in summary
    ), summary


@pytest.mark.parametrize("fault", ["exit", "interrupt"])
def test_user_code_ending_the_process_keeps_the_step_log_and_the_last_state(tmp_path, fault):
    """A reward that calls sys.exit(...) or raises KeyboardInterrupt at step 2 (no signal was sent): the run keeps
    checkpoint-1 and the step log like any other error, and its one line names where it was raised."""
    output_dir = tmp_path / "run"
    stopped = run(output_dir, tmp_path, fault)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    raised = "SystemExit('reward server gone')" if fault == "exit" else "KeyboardInterrupt"
    assert last_line(stopped.stderr).startswith(
        f"error: training stopped at step 2 by {raised} raised in {tmp_path / 'faulty_rewards.py'}:"
    ), stopped.stderr[-2000:]
    assert "not by sharpgrpo. The last good state (weights and optimizer after step 1) is saved in " in last_line(
        stopped.stderr)
    assert (output_dir / "checkpoint-1" / COMPLETE_MARKER).is_file()
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1]
