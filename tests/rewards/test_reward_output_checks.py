"""Reward outputs are checked on every batch (``sharpgrpo.training.output_checks.checked_reward_functions``, applied by
``SharpGRPOTrainer`` to the reward functions it is given): one finite number or None per completion, never None for
a whole batch from a lone function; an error names the function and the first bad value."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest
from trl.trainer.utils import get_callable_name, is_async_callable

from reward_fns import answer_check, get_reward_function, reward_columns
from sharpgrpo.training.output_checks import RewardOutputError, check_reward_output, checked_reward_functions


def first_bad(values):
    """The reference: index and value of the first entry that is neither None nor a finite number."""
    for index, value in enumerate(values):
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
            return index, value
    return None


@pytest.mark.parametrize("seed", range(20))
def test_the_first_bad_value_is_named_on_random_batches(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 64)
    values = [rng.choice([None, rng.uniform(-5, 5), rng.randint(0, 1)]) for _ in range(n)]
    if all(v is None for v in values):
        values[0] = 0.5
    for _ in range(rng.randint(0, 3)):
        values[rng.randrange(n)] = rng.choice([float("nan"), float("inf"), -float("inf"), "1.0", [1.0]])
    expected = first_bad(values)
    if expected is None:
        assert check_reward_output("r", values, n, one_of_several=False) == values
        return
    index, value = expected
    with pytest.raises(RewardOutputError, match=rf"^Reward function 'r' returned .* for completion {index} of {n};"):
        check_reward_output("r", values, n, one_of_several=False)
    try:
        check_reward_output("r", values, n, one_of_several=False)
    except RewardOutputError as error:
        assert repr(value) in str(error)


def test_none_for_every_completion_is_refused_only_from_a_lone_function():
    with pytest.raises(RewardOutputError, match="returned None for all 4 completions"):
        check_reward_output("r", [None] * 4, 4, one_of_several=False)
    assert check_reward_output("r", [None] * 4, 4, one_of_several=True) == [None] * 4


def test_length_and_container_are_checked_and_arrays_accepted():
    with pytest.raises(RewardOutputError, match="returned 3 rewards for 4 completions"):
        check_reward_output("r", [0.0] * 3, 4, one_of_several=False)
    with pytest.raises(RewardOutputError, match="returned a float; it must return a list"):
        check_reward_output("r", 1.0, 4, one_of_several=False)
    assert check_reward_output("r", np.array([0.5, 1.0]), 2, one_of_several=False) == [0.5, 1.0]
    assert check_reward_output("r", [np.float32(0.5), None], 2, one_of_several=False) == [0.5, None]


def test_wrapped_functions_keep_what_trl_and_the_trainer_read():
    math_reward = get_reward_function("math")
    [wrapped] = checked_reward_functions([math_reward])
    assert get_callable_name(wrapped) == get_callable_name(math_reward) == "math_reward"
    assert reward_columns(wrapped) == ("answer",) and answer_check(wrapped) is answer_check(math_reward)
    assert not is_async_callable(wrapped)
    assert checked_reward_functions(checked_reward_functions("org/reward-model")) == "org/reward-model"

    async def async_nan(prompts, completions, **kwargs):
        return [float("nan")] * len(completions)

    [checked] = checked_reward_functions([async_nan])
    assert is_async_callable(checked) and get_callable_name(checked) == "async_nan"
    with pytest.raises(RewardOutputError, match="'async_nan' returned nan for completion 0 of 2"):
        asyncio.run(checked(prompts=["a", "b"], completions=["x", "y"]))
