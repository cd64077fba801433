"""``overlong_penalty`` (docs/methods.md §15.4): DAPO's soft overlong punishment against the paper's piecewise Eq. 13
and verl's released line (verl-project/verl@1dda039 ``verl/workers/reward_manager/dapo.py`` L121-127, reproduced)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from reward_fns import answer_check, configured_reward, get_reward_function, reward_columns
from reward_fns.overlong import overlong_penalty_reward, overlong_penalty_values


def dapo_eq13(length: int, max_length: int, cache: int) -> float:
    """DAPO (arXiv:2503.14476) Eq. 13, piecewise as printed."""
    if length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return ((max_length - cache) - length) / cache
    return -1.0


def verl_dapo(valid_response_length: int, max_resp_len: int, overlong_buffer_len: int, penalty_factor: float):
    expected_len = max_resp_len - overlong_buffer_len  # dapo.py L123-126
    exceed_len = valid_response_length - expected_len
    return min(-exceed_len / overlong_buffer_len * penalty_factor, 0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_dapo_eq13_and_verl(seed):
    rng = random.Random(seed)
    for _ in range(200):
        max_length = rng.randint(1, 64)
        cache = rng.randint(1, max_length)
        factor = rng.choice([1.0, 0.5, 2.0])
        lengths = [rng.randint(0, max_length) for _ in range(8)]  # TRL never returns more than max_length tokens
        got = overlong_penalty_values(lengths, max_length, cache, factor)
        assert got == pytest.approx([factor * dapo_eq13(n, max_length, cache) for n in lengths], abs=1e-12)
        assert got == pytest.approx([verl_dapo(n, max_length, cache, factor) for n in lengths], abs=1e-12)


def test_hand_values_and_a_control():
    # L_max 20, buffer 4: no penalty up to 16 tokens, then -0.25 per token down to -1 at 20
    assert overlong_penalty_values([0, 16, 17, 18, 20], 20, 4) == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert overlong_penalty_values([18], 20, 4, 2.0) == [-1.0]
    assert overlong_penalty_values([18], 20, 8) != overlong_penalty_values([18], 20, 4)  # the buffer matters


def test_reward_reads_the_token_counts_trl_passes():
    reward = overlong_penalty_reward(max_completion_length=10, buffer_length=5, penalty_factor=1.0)
    ids = [[1] * 3, [1] * 7, [1] * 10]
    assert reward(prompts=["p"] * 3, completions=["a", "b", "c"], completion_ids=ids) == [0.0, -0.4, -1.0]
    assert reward.__name__ == "overlong_penalty"  # TRL logs rewards/overlong_penalty/...


def test_registered_name_binds_the_config_and_refuses_to_run_unbound():
    fn = get_reward_function("overlong_penalty")
    assert reward_columns(fn) == () and answer_check(fn) is None
    with pytest.raises(ValueError, match="overlong_penalty needs its settings"):
        fn(prompts=["p"], completions=["a"], completion_ids=[[1]])
    args = SimpleNamespace(max_completion_length=8, overlong_buffer_length=4, overlong_penalty_factor=0.5)
    bound = configured_reward(fn, args)
    assert bound.settings == (8, 4, 0.5)
    assert bound(prompts=["p"], completions=["a"], completion_ids=[[1] * 6]) == [-0.25]
    other = get_reward_function("addition")
    assert configured_reward(other, args) is other  # rewards without settings are returned as they are


@pytest.mark.parametrize(
    "max_length, buffer, factor, message",
    [(8, 0, 1.0, "overlong_buffer_length=0"), (8, 9, 1.0, "overlong_buffer_length=9"),
     (8, 4, -1.0, "overlong_penalty_factor=-1.0")],
)
def test_bad_settings_name_the_field(max_length, buffer, factor, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty_reward(max_length, buffer, factor)


def test_config_binds_the_reward_with_dapos_default_buffer(tmp_path):
    from helpers import cpu_config

    fn = get_reward_function("overlong_penalty")
    assert configured_reward(fn, cpu_config(tmp_path, max_completion_length=20)).settings == (20, 4, 1.0)
    args = cpu_config(tmp_path, max_completion_length=20, overlong_buffer_length=8, overlong_penalty_factor=0.5)
    assert configured_reward(fn, args).settings == (20, 8, 0.5)
    with pytest.raises(ValueError, match=r"overlong_buffer_length=30: must be in \[1, max_completion_length=20\]"):
        configured_reward(fn, cpu_config(tmp_path, max_completion_length=20, overlong_buffer_length=30))


def test_trains_with_the_registered_name(tiny_model_path, tmp_path):
    """``reward_funcs=[..., overlong_penalty]`` (the registered function, as train.py resolves the name): the trainer
    binds it to the config and logs it; the tiny model's 8-token completions mostly hit the budget."""
    from helpers import make_trainer, tiny_config

    from sharpgrpo.data.demo import allowed_letters_reward

    args = tiny_config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=1,
                       overlong_buffer_length=4)
    trainer = make_trainer(tiny_model_path, args, train_dataset=16,
                           reward_funcs=[allowed_letters_reward, get_reward_function("overlong_penalty")])
    trainer.train()
    values = list(trainer._logs["rewards"]["overlong_penalty"])
    assert len(values) == 8 and set(values) <= {0.0, -0.25, -0.5, -0.75, -1.0} and min(values) < 0
    logged = [entry["rewards/overlong_penalty/mean"] for entry in trainer.state.log_history
              if "rewards/overlong_penalty/mean" in entry]
    assert logged == [pytest.approx(sum(values) / 8)]
