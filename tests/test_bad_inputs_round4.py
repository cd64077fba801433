"""Issue 42, the rules left after round 4: values that pass the checks never fail later (every number of ours within
the tensor range it meets, rewards within float32's reach), a setting that cannot act says so (telemetry asked for
and not delivered, an inert strategy from the Python API too), and another run's telemetry file is refused.

Each refusal is driven through the real entry point (``sharpgrpo train`` / ``sharpgrpo tokens`` as the command line
runs them, or ``SharpGRPOConfig`` for the Python API) with the broken input, and the test asserts the one ``error:``
line, the exit status and, where files are involved, that nothing on disk changed (sizes and sha256 before and
after, ``helpers.disk_listing``).
"""

from __future__ import annotations

import math
import random
import re
import shutil
from pathlib import Path

import pytest
from test_entry_point_errors import DEMO, run_command

from sharpgrpo.strategies import AdvantageStrategy
from sharpgrpo.validation import FLOAT32_SAFE, INT64_MAX, REWARD_LIMIT, ConfigError, Rule


def _train(tmp: Path, *args: str) -> list[str]:
    return ["train", "--config", DEMO, "--output_dir", str(tmp / "new"), "--max_steps", "4", "--dataset_kwargs",
            "{num_prompts: 16}", *args]


@pytest.fixture
def user_files(tmp_path):
    """A folder of the user's own, which a refused command must leave as it was."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "huge_rewards_round4.py").write_text(
        "def huge(prompts, completions, **kwargs):\n    return [1e308] * len(completions)\n")
    return tmp_path


def _refused(argv, folder, capsys, monkeypatch) -> str:
    """The command's one error line; the folder is unchanged by it."""
    from helpers import disk_listing

    before = disk_listing(folder)
    line = run_command(argv, capsys, monkeypatch)
    assert disk_listing(folder) == before, argv
    return line


# ----------------------------------------------------------------------------------------------------------------
# Rule 4: every number of ours is held to the range of the tensors it meets (as `epsilon` is), derived from the
# declared rules


def _numeric_fields() -> dict[str, Rule]:
    from sharpgrpo.config import FIELD_RULES

    return {name: rule for name, rule in FIELD_RULES.items()
            if type(rule) is Rule and not rule.text and rule.choices is None}


def test_every_numeric_field_of_ours_has_a_tensor_range():
    fields = _numeric_fields()
    clips = {name for name in fields if re.search(r"clip|epsilon|dppo_|threshold", name)}
    assert {"archer_high_entropy_clip_high", "gmpo_epsilon_low", "dppo_tv_high", "opd_clip"} <= clips
    for name, rule in fields.items():
        limit = INT64_MAX if rule.integer else FLOAT32_SAFE
        assert rule.limit == limit, name
        assert not rule.accepts(limit + (1 if rule.integer else limit)), name
        if rule.high is None:  # the limit itself is still accepted where the field's own range is open above
            assert rule.accepts(limit), name


@pytest.mark.parametrize("name", sorted(_numeric_fields()))
def test_a_value_past_the_tensor_range_is_refused_at_config_time(name, tmp_path):
    from helpers import cpu_config

    rule = _numeric_fields()[name]
    values = [2**70] if rule.integer else [1e300] + ([-1e300] if rule.low is None else [])
    for value in values:
        with pytest.raises(ConfigError, match=rf"^{name}={re.escape(repr(value))}: must be "):
            cpu_config(tmp_path, **{name: value})


@pytest.mark.parametrize("name", sorted(n for n in _numeric_fields() if re.search(r"clip|epsilon|dppo_", n)))
def test_a_clip_range_of_1e300_is_one_line_from_the_command_line(name, user_files, capsys, monkeypatch,
                                                                 restore_environment):
    line = _refused(_train(user_files, f"--{name}", "1e300"), user_files, capsys, monkeypatch)
    assert line.startswith(f"error: {name}=1e+300: must be a finite number"), line
    assert "float32 range" in line or _numeric_fields()[name].high is not None, line  # bounded by its own range


# ----------------------------------------------------------------------------------------------------------------
# Rule 4: rewards within reach of float32 once weighted (REWARD_LIMIT), checked where they are used


