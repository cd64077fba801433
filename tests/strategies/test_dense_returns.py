"""Per-token and per-turn rewards (docs/methods.md §15.6): the placement of a reward function's lists on tokens, the
``dense_returns`` advantage against a float64 loop reference, its unbiasedness computed exactly on a two-turn problem
where the policy decides whether to take a second turn (the per-turn-index normalisation of verl-project/verl#7244
shown biased on the same problem), and a short training run with a per-token reward."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies.baselines import rloo_advantages
from sharpgrpo.strategies.dense_returns import dense_return_advantages, scale_by_return_std
from sharpgrpo.training.generation.dense_rewards import (
    DenseRewardCollector,
    DenseRewardError,
    place_rewards,
    token_index,
    turn_index,
)


# --- the reference: float64 loops over rows, units and tokens -----------------------------------------------------
def reference_advantages(token_rewards, units, group_ids):
    rows, length = token_rewards.shape
    returns = [[sum(float(token_rewards[i, s]) for s in range(t, length)) for t in range(length)] for i in range(rows)]
    starts = {}  # (row, unit) -> return at the unit's first token
    for i in range(rows):
        for t in range(length):
            k = int(units[i, t])
            if k >= 0 and (i, k) not in starts:
                starts[(i, k)] = returns[i][t]
    out = torch.zeros(rows, length, dtype=torch.float64)
    for i in range(rows):
        group = [j for j in range(rows) if int(group_ids[j]) == int(group_ids[i])]
        for t in range(length):
            k = int(units[i, t])
            if k < 0:
                continue
            others = [starts.get((j, k), 0.0) for j in group if j != i]
            baseline = sum(others) / len(others) if others else 0.0
            out[i, t] = returns[i][t] - baseline
    return out


def random_batch(seed: int):
    """Groups of random sizes; each row: a few turns of sampled tokens separated by tool tokens, then padding."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 5, (4,), generator=generator).tolist()
    group_ids = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    rows, length = len(group_ids), 14
    mask = torch.zeros(rows, length, dtype=torch.long)
    for i in range(rows):
        t = 0
        for _ in range(int(torch.randint(0, 4, (1,), generator=generator))):
            span = int(torch.randint(1, 4, (1,), generator=generator))
            mask[i, t:t + span] = 1
            t += span + int(torch.randint(1, 3, (1,), generator=generator))  # tool tokens (0) between turns
            if t >= length:
                break
    token_rewards = torch.randn(rows, length, generator=generator, dtype=torch.float64) * mask
    return token_rewards, mask, group_ids


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("units_of", [turn_index, token_index])
def test_advantages_match_the_loop_reference(seed, units_of):
    token_rewards, mask, group_ids = random_batch(seed)
    units = units_of(mask)
    expected = reference_advantages(token_rewards, units, group_ids)
    assert torch.allclose(dense_return_advantages(token_rewards, units, group_ids), expected, atol=1e-12, rtol=0)


def test_turn_and_token_units_of_a_mask_with_tool_tokens():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0, 0]])
    assert turn_index(mask).tolist() == [[0, 0, -1, -1, 1, -1, 2, 2, -1], [-1, 0, 0, 0, -1, -1, -1, -1, -1]]
    assert token_index(mask).tolist() == [[0, 1, -1, -1, 2, -1, 3, 4, -1], [-1, 0, 1, 2, -1, -1, -1, -1, -1]]


def test_one_plain_reward_per_single_turn_completion_is_rloo():
    generator = torch.Generator().manual_seed(3)
    rewards = torch.randn(12, generator=generator, dtype=torch.float64)
    group_ids = torch.arange(3).repeat_interleave(4)
    mask = (torch.arange(7)[None] < torch.randint(1, 8, (12, 1), generator=generator)).long()
    last = mask.cumsum(1).argmax(1)
    token_rewards = torch.zeros(12, 7, dtype=torch.float64)
    token_rewards[torch.arange(12), last] = rewards
    advantages = dense_return_advantages(token_rewards, turn_index(mask), group_ids)
    expected = rloo_advantages(rewards, group_ids)[:, None] * mask
    assert torch.allclose(advantages, expected, atol=1e-12)


