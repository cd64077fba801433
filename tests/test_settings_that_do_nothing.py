"""Rule 5 of "nothing lost": a setting that does nothing is refused or said once, by what the fields and strategies
declare (``param(..., acts_when=...)`` for a feature's fields, ``Strategy.inert`` for a strategy), through
``sharpgrpo train`` as the command line runs it; a refusal leaves the disk as it was."""

from __future__ import annotations

import sys
import warnings

import pytest
from test_inputs_literal_and_named import _refused, _train


def test_a_strategy_that_cannot_act_is_refused(tmp_path, capsys, monkeypatch):
    line = _refused(_train(tmp_path, "--strategies", "gtpo", "--gtpo_alpha1", "0", "--gtpo_alpha2", "0"), tmp_path,
                    capsys, monkeypatch)  # fmt: skip
    assert "gtpo would do nothing here (gtpo_alpha1 = gtpo_alpha2 = 0: every shaped reward is 0" in line, line
    # The demo is on-policy (num_iterations 1) with beta 0: archer's clip ranges never act, no KL: plain GRPO.
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # refused, with no warning about its KL first
        line = _refused(_train(tmp_path, "--strategies", "archer"), tmp_path, capsys, monkeypatch)
    assert "archer would do nothing here (on-policy (num_iterations=1" in line and "beta=0 has no KL" in line, line


def test_a_field_of_a_feature_that_is_off_is_said_once(tmp_path, capsys, monkeypatch):
    """kl_estimator with beta 0 and dynamic_sampling_* without dynamic_sampling: one line each, before the run goes
    on (here it stops at a missing data file, so nothing trains)."""
    from sharpgrpo.cli import main

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    argv = _train(tmp_path, "--kl_estimator", "k1", "--dynamic_sampling_max_rounds", "3", "--dataset_name",
                  str(tmp_path / "missing.jsonl"))  # fmt: skip
    with warnings.catch_warnings(record=True) as said, pytest.raises(SystemExit):
        warnings.simplefilter("default")
        main(argv)
    lines = [str(w.message) for w in said]
    assert lines.count("kl_estimator='k1' acts only with beta > 0 (the KL term; beta=0 computes no KL), which is off; "
                       "it has no effect in this run.") == 1, lines  # fmt: skip
    assert lines.count("dynamic_sampling_max_rounds=3 acts only with dynamic_sampling: true, which is off; it has no "
                       "effect in this run.") == 1, lines  # fmt: skip
    assert "missing.jsonl" in capsys.readouterr().err


def test_a_reward_functions_field_without_that_reward_is_said_once(tmp_path):
    """overlong_* act only with the overlong_penalty reward, which the config does not know: the trainer says it once
    when it binds its reward functions (``checked_reward_functions``, what ``SharpGRPOTrainer`` calls)."""
    from helpers import cpu_config

    from reward_fns import get_reward_function
    from sharpgrpo.training.output_checks import checked_reward_functions

    args = cpu_config(tmp_path, overlong_penalty_factor=0.5, max_completion_length=10)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        checked_reward_functions([get_reward_function("allowed_letters")], args)
    assert [str(w.message) for w in said if "overlong" in str(w.message)] == [
        "overlong_penalty_factor=0.5 acts only with the overlong_penalty reward in reward_funcs, which is not among "
        "them; it has no effect in this run."
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        checked_reward_functions([get_reward_function("allowed_letters"), get_reward_function("overlong_penalty")], args)
