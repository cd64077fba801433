"""Pass@k-mixed (docs/methods.md §4) against an enumeration of all K-subsets of the group."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.passk import mixed_advantages, passk_advantages
from sharpgrpo.strategy_params import StrategyParams


def enumerated_passk(rewards: list[int], k: int) -> list[float]:
    """Chen et al.'s construction: every K-subset S scores max(r_S); rho, sigma are the mean and population std of
    those scores; a completion's advantage is the mean over the subsets containing it of (max(r_S) - rho), divided
    by sigma + 1e-6."""
    n = len(rewards)
    subsets = list(itertools.combinations(range(n), k))
    scores = {s: max(rewards[i] for i in s) for s in subsets}
    rho = sum(scores.values()) / len(subsets)
    sigma = math.sqrt(sum((v - rho) ** 2 for v in scores.values()) / len(subsets))
    out = []
    for i in range(n):
        containing = [scores[s] for s in subsets if i in s]
        out.append((sum(containing) / len(containing) - rho) / (sigma + 1e-6))
    return out


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_passk_matches_subset_enumeration(n):
    for k in range(1, n + 1):
        for c in range(n + 1):
            rewards = [1] * c + [0] * (n - c)
            # shuffle so that positions do not matter
            order = torch.randperm(n, generator=torch.Generator().manual_seed(n * 100 + k * 10 + c)).tolist()
            rewards = [rewards[i] for i in order]
            got = passk_advantages(torch.tensor(rewards, dtype=torch.float32), k)
            expected = torch.tensor(enumerated_passk(rewards, k), dtype=torch.float32)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, msg=f"n={n} k={k} c={c}")


def test_hand_computed_values():
    # n = 8, c = 2, K = 4: rho = 1 - C(6,4)/C(8,4) = 1 - 15/70; A_neg uses C(5,3)/C(7,3) = 10/35.
    rho = 1 - 15 / 70
    sigma = math.sqrt(rho * (1 - rho))
    got = passk_advantages(torch.tensor([1.0, 1.0, 0, 0, 0, 0, 0, 0]), 4)
    assert float(got[0]) == pytest.approx((1 - rho) / (sigma + 1e-6), rel=1e-6)
    assert float(got[2]) == pytest.approx((1 - rho - 10 / 35) / (sigma + 1e-6), rel=1e-6)
    assert float(got[0]) == pytest.approx(0.52223, abs=1e-5)
    assert float(got[2]) == pytest.approx(-0.17408, abs=1e-5)


@pytest.mark.parametrize("c", [0, 5, 6, 7, 8])
def test_degenerate_groups_get_zero_passk_advantage(c):
    # c = 0, c = n, and n - c < K (fewer than K incorrect completions) all give 0, as in the reference code.
    rewards = torch.tensor([1.0] * c + [0.0] * (8 - c))
    assert torch.equal(passk_advantages(rewards, 4), torch.zeros(8))


def test_thr_paper_eq6_identity():
    # THR App. D.1 Eq. 11-12: A_passk = sqrt((C(N-,K)/C(G,K)) / (1 - C(N-,K)/C(G,K))) * sqrt(q/(1-q)) * A_grpo,
    # with A_grpo the population-std normalised GRPO advantage (Eq. 1), whenever N- >= K.
    for n, k in [(8, 4), (8, 2), (6, 3)]:
        for c in range(1, n - k + 1):
            rewards = torch.tensor([1.0] * c + [0.0] * (n - c))
            q = c / n
            grpo = (rewards - rewards.mean()) / rewards.std(unbiased=False)
            ratio = math.comb(n - c, k) / math.comb(n, k)
            expected = math.sqrt(ratio / (1 - ratio)) * math.sqrt(q / (1 - q)) * grpo
            torch.testing.assert_close(passk_advantages(rewards, k), expected, rtol=1e-4, atol=1e-5)


def test_mixed_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    grpo = (rewards - rewards.mean()) / rewards.std()
    passk = passk_advantages(rewards, 2)
    q = 2 / 6
    torch.testing.assert_close(mixed_advantages(grpo, rewards, 2), q * grpo + (1 - q) * passk)
    token = grpo[:, None] * torch.linspace(0.5, 1.5, 5)
    torch.testing.assert_close(mixed_advantages(token, rewards, 2), q * token + (1 - q) * passk[:, None])
    # all correct: q = 1, the GRPO advantage is kept; none correct: everything 0
    ones = torch.ones(6)
    torch.testing.assert_close(mixed_advantages(torch.full((6,), 0.3), ones, 2), torch.full((6,), 0.3))
    torch.testing.assert_close(mixed_advantages(torch.zeros(6), torch.zeros(6), 2), torch.zeros(6))


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="binary"):
        passk_advantages(torch.tensor([1.0, 0.5, 0.0, 0.0]), 2)
    with pytest.raises(ValueError, match="binary"):
        passk_advantages(torch.tensor([1.0, -1.0, -1.0, 1.0]), 2)
    with pytest.raises(ValueError, match="passk_k"):
        passk_advantages(torch.tensor([1.0, 0.0, 0.0]), 4)
    with pytest.raises(ValueError, match="passk_k"):
        passk_advantages(torch.tensor([1.0, 0.0, 0.0]), 0)
    with pytest.raises(ValueError, match="passk_k"):
        STRATEGIES.get("passk_mixed")(StrategyParams(passk_k=0))


def test_strategy_applies_per_group():
    G, T = 8, 3
    rewards = torch.tensor([1.0, 0, 0, 0, 0, 1, 0, 0] + [1.0] * 7 + [0.0] + [0.0] * 8)
    group_ids = torch.arange(3).repeat_interleave(G)
    grouped = rewards.view(3, G)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
    advantages = adv[:, None].repeat(1, T) * torch.tensor([1.0, 0.9, 1.1])
    batch = GenerationBatch(
        old_logps=torch.zeros(3 * G, T), completion_mask=torch.ones(3 * G, T), completion_ids=torch.zeros(3 * G, T),
        advantages=advantages, rewards=rewards, group_ids=group_ids, num_generations=G,
    )
    strategy = STRATEGIES.get("passk_mixed")(StrategyParams(passk_k=4))
    assert not strategy.needs_hidden_states
    out, metrics = strategy.token_advantages(batch)
    for g in range(3):
        rows = slice(g * G, (g + 1) * G)
        torch.testing.assert_close(out[rows], mixed_advantages(advantages[rows], rewards[rows], 4))
    # group 2 (7 of 8 correct, fewer than K incorrect): pass@K advantage 0, mixed = 7/8 * GRPO
    torch.testing.assert_close(out[G:2 * G], 7 / 8 * advantages[G:2 * G])
    rho_first = 1 - math.comb(6, 4) / math.comb(8, 4)
    assert metrics["passk/pass_at_k"] == pytest.approx((rho_first + 1.0 + 0.0) / 3)
    assert metrics["passk/mix_q"] == pytest.approx((2 / 8 + 7 / 8 + 0) / 3)


def test_strategy_counts_c_from_the_answer_check_not_the_rewards():
    """docs/methods.md §3/§4: c comes from ``batch.correct`` (the task's answer check). Here the rewards are
    graded (a format term lifts two wrong answers above a right one), so c from rewards would be meaningless."""
    G, T = 8, 2
    rewards = torch.tensor([3.0, -0.5, 1.0, 1.0, -1.0, -1.0, -3.0, -3.0])  # K&K-like totals
    correct = torch.tensor([True, True, False, False, False, False, False, False])  # -0.5: right answer, bad format
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    advantages = adv[:, None].repeat(1, T)
    batch = GenerationBatch(
        old_logps=torch.zeros(G, T), completion_mask=torch.ones(G, T), completion_ids=torch.zeros(G, T),
        advantages=advantages, rewards=rewards, group_ids=torch.zeros(G, dtype=torch.long), num_generations=G,
        correct=correct,
    )
    out, metrics = STRATEGIES.get("passk_mixed")(StrategyParams(passk_k=4)).token_advantages(batch)
    torch.testing.assert_close(out, mixed_advantages(advantages, correct, 4))
    assert metrics["passk/mix_q"] == pytest.approx(2 / 8)
    assert metrics["passk/pass_at_k"] == pytest.approx(1 - math.comb(6, 4) / math.comb(8, 4))
