"""Entropy advantage shaping (Cheng et al. 2025) and GTPO / GRPO-S (Tan et al. 2025) against float64 loop references
on random inputs (docs/methods.md §11.2-10.3). Neither paper's authors released code that we could find (searched the
code index for both titles and method names); the references below follow the papers' formulas as written in the
module docstring of ``sharpgrpo.strategies.entropy_credit``."""

from __future__ import annotations

import math

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.entropy_credit import entropy_shaped_advantages, gtpo_advantages
from sharpgrpo.strategy_params import StrategyParams


def random_group(seed: int, rows: int = 6, length: int = 7, holes: bool = False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    if holes:  # tool results masked out inside a completion
        mask = mask * (torch.rand(rows, length, generator=g) > 0.2).float()
        mask[:, 0] = 1.0
    entropies = torch.rand(rows, length, generator=g, dtype=torch.float64) * 3
    correct = torch.rand(rows, generator=g) > 0.5
    correct[0], correct[1] = True, False
    return entropies, mask, correct


def test_entropy_shaping_matches_loop_reference():
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(5, 9, generator=g, dtype=torch.float64)
    entropies = torch.rand(5, 9, generator=g, dtype=torch.float64) * 4
    for alpha, kappa in [(0.4, 2.0), (0.1, 1.0), (2.0, 3.5)]:
        got, bonus = entropy_shaped_advantages(advantages, entropies, alpha, kappa)
        for i in range(5):
            for t in range(9):
                a, h = float(advantages[i, t]), float(entropies[i, t])
                expected = a + min(alpha * h, abs(a) / kappa)
                assert float(got[i, t]) == pytest.approx(expected, abs=1e-12)
                assert float(bonus[i, t]) == pytest.approx(expected - a, abs=1e-12)


def test_entropy_shaping_keeps_the_sign_for_kappa_at_least_one():
    g = torch.Generator().manual_seed(1)
    advantages = torch.randn(64, 16, generator=g)
    entropies = torch.rand(64, 16, generator=g) * 10
    shaped, _ = entropy_shaped_advantages(advantages, entropies, 5.0, 1.0)
    assert bool((shaped[advantages < 0] <= 0).all()) and bool((shaped[advantages > 0] > 0).all())


def test_entropy_shaping_strategy_shapes_masked_tokens_only():
    entropies, mask, correct = random_group(2)
    advantages = torch.randn(6, 7, generator=torch.Generator().manual_seed(3))
    batch = GenerationBatch(None, mask, torch.zeros(6, 7, dtype=torch.long), advantages, correct.float(),
                            torch.zeros(6, dtype=torch.long), 6, entropies=entropies.float())
    strategy = STRATEGIES.get("entropy_shaping")(StrategyParams())
    out, metrics = strategy.token_advantages(batch)
    expected, _ = entropy_shaped_advantages(advantages, entropies.float(), 0.4, 2.0)
    torch.testing.assert_close(out[mask.bool()], expected[mask.bool()])
    torch.testing.assert_close(out[~mask.bool()], advantages[~mask.bool()])
    assert STRATEGIES.get("entropy_shaping").needs_entropies
    assert set(metrics) == {"entropy_shaping/bonus_mean", "entropy_shaping/frac_capped", "entropy_shaping/entropy_mean"}


def gtpo_loop_reference(entropies, mask, correct, alpha1, alpha2, level, separate, eps=1e-8):
    """GTPO Eq. 3 / Eq. 5 / Eq. 6 (GRPO-S for ``level`` sequence), one token at a time in float64."""
    rows, length = mask.shape
    alive = [[bool(mask[i, t]) for t in range(length)] for i in range(rows)]
    h = [[float(entropies[i, t]) for t in range(length)] for i in range(rows)]
    ok = [bool(c) for c in correct]
    rewards = {}
    if level == "token":
        for t in range(length):
            pos = [i for i in range(rows) if alive[i][t] and ok[i]]
            neg = [i for i in range(rows) if alive[i][t] and not ok[i]]
            pos_sum = sum(h[i][t] for i in pos)
            neg_sum = sum(1 / (h[i][t] + eps) for i in neg)
            for i in pos:
                rewards[i, t] = alpha1 + alpha2 * h[i][t] / max(pos_sum, eps) * len(pos)
            for i in neg:
                rewards[i, t] = -alpha1 - alpha2 * (1 / (h[i][t] + eps)) / max(neg_sum, eps) * len(neg)
    else:
        mean_h = [sum(h[i][t] for t in range(length) if alive[i][t]) / max(1, sum(alive[i])) for i in range(rows)]
        pos = [i for i in range(rows) if ok[i]]
        neg = [i for i in range(rows) if not ok[i]]
        pos_sum, neg_sum = sum(mean_h[i] for i in pos), sum(1 / (mean_h[i] + eps) for i in neg)
        for i in pos:
            rewards[i, 0] = alpha1 + alpha2 * mean_h[i] / max(pos_sum, eps) * len(pos)
        for i in neg:
            rewards[i, 0] = -alpha1 - alpha2 * (1 / (mean_h[i] + eps)) / max(neg_sum, eps) * len(neg)
    keys = list(rewards)
    sets = [[k for k in keys if ok[k[0]]], [k for k in keys if not ok[k[0]]]] if separate else [keys]
    normalised = {}
    for members in sets:
        if not members:
            continue
        values = [rewards[k] for k in members]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        for k in members:
            normalised[k] = (rewards[k] - mean) / (std + eps)
    out = torch.zeros(rows, length, dtype=torch.float64)
    for i in range(rows):
        for t in range(length):
            if alive[i][t]:
                out[i, t] = normalised[(i, t)] if level == "token" else normalised[(i, 0)]
    return out


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gtpo_matches_loop_reference(level, separate, seed):
    entropies, mask, correct = random_group(seed, holes=seed == 2)
    for alpha1, alpha2 in [(1.0, 0.1), (0.5, 0.5), (1.0, 0.0)]:
        got = gtpo_advantages(entropies, mask, correct, alpha1, alpha2, level, separate)
        expected = gtpo_loop_reference(entropies, mask, correct, alpha1, alpha2, level, separate)
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)