@pytest.mark.parametrize("seed", range(10))
def test_a_weighted_reward_past_the_limit_is_named(seed):
    from sharpgrpo.training.output_checks import RewardOutputError, check_reward_output

    rng = random.Random(seed)
    n = rng.randint(1, 32)
    weight = rng.choice([1.0, -3.0, 1e-12, 1e6])
    values = [rng.uniform(-1, 1) * REWARD_LIMIT / abs(weight) for _ in range(n)]
    bad = {rng.randrange(n): rng.choice([1e308, -1e308, 3 * REWARD_LIMIT / abs(weight), 10**400])
           for _ in range(rng.randint(0, 2))}
    values = [bad.get(i, v) for i, v in enumerate(values)]
    first = next((i for i, v in enumerate(values) if not abs(float(v) if v != 10**400 else math.inf) * abs(weight)
                  <= REWARD_LIMIT), None)  # fmt: skip
    if first is None:
        assert check_reward_output("r", values, n, one_of_several=False, weight=weight) == values
        return
    with pytest.raises(RewardOutputError, match=rf"^Reward function 'r' returned .* for completion {first} of {n}"):
        check_reward_output("r", values, n, one_of_several=False, weight=weight)


def test_the_wrapped_reward_is_checked_with_its_own_weight(tmp_path):
    from helpers import cpu_config

    from sharpgrpo.training.output_checks import RewardOutputError, checked_reward_functions

    def small(prompts, completions, **kwargs):
        return [2.0] * len(completions)

    def other(prompts, completions, **kwargs):
        return [2.0] * len(completions)

    args = cpu_config(tmp_path, reward_weights=[1.0, 1e9])
    first, second = checked_reward_functions([small, other], args)
    assert first(prompts=["p"], completions=["c"]) == [2.0]
    with pytest.raises(RewardOutputError, match=r"'other' returned 2.0 .* \(times its reward_weights entry 1e\+09"):
        second(prompts=["p"], completions=["c"])
    with pytest.raises(ConfigError, match=r"^reward_weights\[1\]=1e\+300: must be a finite number in"):
        cpu_config(tmp_path, reward_weights=[1.0, 1e300])


def test_a_reward_of_1e308_stops_training_at_step_1_naming_the_function(user_files, capsys, monkeypatch,
                                                                        restore_environment):
    from helpers import disk_listing

    monkeypatch.syspath_prepend(str(user_files))
    mine = {k: v for k, v in disk_listing(user_files).items() if not k.startswith("__pycache__")}
    argv = _train(user_files, "--reward_funcs", "huge_rewards_round4.huge", "--save_strategy", "no")
    line = run_command(argv, capsys, monkeypatch)
    assert line.startswith("error: training stopped at step 1 by RewardOutputError: Reward function 'huge' returned "
                           "1e+308 for completion 0 of"), line
    assert "within +-1e+09" in line, line
    after = disk_listing(user_files)
    assert {k: after[k] for k in mine} == mine  # the user's files are as they were
    assert not list((user_files / "new").glob("checkpoint-*"))  # nothing was trained, nothing saved as trained


# ----------------------------------------------------------------------------------------------------------------
# Rule 3: telemetry asked for is delivered, or refused naming both fields


@pytest.mark.parametrize("args, named", [
    (("--telemetry_steps", "2"), ["telemetry_steps=2", "token_telemetry=false"]),
    (("--token_telemetry", "true", "--telemetry_steps", "10"), ["telemetry_steps=10", "max_steps=4",
                                                                "no telemetry file would be written"]),
    (("--token_telemetry", "true", "--logging_steps", "5"), ["logging_steps=5", "max_steps=4"]),
], ids=["steps without telemetry", "interval past max_steps", "logging interval past max_steps"])
def test_telemetry_that_would_not_be_delivered_is_refused(args, named, user_files, capsys, monkeypatch,
                                                          restore_environment):
    line = _refused(_train(user_files, *args), user_files, capsys, monkeypatch)
    assert all(text in line for text in named), line


def test_telemetry_request_in_the_python_api(tmp_path):
    from helpers import cpu_config

    with pytest.raises(ConfigError, match=r"^telemetry_steps=3 with token_telemetry=false"):
        cpu_config(tmp_path, telemetry_steps=3)
    with pytest.raises(ConfigError, match=r"telemetry_steps=6 and max_steps=5: no step is a telemetry step"):
        cpu_config(tmp_path, token_telemetry=True, telemetry_steps=6, max_steps=5)
    assert cpu_config(tmp_path, token_telemetry=True, telemetry_steps=5, max_steps=5).telemetry_steps == 5
    assert cpu_config(tmp_path, token_telemetry=True, max_steps=5, logging_first_step=True).token_telemetry  # step 1
    assert cpu_config(tmp_path, token_telemetry=True, telemetry_steps=50).max_steps == -1  # epochs: not known yet


# ----------------------------------------------------------------------------------------------------------------
# Rule 3: an inert strategy is refused by the one check, from the Python API as from the command line


