"""Rule 6 of "nothing lost": data paths are literal, a bad row is named by file and line whatever layer would find it,
a LoRA adapter as teacher loads through its base, and user code that exits on import is named, each through
``sharpgrpo train`` as the command line runs it, with the disk unchanged by a refusal (``helpers.disk_listing``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import disk_listing
from test_entry_point_errors import DEMO, run_command

REPO = Path(__file__).resolve().parents[1]
ROW = {"prompt": "letters: a b c\nword:", "allowed": "abc"}


def _train(tmp, *args: str) -> list[str]:
    return ["train", "--config", DEMO, "--output_dir", str(tmp / "out"), "--max_steps", "1", *args]


def _refused(argv, folder, capsys, monkeypatch) -> str:
    before = disk_listing(folder)
    line = run_command(argv, capsys, monkeypatch)
    assert disk_listing(folder) == before, argv
    return line


def test_a_data_file_name_is_read_literally_not_as_a_glob_pattern(tmp_path, capsys, monkeypatch):
    """`prompts[v2].jsonl` is that file, not the pattern matching `promptsv.jsonl` beside it (datasets' data_files
    reads a name as a pattern). Its second row is longer than the model's context, so loading that file, and only
    that file, is refused naming its row before the model loads; `promptsv.jsonl` would train."""
    long_row = {**ROW, "prompt": "letters: a b c " + "a " * 3000 + "\nword:"}
    (tmp_path / "prompts[v2].jsonl").write_text(json.dumps(ROW) + "\n" + json.dumps(long_row) + "\n")
    (tmp_path / "promptsv.jsonl").write_text(json.dumps(ROW) + "\n")
    data = str(tmp_path / "prompts[v2].jsonl")
    argv = _train(tmp_path, "--dataset_name", data, "--dataset_kwargs", "{conversational: false}")
    line = _refused(argv, tmp_path, capsys, monkeypatch)
    assert line.startswith(f"error: dataset_name={data!r}: row 2: the prompt has "), line


def test_a_lone_surrogate_escape_is_named_by_file_and_line(tmp_path, capsys, monkeypatch):
    """A string cut mid-emoji (`\\ud83d` without its pair): Python's json reads it, Arrow refuses the file without a
    line; the check names the line and the field."""
    data = tmp_path / "cut.jsonl"
    data.write_text(json.dumps(ROW) + "\n" + '{"prompt": "letters: a b c \\ud83d\\nword:", "allowed": "abc"}\n')
    line = _refused(_train(tmp_path, "--dataset_name", str(data), "--dataset_kwargs", "{}"), tmp_path, capsys,
                    monkeypatch)  # fmt: skip
    assert line.startswith(f"error: dataset_name={str(data)!r}: line 2: field 'prompt' holds a lone surrogate escape "
                           "(\\ud83d): half of a UTF-16 pair"), line  # fmt: skip


def test_a_reward_module_that_parses_arguments_or_exits_on_import_is_named(tmp_path, capsys, monkeypatch):
    (tmp_path / "argv_reward.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr')\nargs = parser.parse_args()\n"
        "def reward(prompts, completions, **kwargs):\n    return [0.0] * len(completions)\n")  # fmt: skip
    (tmp_path / "exit_reward.py").write_text("import sys\nsys.exit('set MY_API_KEY first')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = _refused(_train(tmp_path, "--reward_funcs", "argv_reward.reward"), tmp_path, capsys, monkeypatch)
    assert line.startswith(
        "error: reward_funcs[0]='argv_reward.reward': Importing module 'argv_reward' for 'argv_reward.reward' ended "
        f"the process (SystemExit(2) in {tmp_path / 'argv_reward.py'}:4; it printed "
    ) and "error: unrecognized arguments: --config" in line, line
    line = _refused(_train(tmp_path, "--reward_funcs", "exit_reward.reward"), tmp_path, capsys, monkeypatch)
    assert line.startswith(
        "error: reward_funcs[0]='exit_reward.reward': Importing module 'exit_reward' for 'exit_reward.reward' ended "
        f"the process (SystemExit('set MY_API_KEY first') in {tmp_path / 'exit_reward.py'}:2)"
    ), line


@pytest.mark.slow  # two one-step training runs
def test_a_lora_adapter_teacher_loads_through_its_prepared_base(tmp_path):
    """A LoRA run of sharpgrpo-tiny saves an adapter whose base is the prepared name; as another run's teacher_model
    it loads through that base (merged), where transformers alone would look the name up on the Hub."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    common = ["--config", "demo", "--max_steps", "1", "--save_completions", "false", "--plot", "false"]

    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sharpgrpo", "train", *common, *args], env=env,
                              capture_output=True, text=True, timeout=400, check=False)  # fmt: skip

    adapter = tmp_path / "lora"
    assert train("--use_peft", "true", "--output_dir", str(adapter)).returncode == 0
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == "sharpgrpo-tiny"
    distilled = train("--strategies", "opd", "--teacher_model", str(adapter), "--output_dir", str(tmp_path / "opd"))
    assert distilled.returncode == 0, distilled.stderr[-2000:]
    assert "[sharpgrpo] done at step 1" in distilled.stderr
