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
    # record
    ("record without a record", lambda i: ["record", str(i["tmp"] / "a_folder")], ["a_folder", "run_record.json"]),
    ("record missing run", lambda i: ["record", str(i["tmp"] / "no_run")], ["no_run", "no such file or folder"]),
    # serve
    ("serve port", lambda i: ["serve", "--corpus", str(i["tmp"] / "prompts.txt"), "--port", "-1"], ["--port -1"]),
    ("serve corpus", lambda i: ["serve", "--corpus", str(i["tmp"] / "corpus.jsonl")], ["corpus.jsonl"]),
    ("serve mistyped", lambda i: ["serve", "--corpus", "x.jsonl", "--prot", "1"], ["--prot", "--port"]),
    ("serve port file folder", lambda i: ["serve", "--corpus", str(i["tmp"] / "prompts.txt"), "--port_file",
                                          str(i["tmp"] / "no_folder" / "port")], ["--port_file", "no_folder", "does not exist"]),
    # vllm-serve (TRL's vllm-serve options; the model folder is checked before vLLM is looked for)
    ("vllm-serve model folder", lambda i: ["vllm-serve", "--model", str(i["tmp"] / "no_model")], ["no_model"]),
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


# ---------------------------------------------------------------------------------------------------------------
# Nothing lost (issue 42): a refused command leaves every file as it was (sizes and sha256 before and after), and
# nothing is removed or replaced before every input is checked.


def _fake_checkpoint(folder: Path, model: str, step: int, max_steps: int, without: tuple[str, ...] = ()) -> Path:
    """A checkpoint folder as transformers and sharpgrpo write it (weights, trainer state, optimizer, scheduler,
    random and strategy states; no completion marker, so the pieces every checkpoint holds are what is checked),
    without the files named in ``without``."""
    import json

    import torch

    shutil.copytree(model, folder)  # weights, config and tokenizer
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": max_steps,
                                                           "log_history": []}))  # fmt: skip
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "sharpgrpo_strategy_state.pt"):
        torch.save({"state": 1}, folder / name)
    for name in without:
        (folder / name).unlink()
    return folder


@pytest.fixture
def kept(tmp_path, tiny_model_path):
    """A user's files and a sharpgrpo run: folders a refused command must leave exactly as they were."""
    from sharpgrpo.run.output_dir import TRAIN_COMMAND, write_output_marker

    run = tmp_path / "run"
    from sharpgrpo.run.lifecycle import COMPLETE_MARKER

    for step in (2, 4):
        _fake_checkpoint(run / f"checkpoint-{step}", tiny_model_path, step=step, max_steps=4)
        (run / f"checkpoint-{step}" / COMPLETE_MARKER).write_text(f"step {step}\n")
    shutil.copy(Path(tiny_model_path) / "model.safetensors", run / "model.safetensors")  # the final model
    (run / "trainer_state.json").write_text('{"global_step": 4, "max_steps": 4, "log_history": []}')
    write_output_marker(run, TRAIN_COMMAND, argv=["--config", "demo"])
    _fake_checkpoint(tmp_path / "partial" / "checkpoint-1", tiny_model_path, step=1, max_steps=4,
                     without=("optimizer.pt",))  # fmt: skip
    model = tmp_path / "my_model"  # a model folder of the user's own: config.json, weights
    shutil.copytree(tiny_model_path, model)
    (tmp_path / "one_prompt.jsonl").write_text('{"prompt": "letters: a b\\nword:", "allowed": "ab"}\n')
    (tmp_path / "rewards_of_mine.py").write_text(
        "not_callable = 3\n"
        "def needs_answer(prompts, completions, answer, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    (tmp_path / "nested.yaml").write_text(Path(DEMO).read_text().replace(
        "reward_funcs: [allowed_letters]", "reward_funcs: [[allowed_letters]]"))  # fmt: skip
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "train_batch_size": "auto"}')
    (tmp_path / "null_model.yaml").write_text(Path(DEMO).read_text().replace(
        "model_name_or_path: sharpgrpo-tiny", "model_name_or_path: null"))  # fmt: skip
    return tmp_path


def _train(tmp: Path, output: str, *args: str) -> list[str]:
    return ["train", "--config", DEMO, "--output_dir", str(tmp / output), "--max_steps", "4", "--dataset_kwargs",
            "{num_prompts: 16}", *args]


