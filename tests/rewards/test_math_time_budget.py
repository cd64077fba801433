"""A ``math_reward`` call has a time budget (``reward_fns.math.reward_call_budget``): pathological boxes that would
each cost math-verify's timeouts, one after another, stop costing time once it is spent; what is left scores 0 and
is counted in the ``math/over_time_budget`` metric (through TRL's ``log_metric`` reward argument)."""

from __future__ import annotations

import time

import reward_fns.math as math_module
from reward_fns.math import DEFAULT_VERIFIER, math_reward, reward_call_budget

SLOW = "\\boxed{9^{9^{9}}}"  # keeps sympy busy for seconds (tests/rewards/test_math_reward.py)


def test_the_budget_grows_with_the_batch():
    assert reward_call_budget(16) == math_module.BUDGET_BASE_SECONDS + 16 * math_module.BUDGET_SECONDS_PER_COMPLETION
    assert reward_call_budget(512) > 100  # a normal batch (milliseconds per completion) never meets it


def test_pathological_boxes_stop_at_the_budget_and_are_counted(monkeypatch):
    assert math_reward(["p"], ["\\boxed{2}"], answer=["2"]) == [1.0]  # the worker is up
    monkeypatch.setattr(math_module, "BUDGET_BASE_SECONDS", 1.0)
    monkeypatch.setattr(math_module, "BUDGET_SECONDS_PER_COMPLETION", 0.0)
    logged = {}
    started = time.monotonic()
    rewards = math_reward(["p"] * 8, [SLOW] * 8, answer=["1"] * 8, log_metric=logged.__setitem__)
    elapsed = time.monotonic() - started
    assert rewards == [0.0] * 8
    assert logged["math/over_time_budget"] >= 7  # the first one used the whole budget
    assert elapsed < 6.0, elapsed  # without a budget: 8 x math-verify's 5 s timeouts (or the 30 s watchdog)
    monkeypatch.undo()
    assert math_reward(["p", "p"], ["\\boxed{3}", SLOW], answer=["3", None], log_metric=logged.__setitem__) == [1.0, None]
    assert logged["math/over_time_budget"] == 0.0
    assert DEFAULT_VERIFIER.equivalent("\\boxed{4}", ["\\boxed{4}"])
