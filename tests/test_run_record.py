"""Every command writes a run record (`sharpgrpo.run.run_record`) into what it writes, and ``sharpgrpo record`` prints
one or the differences between two.

One real training run (``sharpgrpo train`` on the demo config, the tiny model, 2 steps with token telemetry, in this
process as the dispatcher runs it) feeds the commands that read a run: ``tokens --telemetry``, ``plot`` and ``eval``;
``compare --report_only`` writes its folder's record without training.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from sharpgrpo.run.run_record import RUN_RECORD, read_run_record, record_differences

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "demo.yaml")


def run_cli(argv: list[str], monkeypatch) -> None:
    """``sharpgrpo ARGV`` as the console script runs it (``sharpgrpo.cli.main``)."""
    from sharpgrpo.cli import main

    monkeypatch.setattr(sys, "argv", ["sharpgrpo", *argv])
    try:
        main(argv)
    except SystemExit as stop:
        assert stop.code in (0, None), argv


def check_common_fields(record: dict, command: str) -> None:
    """The fields every record holds, against this process's own facts."""
    assert record["record_version"] == 1 and record["command"] == command
    assert record["versions"]["python"] == platform.python_version()
    for library in ("torch", "transformers", "trl", "accelerate", "datasets"):
        assert record["versions"][library] == version(library), library
    assert record["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert record["machine"]["accelerator"] == ("cpu" if not torch.cuda.is_available() else record["machine"]
                                                ["accelerator"])  # fmt: skip
    code = record["code"]
    if (REPO / ".git").exists():  # a checkout: its commit, as git says
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert code["git_commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)


@pytest.fixture(scope="module")
def trained(tiny_model_path, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    run = tmp_path_factory.mktemp("record") / "run"
    argv = ["train", "--config", DEMO, "--model_name_or_path", tiny_model_path, "--max_steps", "2",
            "--per_device_train_batch_size", "8", "--num_generations", "4", "--max_completion_length", "6",
            "--token_telemetry", "true", "--plot", "false", "--seed", "7", "--output_dir", str(run)]  # fmt: skip
    try:
        run_cli(argv, monkeypatch)
    finally:
        monkeypatch.undo()
    return run, argv


@pytest.mark.slow
def test_train_records_the_resolved_config_and_the_card_links_it(trained):
    from sharpgrpo import SharpGRPOConfig
    from sharpgrpo.cli.train import TaskArguments

    run, argv = trained
    record = read_run_record(run)
    check_common_fields(record, "sharpgrpo train")
    assert record["command_line"] == " ".join(["sharpgrpo", *argv])
    config = record["config"]
    # every field of the training arguments, defaults included, and the task's and the model's arguments
    assert {f.name for f in dataclasses.fields(SharpGRPOConfig) if f.init} <= set(config)
    assert config["max_steps"] == 2 and config["sg_alpha"] == 2.0 and config["temperature"] == 1.0  # flag, YAML
    assert config["epsilon"] == SharpGRPOConfig.__dataclass_fields__["epsilon"].default  # a default nobody set
    assert config["TaskArguments"]["dataset_name"] == "demo"
    assert set(config["TaskArguments"]) == {f.name for f in dataclasses.fields(TaskArguments)}
    assert config["ModelConfig"]["model_name_or_path"] == argv[argv.index("--model_name_or_path") + 1]
    from sharpgrpo.strategies import STRATEGIES

    strategy = record["strategies"]["grpo_sg"]  # every parameter the strategy declares, with the run's value
    assert list(record["strategies"]) == ["grpo_sg"] and list(strategy) == list(STRATEGIES.get("grpo_sg").params)
    assert {k: strategy[k] for k in ("sg_alpha", "sg_mu", "sg_tau", "sg_lower", "sg_upper")} == {
        "sg_alpha": 2.0, "sg_mu": 0.25, "sg_tau": 1 / 9, "sg_lower": 1.0, "sg_upper": 1.4}  # the YAML's
    assert record["seeds"]["seed"] == 7 and record["seeds"]["full_determinism"] is False
    assert "data_seed" in record["seeds"] and record["processes"] == 1
    card = (run / "README.md").read_text(encoding="utf-8")
    assert f"[`{RUN_RECORD}`]({RUN_RECORD})" in card


@pytest.mark.slow
def test_tokens_plot_eval_and_compare_write_their_records(trained, tiny_model_path, tmp_path, monkeypatch):
    run, _ = trained
    run_cli(["tokens", "--telemetry", str(run), "--step", "1", "--output", str(tmp_path / "tokens")], monkeypatch)
    record = read_run_record(tmp_path / "tokens")
    check_common_fields(record, "sharpgrpo tokens")
    assert record["config"]["telemetry"] == str(run) and record["config"]["step"] == 1
    assert record["config"]["max_groups"] is not None  # an option left at its default is recorded too

    run_cli(["plot", str(run), "--output", str(tmp_path / "plot")], monkeypatch)
    record = read_run_record(tmp_path / "plot")
    check_common_fields(record, "sharpgrpo plot")
    assert record["config"]["runs"] == [str(run)] and record["config"]["spike_factor"] == 3.0

    output = tmp_path / "eval" / "kk.json"
    run_cli(["eval", "--model", str(run), "--task", "kk", "--kk_people", "3", "--limit", "1", "--max_new_tokens",
             "4", "--no_progress", "--output", str(output)], monkeypatch)  # fmt: skip
    record = read_run_record(output)  # beside it: kk.run_record.json
    assert (tmp_path / "eval" / f"kk.{RUN_RECORD}").is_file()
    check_common_fields(record, "sharpgrpo eval")
    assert record["config"]["model"] == str(run) and record["config"]["kk_people"] == [3]
    assert record["seeds"]["seed"] == json.loads(output.read_text())["settings"]["seed"]

    run_cli(["compare", "--config", "demo", "--strategies", "equal", "--seeds", "0", "1", "--output",
             str(tmp_path / "compare"), "--report_only"], monkeypatch)  # fmt: skip
    record = read_run_record(tmp_path / "compare")
    check_common_fields(record, "sharpgrpo compare")
    assert record["seeds"]["seeds"] == [0, 1] and record["config"]["strategies"] == ["equal"]
    assert "strategies" not in record  # a comparison's entries are recorded in its config; each run has its record
    assert record["command_line"] == "sharpgrpo compare --config demo --strategies equal --seeds 0 1 --output " + str(
        tmp_path / "compare") + " --report_only"


@pytest.mark.slow
def test_the_record_command_prints_a_record_and_two_records_differences(trained, tmp_path, monkeypatch, capsys):
    run, _ = trained
    capsys.readouterr()
    run_cli(["record", str(run)], monkeypatch)
    assert json.loads(capsys.readouterr().out) == read_run_record(run)

    other = tmp_path / "other"
    other.mkdir()
    changed = read_run_record(run)
    changed["config"]["learning_rate"] = 0.5
    changed["versions"]["torch"] = "0.0.1"
    changed["created"] = "another time"  # never compared
    (other / RUN_RECORD).write_text(json.dumps(changed))
    run_cli(["record", str(run), str(other)], monkeypatch)
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()[1:]]
    assert out.startswith("2 field(s) differ")
    assert lines == [f"config.learning_rate: {read_run_record(run)['config']['learning_rate']} -> 0.5",
                     f'versions.torch: "{torch.__version__}" -> "0.0.1"']  # fmt: skip
    run_cli(["record", str(run), str(run)], monkeypatch)
    assert "agree in every field" in capsys.readouterr().out


def test_differences_name_every_dotted_field_and_a_field_one_side_lacks():
    first = {"a": {"b": 1, "c": [1, 2]}, "created": "x", "d": 3}
    second = {"a": {"b": 2, "c": [1, 2]}, "created": "y", "e": 4}
    assert record_differences(first, second) == [("a.b", 1, 2), ("d", 3, None), ("e", None, 4)]
    assert record_differences(first, first) == []