class InertWithoutKL(AdvantageStrategy):
    """A user's strategy (referenced by its dotted path) that declares when it does nothing."""

    @classmethod
    def inert(cls, args):
        return "beta=0: it scales the KL term" if args.beta == 0 else None

    def token_advantages(self, batch):
        return batch.advantages, {}


def test_an_inert_strategy_is_refused_by_the_python_api(tmp_path):
    from helpers import cpu_config

    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.strategies.base import Strategy

    assert Strategy.inert(cpu_config(tmp_path)) is None
    with pytest.raises(ConfigError, match=r"^strategies=\['ktae'\]: ktae would do nothing here \(ktae_scale=0"):
        cpu_config(tmp_path, strategies="ktae", ktae_scale=0.0)
    user = f"{__name__}.InertWithoutKL"
    with pytest.raises(ConfigError, match=rf"{re.escape(user)} would do nothing here \(beta=0: it scales the KL"):
        cpu_config(tmp_path, strategies=user)
    assert cpu_config(tmp_path, strategies=user, beta=0.01).beta == 0.01
    defaults = cpu_config(tmp_path, beta=0.04)
    assert [n for n in STRATEGIES.names() if STRATEGIES.get(n).inert(defaults)] == []  # defaults always act


def test_an_inert_strategy_is_one_line_from_the_command_line(user_files, capsys, monkeypatch, restore_environment):
    line = _refused(_train(user_files, "--strategies", "ktae", "--ktae_scale", "0"), user_files, capsys, monkeypatch)
    assert line.startswith("error: strategies=['ktae']: ktae would do nothing here (ktae_scale=0"), line


# ----------------------------------------------------------------------------------------------------------------
# Rule 6: another run's telemetry file is refused, checked against the run folder it sits in


@pytest.fixture(scope="module")
def telemetry_runs(tiny_model_path, tmp_path_factory):
    """Two real one-step runs with per-token telemetry, seeds 0 and 1."""
    from helpers import make_trainer, tiny_config

    root = tmp_path_factory.mktemp("telemetry_runs")
    for seed in (0, 1):
        args = tiny_config(root / f"run{seed}", strategies=["grpo_sg"], per_device_train_batch_size=8,
                           num_generations=4, max_steps=1, token_telemetry=True, seed=seed)
        make_trainer(tiny_model_path, args, train_dataset=16).train()
    return root


def _tokens(telemetry: Path, output: Path) -> list[str]:
    return ["tokens", "--telemetry", str(telemetry), "--output", str(output)]


def test_a_telemetry_file_copied_from_another_run_is_refused(telemetry_runs, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run0"
    shutil.copytree(telemetry_runs / "run0", run)
    shutil.copy(telemetry_runs / "run1" / "telemetry" / "telemetry_000001.parquet", run / "telemetry")
    line = _refused(_tokens(run, tmp_path / "page"), tmp_path, capsys, monkeypatch)
    assert line.startswith(f"error: telemetry file {run / 'telemetry' / 'telemetry_000001.parquet'} is not the run's "
                           f"in {run}"), line
    assert 'output_dir="run1" in the file, "run0" in the run' in line and "seed=1 in the file, 0 in the run" in line


def test_a_telemetry_file_renamed_to_another_step_is_refused(telemetry_runs, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run0"
    shutil.copytree(telemetry_runs / "run0", run)
    shutil.copy(run / "telemetry" / "telemetry_000001.parquet", run / "telemetry" / "telemetry_000002.parquet")
    line = _refused(_tokens(run, tmp_path / "page") + ["--step", "2"], tmp_path, capsys, monkeypatch)
    assert "its metadata says step 1, its name step 2" in line, line


def test_a_run_s_own_telemetry_and_a_file_alone_are_shown(telemetry_runs, tmp_path, capsys):
    from sharpgrpo.cli.tokens import main

    result = main(_tokens(telemetry_runs / "run0", tmp_path / "own")[1:])
    assert result["metadata"]["run_folder"] == str((telemetry_runs / "run0").resolve())
    assert "is not inside a run folder" not in capsys.readouterr().err
    alone = tmp_path / "downloads" / "telemetry_000001.parquet"
    alone.parent.mkdir()
    shutil.copy(telemetry_runs / "run1" / "telemetry" / "telemetry_000001.parquet", alone)
    result = main(_tokens(alone, tmp_path / "alone")[1:])
    assert result["step"] == 1 and result["metadata"]["run_folder"] is None
    err = capsys.readouterr().err
    assert f"{alone} is not inside a run folder" in err and "which run it belongs to is not" in err
    assert "output_dir=run1" in err and "seed=1" in err
