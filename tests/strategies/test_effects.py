"""Tests of what the methods do with their defaults, not only of their arithmetic.

* every weight strategy, on-policy, gives a confident token (p = 0.9) of a positive-advantage completion a non-zero
  policy gradient of the expected sign (fails under the old default `weight_placement: ratio` for `grpo_sg`);
* `ratio` placement silences exactly the tokens with w > 1 + epsilon_high, which the config warning computes;
* the mechanism of GRPO-SG Theorem 3.5: over a realistic spread of p, w * (1 - p) varies less (coefficient of
  variation) than (1 - p).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategies.probability_shaping import probability_shaping_weights, ratio_silenced_range
from sharpgrpo.training.loss.surrogates import weighted_policy_surrogate

# Every weight strategy the package registers, from the registry: a new one is tested here with no edit.
WEIGHT_STRATEGIES = [name for name in STRATEGIES.names() if STRATEGIES.get(name).kind == "weight"
                     and STRATEGIES.get(name).__module__.startswith("sharpgrpo.strategies.")]


def test_the_registry_lists_the_weight_strategies():
    assert {"grpo_sg", "equal", "random", "reverse"} <= set(WEIGHT_STRATEGIES)


def policy_gradient(args, strategy, prob: float, advantage: float, tokens: int = 256) -> torch.Tensor:
    """d loss / d logp of ``tokens`` on-policy tokens of probability ``prob`` (r = 1), the trainer's surrogate."""
    logp = torch.full((1, tokens), math.log(prob), dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, tokens)
    ratio = torch.exp(logp - logp.detach())  # on-policy: old = current
    weights = strategy.weights(logp.detach(), mask).detach()
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    loss, _ = weighted_policy_surrogate(args.loss_type, ratio, torch.tensor([[advantage]], dtype=torch.float64), logp,
                                        weights, args.weight_placement, epsilon_low=args.epsilon,
                                        epsilon_high=eps_high, delta=args.delta)
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return grad


@pytest.mark.parametrize("name", WEIGHT_STRATEGIES)
def test_confident_token_of_positive_completion_gets_a_gradient(tmp_path, name):
    # The paper configs' clip-higher epsilons (0.20 / 0.24); TRL's symmetric default gives the same signs.
    for overrides in ({}, {"epsilon_high": 0.24}):
        args = cpu_config(tmp_path, strategies=name, **overrides)
        strategy = STRATEGIES.get(name)(args)
        positive = policy_gradient(args, strategy, 0.9, 1.0)
        negative = policy_gradient(args, strategy, 0.9, -1.0)
        assert (positive < 0).all(), f"{name}: a descent step must raise the confident token's log-prob"
        assert (negative > 0).all(), f"{name}: a descent step must lower it for a negative advantage"


def test_ratio_placement_silences_the_confident_token(tmp_path):
    """Why `loss` is the default: with `ratio` (Eq. 13 as printed) the same token gets exactly no gradient."""
    with pytest.warns(UserWarning, match=r"p > 0\.211"):
        args = cpu_config(tmp_path, strategies="grpo_sg", weight_placement="ratio", epsilon_high=0.24)
    strategy = STRATEGIES.get("grpo_sg")(args)
    assert torch.equal(policy_gradient(args, strategy, 0.9, 1.0), torch.zeros(1, 256, dtype=torch.float64))
    assert (policy_gradient(args, strategy, 0.15, 1.0) < 0).all()  # w(0.15) < 1.24: below the silenced range


def test_silenced_range_is_computed_from_the_configuration():
    params = (2.0, 0.25, 1 / 9, 1.0, 1.4)
    low, high = ratio_silenced_range(lambda p: probability_shaping_weights(p, *params), 0.24)
    closed_form = (1 / 9) * math.log(0.87 / 0.13)  # w(p) = 1.24 <=> sigmoid(9p) = 1.24/2 + 0.25
    assert high == 1.0 and low == pytest.approx(closed_form, abs=1e-9) and low == pytest.approx(0.2112, abs=1e-4)
    low_02, _ = ratio_silenced_range(lambda p: probability_shaping_weights(p, *params), 0.2)
    assert low_02 == pytest.approx((1 / 9) * math.log(0.85 / 0.15), abs=1e-9)
    assert ratio_silenced_range(lambda p: probability_shaping_weights(p, *params), 0.45) is None  # U = 1.4 < 1.45
    assert ratio_silenced_range(lambda p: 2.0 - probability_shaping_weights(p, *params), 0.24) is None


def test_ratio_warning_only_when_something_is_silenced(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        cpu_config(tmp_path, strategies="equal", weight_placement="ratio")
        cpu_config(tmp_path, strategies="reverse", weight_placement="ratio")
        cpu_config(tmp_path, strategies="grpo_sg")  # default placement `loss`
    with pytest.warns(UserWarning, match=r"random 26\.0% of tokens"):
        cpu_config(tmp_path, strategies="random", weight_placement="ratio", epsilon_high=0.24)


def coefficient_of_variation(values: torch.Tensor) -> float:
    return float(values.std() / values.mean())


def test_theorem_3_5_mechanism_weight_times_one_minus_p_varies_less():
    """GRPO-SG Theorem 3.5 bounds the gradient through per-token factors gamma * w * (1 - p): the shaping helps when
    w * (1 - p) is more uniform across tokens than (1 - p). Checked over spreads of p like an LLM's sampled tokens
    (most near 1, a long low tail; logit-normal), a uniform and a U-shaped spread, with the default weights."""
    generator = torch.Generator().manual_seed(0)
    spreads = {
        "logit-normal(2, 2.5)": torch.sigmoid(2.0 + 2.5 * torch.randn(200_000, generator=generator).double()),
        "uniform": torch.rand(200_000, generator=generator, dtype=torch.float64),
        "beta(0.5, 0.5)": torch.distributions.Beta(0.5, 0.5).sample((200_000,)).double(),
    }
    for name, p in spreads.items():
        w = probability_shaping_weights(p, 2.0, 0.25, 1 / 9, 1.0, 1.4)
        plain, shaped = coefficient_of_variation(1 - p), coefficient_of_variation(w * (1 - p))
        print(f"{name}: CV(1 - p) = {plain:.4f}, CV(w (1 - p)) = {shaped:.4f}")
        assert shaped < plain, name
