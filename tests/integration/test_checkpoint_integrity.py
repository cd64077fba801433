"""Rule 2 of "nothing lost": a checkpoint carries content checksums written at save (every file: weights, optimizer,
scheduler, random and strategy states) and verified at resume, through real ``sharpgrpo train`` runs of the tiny model.
Bytes changed in place (the size and the header kept, as a damaged disk block leaves them) are refused naming the
file; ``--resume_from_checkpoint true`` skips such a checkpoint, naming it, and resumes from the newest one that
verifies; a resume with another ``--seed`` than the saved run's warns naming it."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sharpgrpo.run.lifecycle import COMPLETE_MARKER

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def train(output_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "sharpgrpo", "train", "--config", "demo", "--output_dir", str(output_dir),
               "--save_completions", "false", "--plot", "false", "--save_strategy", "steps", "--save_steps", "1",
               *extra]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400, check=False)


def last_line(stderr: str) -> str:
    return [part for part in stderr.replace("\r", "\n").split("\n") if part.strip()][-1]


def listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def change_in_place(path: Path, offset: int, data: bytes) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)
    assert path.stat().st_size == size


def test_changed_bytes_are_refused_naming_the_file_and_the_last_good_checkpoint_is_one_that_verifies(tmp_path):
    run = tmp_path / "run"
    first = train(run, "--max_steps", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    marker = (run / "checkpoint-2" / COMPLETE_MARKER).read_text()
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "sharpgrpo_strategy_state.pt"):
        assert f"file\t{name}\t" in marker and "\tsha256:" in marker.split(f"file\t{name}\t")[1].split("\n")[0], name

    # A damaged block inside optimizer.pt (past the zip header: torch.load would read other Adam moments).
    optimizer = run / "checkpoint-2" / "optimizer.pt"
    change_in_place(optimizer, optimizer.stat().st_size // 2, b"\x13\x37" * 8)
    before = listing(tmp_path)
    refused = train(run, "--max_steps", "3", "--resume_from_checkpoint", str(run / "checkpoint-2"))
    assert refused.returncode == 1
    assert last_line(refused.stderr).startswith(f"error: {optimizer} changed since it was saved"), refused.stderr[-2000:]
    assert listing(tmp_path) == before  # the refusal wrote nothing

    # NaN bytes in the weights of checkpoint-2 too: `true` skips it, naming the file, and resumes from checkpoint-1;
    # the resume without the saved run's seed (0) warns naming it.
    weights = run / "checkpoint-2" / "model.safetensors"
    (header_len,) = struct.unpack("<Q", weights.read_bytes()[:8])
    change_in_place(weights, 8 + header_len, struct.pack("<f", float("nan")) * 4)
    resumed = train(run, "--max_steps", "3", "--resume_from_checkpoint", "true", "--seed", "7")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = " ".join(resumed.stderr.split())
    assert f"skipping checkpoint-2: {weights} changed since it was saved" in said, said[-3000:]
    assert f"resuming from {run / 'checkpoint-1'}" in said
    assert "was saved by a run with other settings: seed 0 -> 7 (the prompt order and every sampled completion)" in said
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 3
