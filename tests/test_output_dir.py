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
    with pytest.raises(ConfigError, match=r"^output_dir='.*project' holds files that sharpgrpo train did not write "
                                          r"\(thesis.tex; no training run's marker"), \
            guard_output_dir(project, resuming=False, overwrite=True):
        pass
    assert sorted(p.name for p in project.iterdir()) == ["thesis.tex"]  # not even a lock file was left there
    assert (project / "thesis.tex").read_text() == "not a run"


def test_a_folder_that_looks_like_a_run_but_carries_no_marker_is_not_emptied(tmp_path):
    """A model's own folder (config.json, model.safetensors) used to count as a run's and was emptied."""
    model = tmp_path / "my_model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ConfigError, match="did not write"), guard_output_dir(model, resuming=False, overwrite=True):
        pass
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]


def test_an_input_inside_the_run_to_replace_is_refused_and_nothing_removed(tmp_path):
    folder = tmp_path / "run"
    with guard_output_dir(folder, resuming=False, overwrite=False):
        (folder / "checkpoint-2").mkdir()
        (folder / "model.safetensors").write_bytes(b"w")
    before = sorted(p.name for p in folder.iterdir())
    inputs = {"model_name_or_path": str(folder / "checkpoint-2"), "dataset_name": "demo"}
    with pytest.raises(ConfigError, match=r"would delete an input of this run \(model_name_or_path='.*checkpoint-2'"), \
            guard_output_dir(folder, resuming=False, overwrite=True, inputs=inputs):
        pass
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_run_without_a_checkpoint_is_not_offered_a_resume(tmp_path):
    folder = tmp_path / "run"
    with guard_output_dir(folder, resuming=False, overwrite=False):
        (folder / "trainer_state.json").write_text("{}")
    with pytest.raises(ConfigError) as refused, guard_output_dir(folder, resuming=False, overwrite=False):
        pass
    assert "resume_from_checkpoint" not in str(refused.value)
    assert "saved no checkpoint to resume from: replace it with --overwrite_output_dir true" in str(refused.value)


def test_the_marker_says_what_wrote_the_folder(tmp_path):
    from sharpgrpo.run.output_dir import OUTPUT_MARKER, read_output_marker

    folder = tmp_path / "run"
    with guard_output_dir(folder, resuming=False, overwrite=False):
        pass
    marker = read_output_marker(folder)
    assert marker["written_by"] == "sharpgrpo train" and marker["created"] and marker["command_line"]
    assert (folder / OUTPUT_MARKER).is_file()


def test_every_writing_command_follows_one_rule(tmp_path):
    """check_output_target / claim_output_target: new, empty or the same command's folder is written; a folder of
    someone else's files, of another command, or of the same command with other settings is refused untouched."""
    from sharpgrpo.run.output_dir import check_output_target, claim_output_target

    report = tmp_path / "report"
    check_output_target(report, command="sharpgrpo plot")
    claim_output_target(report, command="sharpgrpo plot")
    (report / "reward.png").write_bytes(b"png")
    check_output_target(report, command="sharpgrpo plot")  # its own output: replaced by a new plot
    with pytest.raises(ConfigError, match=r"holds the output of `sharpgrpo plot`"):
        check_output_target(report, command="sharpgrpo compare")
    claim_output_target(tmp_path / "cmp", command="sharpgrpo compare", settings={"seeds": [0, 1]})
    (tmp_path / "cmp" / "report.md").write_text("r")
    check_output_target(tmp_path / "cmp", command="sharpgrpo compare", settings={"seeds": [0, 1]})
    with pytest.raises(ConfigError, match=r"with other settings \(differing: seeds\)"):
        check_output_target(tmp_path / "cmp", command="sharpgrpo compare", settings={"seeds": [0, 2]})
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "reward.png").write_bytes(b"my own figure")
    with pytest.raises(ConfigError, match=r"holds files that sharpgrpo plot did not write \(reward.png"):
        check_output_target(mine, command="sharpgrpo plot")
    assert (mine / "reward.png").read_bytes() == b"my own figure"


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