# --- unbiasedness, computed exactly -------------------------------------------------------------------------------
# One decision: after its first turn the policy stops (p = 1 - s) or takes a second turn (p = s = sigmoid(theta)).
# Stopping earns R_STOP at turn 0; continuing earns C at turn 0 (an intermediate reward) and R_GO at turn 1, whose
# tokens involve no decision (their log-probability does not depend on theta). Each turn is one token here.
R_STOP, C, R_GO = 1.0, 0.5, 0.8


def episode(go: bool):
    """(per-turn rewards, d log p(decision) / d theta) of one completion, for s = sigmoid(theta)."""
    return ([C, R_GO], "go") if go else ([R_STOP], "stop")


def expected_gradient(estimator, s: float, n: int) -> float:
    """E over groups of n completions of (1/n) sum_i A[i, turn 0] * d log p(a_i) / d theta, by enumeration."""
    total = 0.0
    for choices in itertools.product([False, True], repeat=n):
        probability = math.prod(s if go else 1 - s for go in choices)
        turn_rewards = [episode(go)[0] for go in choices]
        advantages = estimator(turn_rewards)
        score = [(1 - s) if go else -s for go in choices]
        total += probability * sum(a * g for a, g in zip(advantages, score, strict=True)) / n
    return total


def dense_returns_estimator(turn_rewards):
    """The project's estimator on a batch shaped as the trainer gives it: one token per turn."""
    length = max(len(r) for r in turn_rewards)
    token_rewards = torch.zeros(len(turn_rewards), length, dtype=torch.float64)
    mask = torch.zeros(len(turn_rewards), length, dtype=torch.long)
    for i, rewards in enumerate(turn_rewards):
        token_rewards[i, : len(rewards)] = torch.tensor(rewards, dtype=torch.float64)
        mask[i, : len(rewards)] = 1
    units = token_index(mask)  # one token per turn: turns are tokens here
    advantages = dense_return_advantages(token_rewards, units, torch.zeros(len(turn_rewards), dtype=torch.long))
    return advantages[:, 0].tolist()


def per_turn_index_normalised(turn_rewards):
    """The construction verl#7244 warns about: each turn's reward minus the mean over the completions that reached
    that turn index, summed over the completion's own remaining turns."""
    out = []
    for rewards in turn_rewards:
        total = 0.0
        for k in range(len(rewards)):
            reached = [other[k] for other in turn_rewards if len(other) > k]
            total += rewards[k] - sum(reached) / len(reached)
        out.append(total)
    return out


@pytest.mark.parametrize("s", [0.2, 0.5, 0.7])
def test_the_leave_one_out_unit_baseline_is_unbiased_and_per_turn_index_normalisation_is_not(s):
    true_gradient = s * (1 - s) * (C + R_GO - R_STOP)  # d/dtheta [s (C + R_GO) + (1 - s) R_STOP]
    for n in (2, 3, 4):
        assert expected_gradient(dense_returns_estimator, s, n) == pytest.approx(true_gradient, abs=1e-12)
    biased = expected_gradient(per_turn_index_normalised, s, 2)
    assert abs(biased - true_gradient) > 1e-3  # the control: this check can tell a biased estimator


def test_scaling_follows_trls_scale_rewards():
    advantages = torch.ones(4, 3, dtype=torch.float64)
    totals = torch.tensor([0.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    group_scaled = scale_by_return_std(advantages, totals, groups, "group")
    assert torch.allclose(group_scaled[:, 0], 1 / (torch.tensor([0.5, 0.5, 4.5, 4.5], dtype=torch.float64).sqrt() + 1e-4))
    assert torch.allclose(scale_by_return_std(advantages, totals, groups, "batch"), 1 / (totals.std() + 1e-4) * advantages)
    assert scale_by_return_std(advantages, totals, groups, "none") is advantages


# --- a reward function's lists ------------------------------------------------------------------------------------
def test_a_functions_lists_become_their_sums_for_trl_and_are_placed_on_tokens():
    per_token = DenseRewardCollector("token_fn", enabled=True)
    per_turn = DenseRewardCollector("turn_fn", enabled=True)
    plain = DenseRewardCollector("plain_fn", enabled=True)
    completion_ids = [[5, 6, 7, 8, 9], [5, 6, 7]]
    assert per_token.convert([{"per_token": [0, 1, 0.25, 2, 0]}, None], completion_ids) == [3.25, None]
    assert per_turn.convert([{"per_turn": [0.5, 1.5]}, {"per_turn": [1]}], completion_ids) == [2.0, 1.0]
    assert plain.convert([1.0, 0.0], completion_ids) == [1.0, 0.0]
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 0, 0]])  # row 0: two turns around a tool token
    placed = place_rewards([(per_token, 2.0), (per_turn, 1.0), (plain, 0.5)], mask)
    # the tool token's 0.25 goes to the sampled token before it (position 1), as the action it follows
    assert placed.tolist() == [[0.0, 2.0 * (1 + 0.25) + 0.5, 0.0, 4.0, 1.5 + 0.5],
                               [0.0, 0.0, 1.0, 0.0, 0.0]]


