"""GRPO-SG / TR-GRPO weights and the ablations against float64 loop references (docs/methods.md §1)."""

import math

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategies.probability_shaping import (
    ar_token_advantages,
    probability_shaping_weights,
    reverse_probability_shaping_weights,
)

DEFAULTS = dict(alpha=2.0, mu=0.25, tau=1 / 9, lower=1.0, upper=1.4)


def reference_weight(p, alpha, mu, tau, lower, upper):
    value = alpha * (1.0 / (1.0 + math.exp(-p / tau)) - mu)
    return min(max(value, lower), upper)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("params", [DEFAULTS, dict(alpha=1.7, mu=0.1, tau=0.3, lower=0.8, upper=1.2)])
def test_weights_match_loop_reference(seed, params):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(4, 9, generator=generator, dtype=torch.float64)
    probs[0, 0], probs[0, 1] = 0.0, 1.0  # the ends of [0, 1]
    weights = probability_shaping_weights(probs, **params)
    for i in range(probs.shape[0]):
        for t in range(probs.shape[1]):
            assert weights[i, t].item() == pytest.approx(reference_weight(probs[i, t].item(), **params), abs=1e-12)
    reverse = reverse_probability_shaping_weights(probs, **params)
    torch.testing.assert_close(reverse, 2.0 - weights)


def test_weights_at_documented_points():
    # docs/methods.md §1: with tau = 1/9, w = 1 for p <= 0.122, 1.216 at p = 0.2, 1.374 at p = 0.3, 1.4 for p >= 0.327.
    probs = torch.tensor([0.0, 0.12, 0.2, 0.3, 0.33, 1.0], dtype=torch.float64)
    weights = probability_shaping_weights(probs, **DEFAULTS)
    expected = torch.tensor([1.0, 1.0, 1.216, 1.374, 1.4, 1.4], dtype=torch.float64)
    torch.testing.assert_close(weights, expected, atol=1e-3, rtol=0)


def test_weights_carry_no_gradient():
    logps = torch.randn(2, 3, requires_grad=True)
    assert not probability_shaping_weights(logps.exp(), **DEFAULTS).requires_grad


def test_printed_tau_is_plain_grpo_and_warns(tmp_path):
    grid = torch.linspace(0, 1, 101, dtype=torch.float64)
    assert torch.all(probability_shaping_weights(grid, 2.0, 0.25, 9.0, 1.0, 1.4) == 1.0)
    with pytest.warns(UserWarning, match=r"constant \(1\.0000\.\.1\.0000\)"):
        cpu_config(tmp_path, sg_tau=9.0)


def test_strategy_classes(tmp_path):
    args = cpu_config(tmp_path)
    logps = torch.log(torch.tensor([[1e-6, 0.2, 0.3, 1.0]]))
    mask = torch.ones_like(logps)
    sg = STRATEGIES.get("grpo_sg")(args)
    torch.testing.assert_close(sg.weights(logps, mask), probability_shaping_weights(logps.exp(), **DEFAULTS))
    torch.testing.assert_close(STRATEGIES.get("equal")(args).weights(logps, mask), torch.ones_like(logps))
    torch.testing.assert_close(STRATEGIES.get("reverse")(args).weights(logps, mask), 2 - sg.weights(logps, mask))
    assert STRATEGIES.get("reverse")(args).bounds() == pytest.approx((0.6, 1.0))


def test_random_weights_seeded_bounded_and_resumable(tmp_path):
    args = cpu_config(tmp_path, strategies="random", seed=3)
    logps = torch.zeros(64, 32)
    first, second = STRATEGIES.get("random")(args), STRATEGIES.get("random")(args)
    state = first.state_dict()
    draws = first.weights(logps, logps)
    torch.testing.assert_close(draws, second.weights(logps, logps))  # same seed, same draws
    assert draws.min() >= 0.5 and draws.max() <= 1.5
    assert abs(draws.mean().item() - 1.0) < 0.02 and draws.std().item() == pytest.approx(1 / math.sqrt(12), rel=0.05)
    assert not torch.equal(draws, first.weights(logps, logps))  # the generator advances
    first.load_state_dict(state)
    torch.testing.assert_close(first.weights(logps, logps), draws)  # restored state replays the draws
    other_seed = STRATEGIES.get("random")(cpu_config(tmp_path, strategies="random", random_weight_seed=4))
    assert not torch.equal(other_seed.weights(logps, logps), draws)


@pytest.mark.parametrize("seed", range(3))
def test_ar_token_advantages_loop_reference(seed):
    generator = torch.Generator().manual_seed(seed)
    probs = torch.rand(3, 5, generator=generator, dtype=torch.float64)
    advantages = torch.randn(3, generator=generator, dtype=torch.float64)[:, None].expand(3, 5)
    result = ar_token_advantages(probs, advantages, alpha=0.3)
    for i in range(3):
        for t in range(5):
            expected = (0.3 * probs[i, t].item() + 0.7) * advantages[i, t].item()
            assert result[i, t].item() == pytest.approx(expected, abs=1e-12)
