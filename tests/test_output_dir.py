"""One guard for output_dir (``sharpgrpo.run.output_dir``): a live run's folder is locked against a second run (a real
second process), a used folder is refused unless the run resumes or overwrites, and a path that is a file, below a
file or not writable is refused before anything loads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharpgrpo.run.output_dir import LOCK_NAME, guard_output_dir, previous_run_files
from sharpgrpo.validation import ConfigError

REPO = Path(__file__).resolve().parents[1]


HOLDER = (
    "import sys, time\nfrom sharpgrpo.run.output_dir import guard_output_dir\n"
    "with guard_output_dir(sys.argv[1], resuming=False, overwrite=False):\n"
    "    print('held', flush=True)\n    time.sleep(60)\n"
)


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        in_use = rf"is in use by another running training run \(process {holder.pid}\)"
        with pytest.raises(ConfigError, match=in_use), guard_output_dir(folder, resuming=True, overwrite=True):
            pass
    finally:
        holder.kill()
        holder.wait()
    with guard_output_dir(folder, resuming=False, overwrite=False):  # the lock died with its process
        assert (folder / LOCK_NAME).read_text() == str(os.getpid())


def test_a_used_folder_is_refused_unless_resuming_or_overwriting(tmp_path):
    folder = tmp_path / "run"
    with guard_output_dir(folder, resuming=False, overwrite=False):
        (folder / "trainer_state.json").write_text("{}")
        (folder / "checkpoint-3").mkdir()
    refused = r"not empty \(checkpoint-3, trainer_state.json\).*--resume_from_checkpoint true.*--overwrite_output_dir"
    with pytest.raises(ConfigError, match=refused), guard_output_dir(folder, resuming=False, overwrite=False):
        pass
    with guard_output_dir(folder, resuming=True, overwrite=False):
        assert (folder / "checkpoint-3").is_dir()  # resuming keeps everything
    with guard_output_dir(folder, resuming=False, overwrite=True):
        assert not (folder / "checkpoint-3").exists()  # another run's checkpoints would be taken for this run's
        assert not (folder / "trainer_state.json").exists()  # the whole earlier run goes (issue 32)


def test_overwriting_replaces_the_whole_earlier_run_and_nothing_else(tmp_path):
    """A 200-step run replaced by a shorter one: none of the old run's files stay (its completions would be read as the
    new run's by `sharpgrpo tokens`); a folder that holds no run is refused instead of emptied."""
    folder = tmp_path / "run"
    with guard_output_dir(folder, resuming=False, overwrite=False):
        (folder / "completions").mkdir()
        for step in (1, 100, 200):
            (folder / "completions" / f"completions_{step}.parquet").write_bytes(b"old")
        (folder / "trainer_state.json").write_text("{}")
        (folder / "notes.txt").write_text("the old run's notes")
    with guard_output_dir(folder, resuming=False, overwrite=True):
        assert previous_run_files(folder) == []
    project = tmp_path / "project"
    project.mkdir()
    (project / "thesis.tex").write_text("not a run")
    with pytest.raises(ConfigError, match=r"^output_dir='.*project' holds files that are not a training run's "
                                          r"\(thesis.tex\)"), guard_output_dir(project, resuming=False, overwrite=True):
        pass
    assert (project / "thesis.tex").read_text() == "not a run"


def test_an_empty_folder_or_a_new_one_is_used(tmp_path):
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        with guard_output_dir(folder, resuming=False, overwrite=False):
            assert folder.is_dir()


def fresh_run(folder):
    return guard_output_dir(folder, resuming=False, overwrite=False)


def test_files_and_unwritable_paths_are_refused_before_anything_loads(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"output_dir='.*file': is a file"), fresh_run(tmp_path / "file"):
        pass
    with pytest.raises(ConfigError, match=r"lies below .*file, which is a file"), fresh_run(tmp_path / "file" / "run"):
        pass
    unwritable = Path("/proc/sharpgrpo-run")  # procfs accepts no new entries, even for root
    if not Path("/proc/self").is_dir():
        pytest.skip("no /proc here to stand for a read-only filesystem")
    with pytest.raises(ConfigError, match=r"output_dir='/proc/sharpgrpo-run': cannot be written"), fresh_run(unwritable):
        pass


def test_train_py_refuses_a_used_output_dir_before_loading_a_model(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "model.safetensors").write_text("an earlier run's weights")
    started = time.time()
    done = subprocess.run([sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/demo.yaml"),
                           "--output_dir", str(folder)], capture_output=True, text=True, timeout=180, check=False,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: output_dir={str(folder)!r} is not empty")
    assert (folder / "model.safetensors").read_text() == "an earlier run's weights"
    assert time.time() - started < 120
