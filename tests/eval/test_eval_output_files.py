"""Rule 1 for ``sharpgrpo eval``: it writes x.json, x.md and x.samples.jsonl beside whatever else the folder holds,
and never replaces a file of those names that it did not write (a user's results/x.md); a refusal creates nothing.
The files it wrote are listed in the folder's marker (``sharpgrpo.run.output_dir.check_output_files``), so a rerun on
the same --output continues and replaces its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # three eval subprocesses, about 15 s


def sharpgrpo_eval(cwd: Path, output: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", SHARPGRPO_DEBUG="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "sharpgrpo", "eval", "--model", "sharpgrpo-tiny", "--task", "addition",
               "--limit", "1", "--max_new_tokens", "4", "--no_progress", "--output", output]  # fmt: skip
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_never_replaces_a_users_companion_file_and_a_refusal_creates_nothing(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "X.md").write_text("my notes on run X\n")
    before = listing(tmp_path)
    refused = sharpgrpo_eval(tmp_path, "results/X.json")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "error: --output: results/X.md exists and sharpgrpo eval did not write it"
    ), refused.stderr[-2000:]
    assert listing(tmp_path) == before

    written = sharpgrpo_eval(tmp_path, "results/Y.json")  # beside the user's file: allowed, which stays as it was
    assert written.returncode == 0, written.stderr[-2000:]
    assert {"Y.json", "Y.md", "Y.samples.jsonl"} <= {p.name for p in results.iterdir()}
    assert (results / "X.md").read_text() == "my notes on run X\n"
    again = sharpgrpo_eval(tmp_path, "results/Y.json")  # its own files: continued and rewritten
    assert again.returncode == 0, again.stderr[-2000:]
