"""Every entry point, driven with broken inputs of each kind, answers with one ``error:`` line that names what the
user wrote: the option or config field, the file (and its line), the reward or strategy reference, the model folder.

Each case runs the command as ``sharpgrpo COMMAND ...`` does (``sharpgrpo.cli.main``: the module as ``__main__``,
with its one-line error handling) in this process, and fails when the last line is not one ``error:`` line, shows a
traceback, or names none of the inputs listed for the case. Nothing here loads a model: every input is refused
before that.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "configs" / "demo.yaml")


def run_command(argv: list[str], capsys, monkeypatch) -> str:
    """The command's exit (must be a failure) and its last stderr line."""
    from sharpgrpo.cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code not in (0, None), argv
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), err[-2000:]
    return lines[-1]


@pytest.fixture
def inputs(tmp_path, tiny_model_path):
    """Broken inputs of every kind, by name."""
    made = {"tmp": tmp_path}
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really parquet")
    (tmp_path / "twice.yaml").write_text("strategies: grpo_sg\nmax_steps: 2\nstrategies: equal\n")
    (tmp_path / "latin1.yaml").write_bytes(b"strategies: grpo_sg\n# caf\xe9\n")
    (tmp_path / "prompts.txt").write_text("letters: a b c\n")
    model = tmp_path / "model_without_weights"
    shutil.copytree(tiny_model_path, model)
    (model / "model.safetensors").unlink()
    made["model"] = model
    (tmp_path / "a_folder").mkdir()
    return made


def train(tmp, *args):
    return ["train", "--config", DEMO, "--output_dir", str(tmp / "run"), *args]