# (case, argv from the folder, strings the one error line must contain)
KEPT_CASES = [
    ("overwrite a folder sharpgrpo did not write", lambda t: _train(t, "my_model", "--overwrite_output_dir", "true"),
     ["output_dir=", "my_model", "sharpgrpo train did not write", "config.json"]),
    ("overwrite a run that holds this run's model", lambda t: _train(
        t, "run", "--overwrite_output_dir", "true", "--model_name_or_path", str(t / "run" / "checkpoint-4")),
     ["would delete an input of this run", "model_name_or_path=", "checkpoint-4"]),
    ("overwrite a run, then an input is missing", lambda t: _train(
        t, "run", "--overwrite_output_dir", "true", "--dataset_name", str(t / "missing.jsonl"), "--dataset_kwargs",
        "{}"), ["missing.jsonl"]),
    ("a run's output_dir is not a checkpoint", lambda t: _train(t, "run", "--resume_from_checkpoint", str(t / "run")),
     ["is not a checkpoint", "checkpoint-4"]),
    ("a checkpoint missing a piece", lambda t: _train(t, "partial", "--resume_from_checkpoint",
                                                      str(t / "partial" / "checkpoint-1")),
     ["lacks optimizer.pt", "--allow_incomplete_resume true"]),
    ("resume a finished run", lambda t: _train(t, "run", "--resume_from_checkpoint", "true"),
     ["is at step 4 and max_steps=4", "nothing left to train"]),
    ("fewer prompts than one batch", lambda t: _train(t, "new", "--dataset_name", str(t / "one_prompt.jsonl"),
                                                      "--dataset_kwargs", "{}"),
     ["one_prompt.jsonl", "1 prompt(s), fewer than one batch needs (2"]),
    ("an empty model name", lambda t: _train(t, "new", "--model_name_or_path", ""), ["model_name_or_path=''"]),
    ("a null model name", lambda t: ["train", "--config", str(t / "null_model.yaml"), "--output_dir", str(t / "new")],
     ["model_name_or_path=None"]),
    ("save_steps 0", lambda t: _train(t, "new", "--save_steps", "0"), ["save_steps=0"]),
    ("a clip range past float32", lambda t: _train(t, "new", "--epsilon", "1e300"), ["epsilon=1e+300"]),
    ("a reward entry that is not callable", lambda t: _train(t, "new", "--reward_funcs", "rewards_of_mine.not_callable"),
     ["reward_funcs[0]='rewards_of_mine.not_callable'", "is a int, not a function"]),
    ("a nested list of rewards", lambda t: ["train", "--config", str(t / "nested.yaml"), "--output_dir", str(t / "new")],
     ["reward_funcs[0]=['allowed_letters']", "nested list"]),
    ("a reward that needs a column the data lacks", lambda t: _train(
        t, "new", "--reward_funcs", "rewards_of_mine.needs_answer"), ["needs_answer", "answer", "lacks"]),
    ("a mistyped strategy", lambda t: _train(t, "new", "--strategies", "grpo_gs"), ["grpo_gs", "did you mean grpo_sg?"]),
    ("a mistyped config name", lambda t: ["train", "--config", "dmeo"], ["dmeo", "did you mean demo?"]),
    ("a mistyped reward", lambda t: _train(t, "new", "--reward_funcs", "alowed_letters"),
     ["did you mean allowed_letters?"]),
    ("a DeepSpeed config that is not JSON", lambda t: _train(t, "new", "--deepspeed", str(t / "nested.yaml")),
     ["deepspeed=", "nested.yaml", "not a JSON file (line 1"]),
    # DeepSpeed missing here, or (installed) no GPU to run it: either way one line naming the field, before training
    ("a DeepSpeed config that cannot run here", lambda t: _train(t, "new", "--deepspeed", str(t / "ds.json")),
     ["deepspeed=", "ds.json"]),
]


@pytest.mark.parametrize("case, argv, named", KEPT_CASES, ids=[c[0] for c in KEPT_CASES])
def test_a_refused_command_changes_nothing_on_disk(case, argv, named, kept, capsys, monkeypatch, restore_environment):
    from helpers import disk_listing

    monkeypatch.syspath_prepend(str(kept))  # the user's own reward module
    before = disk_listing(kept)
    line = run_command(argv(kept), capsys, monkeypatch)
    missing = [text for text in named if text not in line]
    assert not missing, f"{case}: the error names none of {missing}: {line}"
    assert not line.startswith("error: ValueError"), line
    assert disk_listing(kept) == before, case


def test_an_incomplete_checkpoint_resumes_only_when_asked_and_warns(kept, tiny_model_path):
    from sharpgrpo.run.lifecycle import CheckpointError, check_checkpoint, resolve_resume_checkpoint

    partial = kept / "partial" / "checkpoint-1"
    with pytest.raises(CheckpointError, match=r"lacks optimizer.pt \(the optimizer state"):
        check_checkpoint(partial)
    with pytest.warns(UserWarning, match=r"allow_incomplete_resume: .* lacks optimizer.pt"):
        assert resolve_resume_checkpoint(str(partial), str(kept / "partial"), allow_missing=True) == str(partial)


def test_errors_name_the_command_the_user_ran(monkeypatch):
    from sharpgrpo.run.config_parser import train_command

    monkeypatch.setattr(sys, "argv", ["sharpgrpo train", "--config", "demo"])
    assert train_command() == "sharpgrpo train"
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py")])
    assert train_command() == "python train.py"
    monkeypatch.setattr(sys, "argv", [str(REPO / "sharpgrpo" / "cli" / "train.py")])  # python -m sharpgrpo.cli.train
    assert train_command() == "sharpgrpo train"


def test_a_refusal_is_printed_once_under_several_processes(monkeypatch, capsys):
    """Under a launcher every process raises the same refusal: the main process prints it, the others exit quietly
    with the same status; an error of one process alone is printed by it, naming it."""
    from sharpgrpo.run.errors import one_line_errors
    from sharpgrpo.validation import ConfigError

    monkeypatch.delenv("SHARPGRPO_DEBUG", raising=False)
    printed = {}
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(SystemExit) as stop, one_line_errors(["train.py"]):
            raise ConfigError("sg_tau=-1: must be a finite number > 0.")
        assert stop.value.code == 1
        printed[rank] = capsys.readouterr().err
    assert printed["0"].startswith("error: sg_tau=-1") and printed["0"].count("\n") == 1
    assert printed["1"] == ""
    with pytest.raises(SystemExit) as stop, one_line_errors(["train.py"]):
        raise OSError("disk full")
    assert stop.value.code == 1 and capsys.readouterr().err.startswith("error: process 1: OSError: disk full")
