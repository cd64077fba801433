"""Rule 3 of "nothing lost": a write that fails under a real ``sharpgrpo train`` run of the tiny model (a full disk,
or a file past the file size limit) keeps the step log and the last complete state, names the folder and the cause in
one line, and leaves no half-written file looking complete.

Faults as a run meets them: the run's process gets a file size limit (``RLIMIT_FSIZE``, what ``ulimit -f`` sets; a
write past it fails with EFBIG) chosen between the sizes of the checkpoint's files, so a chosen file's write fails;
and, where this process may mount one (root), the output folder is a small tmpfs that fills up (ENOSPC)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sharpgrpo.run.lifecycle import COMPLETE_MARKER

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prepared_tiny() -> str:
    """sharpgrpo-tiny built (once, cached) before a run under a file size limit loads it."""
    from sharpgrpo.models.prepared import resolve_model_name

    return resolve_model_name("sharpgrpo-tiny")


def train(output_dir: Path, *extra: str, file_size_limit: int | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])

    def limit_file_size():  # in the child only; SIGXFSZ ignored so that the write fails with EFBIG instead of a kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    command = [sys.executable, "-m", "sharpgrpo", "train", "--config", "demo", "--output_dir", str(output_dir),
               "--save_completions", "false", *extra]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, check=False,
                          preexec_fn=limit_file_size if file_size_limit else None)  # fmt: skip


def last_line(stderr: str) -> str:
    return [part for part in stderr.replace("\r", "\n").split("\n") if part.strip()][-1]


def assert_nothing_half_written(folder: Path) -> None:
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != ".sharpgrpo.lock"]
    assert not [p for p in files if p.stat().st_size == 0], files
    assert not [p for p in files if p.name.endswith(".partial")], files
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1]


def test_a_checkpoint_write_past_the_file_size_limit_is_named_and_the_half_written_checkpoint_removed(tmp_path,
                                                                                                      prepared_tiny):
    """checkpoint-1's weights (about 530 kB) fit under 800 kB, its optimizer.pt (about 1.1 MB) does not."""
    run = tmp_path / "run"
    stopped = train(run, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1",
                    file_size_limit=800_000)  # fmt: skip
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert last_line(stopped.stderr).startswith(
        f"error: training stopped after step 1: saving checkpoint-1 failed: a file in {run / 'checkpoint-1'} reached "
        f"the file size limit (ulimit -f: 800000 bytes). The half-written {run / 'checkpoint-1'} was removed; no "
        "earlier checkpoint exists."
    ), stopped.stderr[-2000:]
    assert "enforce fail" not in stopped.stderr
    assert not (run / "checkpoint-1").exists()
    assert_nothing_half_written(run)


def test_a_failed_final_save_keeps_the_step_log_and_removes_the_cut_weights(tmp_path, prepared_tiny):
    """The final model.safetensors (about 530 kB) does not fit under 400 kB; trainer_state.json does."""
    run = tmp_path / "run"
    stopped = train(run, "--max_steps", "1", file_size_limit=400_000)
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    assert last_line(stopped.stderr).startswith(
        f"error: training finished 1 steps but saving the final model into {run} failed: a file in {run} reached the "
        f"file size limit (ulimit -f: 400000 bytes)"
    ), stopped.stderr[-2000:]
    assert f"the step log is in {run / 'trainer_state.json'}; no checkpoint was saved" in last_line(stopped.stderr)
    assert not (run / "model.safetensors").exists()
    assert_nothing_half_written(run)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2.5 MB tmpfs: room for one checkpoint of the tiny model (about 1.7 MB), not two. Skipped where mounting is
    not permitted (not root, or in a container without CAP_SYS_ADMIN)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2560k", "tmpfs", str(folder)], capture_output=True,
                             check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def test_a_full_disk_at_a_checkpoint_keeps_the_last_verified_checkpoint(small_tmpfs, prepared_tiny):
    run = small_tmpfs / "run"
    stopped = train(run, "--max_steps", "3", "--save_strategy", "steps", "--save_steps", "1", "--plot", "false")
    assert stopped.returncode == 1, stopped.stderr[-3000:]
    line = last_line(stopped.stderr)
    assert line.startswith(
        f"error: training stopped after step 2: saving checkpoint-2 failed: no space left on the disk holding "
        f"{run / 'checkpoint-2'} ("
    ), stopped.stderr[-2000:]
    assert (f"The half-written {run / 'checkpoint-2'} was removed; the last good checkpoint is "
                         f"{run / 'checkpoint-1'}. (full traceback") in line  # fmt: skip
    assert "enforce fail" not in stopped.stderr
    assert (run / "checkpoint-1" / COMPLETE_MARKER).is_file() and not (run / "checkpoint-2").exists()
    history = json.loads((run / "trainer_state.json").read_text())["log_history"]
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2]
    assert not [p for p in run.rglob("*") if p.is_file() and p.stat().st_size == 0 and p.name != ".sharpgrpo.lock"]