# (case, argv from the inputs, strings of which the error line must contain every one)
CASES = [
    # train: config values and their types, unknown flags, config files, data files of each format, references,
    # model and checkpoint folders
    ("train value type", lambda i: train(i["tmp"], "--num_generations", "eight"), ["num_generations", "eight"]),
    ("train out of range", lambda i: train(i["tmp"], "--sg_tau", "-1"), ["sg_tau=-1"]),
    ("train mistyped flag", lambda i: train(i["tmp"], "--lerning_rate", "1e-3"), ["--lerning_rate", "learning_rate"]),
    ("train duplicate key", lambda i: ["train", "--config", str(i["tmp"] / "twice.yaml")], ["twice.yaml", "line 3"]),
    ("train config not UTF-8", lambda i: ["train", "--config", str(i["tmp"] / "latin1.yaml")], ["latin1.yaml"]),
    ("train missing config", lambda i: ["train", "--config", str(i["tmp"] / "nope.yaml")], ["nope.yaml"]),
    ("train bad JSON line", lambda i: train(i["tmp"], "--dataset_name", str(i["tmp"] / "bad.jsonl"),
                                            "--dataset_kwargs", "{}"), ["bad.jsonl", "line 2"]),
    ("train data not UTF-8", lambda i: train(i["tmp"], "--dataset_name", str(i["tmp"] / "latin1.jsonl"),
                                             "--dataset_kwargs", "{}"), ["latin1.jsonl", "line 2"]),
    ("train broken parquet", lambda i: train(i["tmp"], "--dataset_name", str(i["tmp"] / "broken.parquet"),
                                             "--dataset_kwargs", "{}"), ["broken.parquet"]),
    ("train dataset kwargs", lambda i: train(i["tmp"], "--dataset_kwargs", '{"num_prompts": "many"}'),
     ["num_prompts", "many"]),
    ("train reward reference", lambda i: train(i["tmp"], "--reward_funcs", "no_such_module.reward"),
     ["no_such_module.reward"]),
    ("train strategy reference", lambda i: train(i["tmp"], "--strategies", "no_such_module.Strategy"),
     ["no_such_module"]),
    ("train model folder", lambda i: train(i["tmp"], "--model_name_or_path", str(i["model"])),
     ["model_without_weights", "model.safetensors"]),
    ("train checkpoint folder", lambda i: train(i["tmp"], "--resume_from_checkpoint", str(i["tmp"] / "checkpoint-7")),
     ["checkpoint-7"]),
    ("train output_dir a file", lambda i: ["train", "--config", DEMO, "--output_dir", str(i["tmp"] / "bad.jsonl")],
     ["output_dir", "bad.jsonl"]),
    # eval
    ("eval limit", lambda i: ["eval", "--model", "sharpgrpo-tiny", "--task", "kk", "--output", str(i["tmp"] / "r.json"),
                              "--limit", "0"], ["limit=0"]),
    ("eval type", lambda i: ["eval", "--model", "sharpgrpo-tiny", "--task", "kk", "--output", str(i["tmp"] / "r.json"),
                             "--n_samples", "x"], ["--n_samples", "x"]),
    ("eval mistyped", lambda i: ["eval", "--model", "sharpgrpo-tiny", "--task", "kk", "--outptu", "r.json"],
     ["--outptu", "--output"]),
    ("eval task", lambda i: ["eval", "--model", "sharpgrpo-tiny", "--task", "kkk", "--output", str(i["tmp"] / "r")],
     ["kkk"]),
    ("eval model folder", lambda i: ["eval", "--model", str(i["model"]), "--task", "kk", "--output",
                                     str(i["tmp"] / "r.json")], ["model_without_weights", "model.safetensors"]),
    ("eval output a folder", lambda i: ["eval", "--model", "sharpgrpo-tiny", "--task", "kk", "--output",
                                        str(i["tmp"] / "a_folder")], ["output", "a_folder"]),
    # compare: its options, and the config with every --set and strategy entry before any run
    ("compare jobs", lambda i: ["compare", "--config", DEMO, "--strategies", "equal", "--seeds", "0", "--output",
                                str(i["tmp"] / "c"), "--jobs", "0"], ["--jobs=0"]),
    ("compare config", lambda i: ["compare", "--config", str(i["tmp"] / "nope.yaml"), "--strategies", "equal",
                                  "--seeds", "0", "--output", str(i["tmp"] / "c")], ["nope.yaml"]),
    ("compare entry", lambda i: ["compare", "--config", DEMO, "--strategies", "equal", "grpo_sg:sg_tau=-1", "--seeds",
                                 "0", "--output", str(i["tmp"] / "c")], ["sg_tau=-1"]),
    ("compare set", lambda i: ["compare", "--config", DEMO, "--strategies", "equal", "--seeds", "0", "--output",
                               str(i["tmp"] / "c"), "--set", "max_steps=abc"], ["max_steps", "abc"]),
    ("compare strategy", lambda i: ["compare", "--config", DEMO, "--strategies", "equal", "nope", "--seeds", "0",
                                    "--output", str(i["tmp"] / "c")], ["nope"]),
    # tokens
    ("tokens top", lambda i: ["tokens", "--model", "sharpgrpo-tiny", "--prompts", str(i["tmp"] / "prompts.txt"),
                              "--output", str(i["tmp"] / "t"), "--top", "0"], ["--top=0"]),
    ("tokens prompts", lambda i: ["tokens", "--model", "sharpgrpo-tiny", "--prompts", str(i["tmp"] / "none.jsonl"),
                                  "--output", str(i["tmp"] / "t")], ["none.jsonl"]),
    ("tokens set", lambda i: ["tokens", "--model", "sharpgrpo-tiny", "--prompts", str(i["tmp"] / "prompts.txt"),
                              "--output", str(i["tmp"] / "t"), "--set", "sg_tua=0.2"], ["sg_tua"]),
    ("tokens model folder", lambda i: ["tokens", "--model", str(i["model"]), "--prompts",
                                       str(i["tmp"] / "prompts.txt"), "--output", str(i["tmp"] / "t")],
     ["model_without_weights"]),
    ("tokens completions", lambda i: ["tokens", "--model", "sharpgrpo-tiny", "--completions",
                                      str(i["tmp"] / "no_run" / "completions"), "--output", str(i["tmp"] / "t")],
     ["completions"]),
    # plot
    ("plot run", lambda i: ["plot", str(i["tmp"] / "no_run"), "--output", str(i["tmp"] / "p")], ["no_run"]),
    ("plot smooth", lambda i: ["plot", str(i["tmp"]), "--output", str(i["tmp"] / "p"), "--smooth", "2"],
     ["--smooth=2"]),
    ("plot labels", lambda i: ["plot", str(i["tmp"]), "--output", str(i["tmp"] / "p"), "--labels", "a", "b"],
     ["--labels"]),
    # serve
    ("serve port", lambda i: ["serve", "--corpus", str(i["tmp"] / "prompts.txt"), "--port", "-1"], ["--port -1"]),
    ("serve corpus", lambda i: ["serve", "--corpus", str(i["tmp"] / "corpus.jsonl")], ["corpus.jsonl"]),
    ("serve mistyped", lambda i: ["serve", "--corpus", "x.jsonl", "--prot", "1"], ["--prot", "--port"]),
]


@pytest.mark.parametrize("case, argv, named", CASES, ids=[c[0] for c in CASES])
def test_a_broken_input_is_named_in_one_line(case, argv, named, inputs, capsys, monkeypatch, restore_environment):
    line = run_command(argv(inputs), capsys, monkeypatch)
    missing = [text for text in named if text not in line]
    assert not missing, f"{case}: the error names none of {missing}: {line}"
    assert not (inputs["tmp"] / "run").exists() or not any((inputs["tmp"] / "run").iterdir())
    assert not (inputs["tmp"] / "c").exists()  # compare started no run


def test_every_command_is_driven():
    from sharpgrpo.cli import COMMANDS

    assert {argv_command(c) for c in CASES} == set(COMMANDS)


def argv_command(case) -> str:
    class Inputs(dict):
        def __missing__(self, key):
            return Path("x")

    return case[1](Inputs())[0]


def test_a_second_interrupt_is_one_line_not_a_traceback(capsys, monkeypatch):
    """The first Ctrl-C asks training for a checkpoint; a second one raises KeyboardInterrupt at once, which used to
    print a 38-line traceback."""
    from sharpgrpo.run.errors import one_line_errors

    monkeypatch.delenv("SHARPGRPO_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stop, one_line_errors(["train.py"]):
        raise KeyboardInterrupt
    assert stop.value.code == 130
    err = capsys.readouterr().err
    assert err.startswith("error: interrupted (Ctrl-C)") and err.count("\n") == 1