def test_gtpo_rewards_high_entropy_tokens_of_correct_and_confident_tokens_of_incorrect():
    # Two correct and two incorrect completions of equal length: at each position the higher-entropy correct token
    # gets the larger advantage, and the lower-entropy (more confident) incorrect token the more negative one.
    entropies = torch.tensor([[2.0, 0.5], [0.5, 2.0], [2.0, 0.5], [0.5, 2.0]], dtype=torch.float64)
    mask = torch.ones(4, 2)
    correct = torch.tensor([True, True, False, False])
    out = gtpo_advantages(entropies, mask, correct, 1.0, 0.1)
    assert out[0, 0] > out[1, 0] > 0 and out[1, 1] > out[0, 1] > 0
    assert out[3, 0] < out[2, 0] < 0 and out[2, 1] < out[3, 1] < 0


def test_gtpo_strategy_runs_per_group():
    e1, m1, c1 = random_group(4)
    e2, m2, c2 = random_group(5)
    batch = GenerationBatch(None, torch.cat([m1, m2]), torch.zeros(12, 7, dtype=torch.long), torch.zeros(12, 7),
                            torch.cat([c1, c2]).float(), torch.tensor([0] * 6 + [1] * 6), 6,
                            correct=torch.cat([c1, c2]), entropies=torch.cat([e1, e2]).float())
    params = StrategyParams(gtpo_level="sequence")
    out, metrics = STRATEGIES.get("gtpo")(params).token_advantages(batch)
    torch.testing.assert_close(out[:6].double(), gtpo_advantages(e1.float(), m1, c1, 1.0, 0.1, "sequence").double())
    torch.testing.assert_close(out[6:].double(), gtpo_advantages(e2.float(), m2, c2, 1.0, 0.1, "sequence").double())
    assert set(metrics) == {"gtpo/frac_positive", "gtpo/abs_mean", "gtpo/entropy_mean"}


def test_gtpo_warns_when_it_would_replace_earlier_advantage_strategies(tmp_path):
    from helpers import cpu_config

    with pytest.warns(UserWarning, match=r"gtpo replaces the token advantages of \['ktae'\]"):
        cpu_config(tmp_path, strategies=["ktae", "gtpo"])


@pytest.mark.parametrize("field, value", [("entropy_shaping_kappa", 0.5), ("entropy_shaping_alpha", -0.1),
                                          ("gtpo_alpha2", -1.0), ("gtpo_level", "tokens")])
def test_out_of_range_parameters_are_refused_in_one_line(tmp_path, field, value):
    from helpers import cpu_config

    from sharpgrpo.validation import ConfigError

    with pytest.raises(ConfigError, match=rf"^{field}=") as error:
        cpu_config(tmp_path, **{field: value})
    assert "\n" not in str(error.value)