@pytest.mark.parametrize("output, message", [
    ([{"per_token": [1, 2]}, 0.0], "2 per_token rewards for a completion of 3 tokens"),
    ([{"per_token": [1, 2, 3]}, {"per_turn": [1]}], "both per_token and per_turn"),
    ([{"per_token": [1, float("nan"), 3]}, 0.0], "must be a list of finite numbers"),
    ([{"dense": [1]}, 0.0], "a reward is a number, None"),
])
def test_bad_lists_are_refused_naming_the_function(output, message):
    with pytest.raises(DenseRewardError, match=rf"Reward function 'fn'.*{message}|{message}"):
        DenseRewardCollector("fn", enabled=True).convert(output, [[1, 2, 3], [1, 2, 3]])


def test_lists_without_a_strategy_that_reads_them_are_refused():
    with pytest.raises(DenseRewardError, match="returned per_token rewards; they are read by the `dense_returns`"):
        DenseRewardCollector("fn", enabled=False).convert([{"per_token": [1]}], [[1]])


def test_a_per_turn_list_of_the_wrong_length_is_refused_when_placed():
    collector = DenseRewardCollector("turns", enabled=True)
    collector.convert([{"per_turn": [1.0]}], [[1, 2, 3]])
    with pytest.raises(DenseRewardError, match="1 per_turn rewards for a completion of 2 turn"):
        place_rewards([(collector, 1.0)], torch.tensor([[1, 0, 1]]))


# --- really trained -----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_per_token_reward_trains_with_token_varying_advantages(tiny_model_path, tmp_path):
    from helpers import make_trainer, tiny_config
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    letters = set("ABCDE")

    def letter_tokens(prompts, completions, completion_ids, allowed, **kwargs):
        """+1 on every token that is an allowed letter, -0.5 on every other letter."""
        out = []
        for ids, ok in zip(completion_ids, allowed, strict=True):
            text = [tokenizer.decode([token]).strip() for token in ids]
            out.append({"per_token": [1.0 if t in ok else (-0.5 if t in letters else 0.0) for t in text]})
        return out

    seen = []

    class Recording(__import__("sharpgrpo").SharpGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append(output["advantages"].clone())
            return output

    args = tiny_config(tmp_path, strategies=["dense_returns"], max_steps=2)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[letter_tokens], trainer_class=Recording)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["dense_returns/return_mean"]) for entry in logs)
    assert any(entry["dense_returns/dense_fraction"] > 0 for entry in logs)
    advantages = seen[-1]
    assert advantages.dim() == 2  # token advantages, not one per completion
    varying = (advantages.max(dim=1).values - advantages.min(dim=1).values) > 1e-6
    assert bool(varying.any())  # a completion's tokens get different advantages
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())
    # TRL logged each completion's sum: the completion table's rewards are the per-token lists' sums
    assert "letter_tokens" in trainer._logs["rewards"]


def test_dense_returns_refuses_dynamic_sampling():
    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.validation import ConfigError

    args = SimpleNamespace(strategies=["dense_returns"], dynamic_sampling=True)
    with pytest.raises(ConfigError, match="dense_returns .* set dynamic_sampling to false"):
        STRATEGIES.get("dense_returns").check_config(args)
