"""`sharpgrpo.training.loss.surrogates.policy_surrogate` against float64 loops over tokens, with a token weight in either place.

The loop reference writes each loss type's per-token term from its paper (TRL 1.16's definitions) for a scalar
ratio r, advantage A and weight w: `ratio` placement evaluates the term at w*r, `loss` placement multiplies it by w.
"""

import math

import pytest
import torch

from sharpgrpo.strategies.loss_types import LOSS_TYPES, RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.training.loss.surrogates import policy_surrogate

B, T = 4, 5
EPS_LOW, EPS_HIGH, DELTA, TAU_POS, TAU_NEG = 0.2, 0.28, 1.5, 1.0, 1.05


def term(loss_type, r, a, logp, phi):
    """One token's policy loss (value) for ratio r; CISPO and VESPO multiply log p by a detached coefficient."""
    if loss_type == "cispo":
        return -min(r, EPS_HIGH) * a * logp
    if loss_type == "sapo":
        tau = TAU_POS if a > 0 else TAU_NEG
        return -(1 / (1 + math.exp(-tau * (r - 1)))) * 4 / tau * a
    if loss_type == "vespo":
        return -phi * a * logp
    clipped = min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH)
    return -min(min(r, DELTA) * a, clipped * a)


def coefficient(loss_type, r, a, phi):
    """d term / d log p for the loss types whose ratio coefficient is detached (the gradient they are built for)."""
    return -min(r, EPS_HIGH) * a if loss_type == "cispo" else -phi * a


def inputs(seed, sequence_ratio, token_advantages):
    g = torch.Generator().manual_seed(seed)
    ratio = torch.exp(0.4 * torch.randn(B, 1 if sequence_ratio else T, generator=g, dtype=torch.float64))
    advantages = torch.randn(B, T if token_advantages else 1, generator=g, dtype=torch.float64)
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    weights = 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64)
    phi = torch.rand(B, 1, generator=g, dtype=torch.float64)
    return ratio, advantages, logps, weights, phi


PLACEMENTS = [(loss_type, "loss") for loss_type in LOSS_TYPES] + [
    (loss_type, "ratio") for loss_type in RATIO_PLACEMENT_LOSS_TYPES  # the others refuse it (tests/test_config_fields.py)
]


@pytest.mark.parametrize(("loss_type", "placement"), PLACEMENTS)
@pytest.mark.parametrize("sequence_ratio", [False, True], ids=["token_ratio", "sequence_ratio"])
@pytest.mark.parametrize("token_advantages", [False, True], ids=["seq_adv", "token_adv"])
def test_surrogate_matches_float64_loops(loss_type, placement, sequence_ratio, token_advantages):
    for seed in range(2):
        ratio, advantages, logps, weights, phi = inputs(seed, sequence_ratio, token_advantages)
        logps.requires_grad_(True)
        surrogate_ratio = ratio * weights if placement == "ratio" else ratio
        out = policy_surrogate(
            loss_type, surrogate_ratio, advantages, logps, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
            delta=DELTA, sapo_temperature_pos=TAU_POS, sapo_temperature_neg=TAU_NEG, phi_seq=phi,
        )
        if placement == "loss":
            out = weights * out
        out = out.expand(B, T)
        grad = None
        if loss_type in ("cispo", "vespo"):
            (grad,) = torch.autograd.grad(out.sum(), logps)
        for i in range(B):
            for t in range(T):
                r = ratio[i, 0 if sequence_ratio else t].item()
                a = advantages[i, t if token_advantages else 0].item()
                w, logp, p = weights[i, t].item(), logps[i, t].item(), phi[i, 0].item()
                r_eff, scale = (w * r, 1.0) if placement == "ratio" else (r, w)
                assert out[i, t].item() == pytest.approx(scale * term(loss_type, r_eff, a, logp, p), rel=1e-12)
                if grad is not None:  # the ratio coefficient is detached: grad = coefficient, not d/dr of it
                    expected = scale * coefficient(loss_type, r_eff, a, p)
                    assert grad[i, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_placement_equals_scaled_advantage(loss_type):
    """README claim: every surrogate is positively homogeneous in A (for w > 0 the sign of w*A is that of A, which
    selects SAPO's temperature and VESPO's gamma shape), so loss placement equals advantage w*A in loss and grad."""
    ratio, advantages, logps, weights, phi = inputs(0, False, True)
    ratio.requires_grad_(True)
    logps.requires_grad_(True)
    options = dict(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, sapo_temperature_pos=TAU_POS,
                   sapo_temperature_neg=TAU_NEG, phi_seq=phi)
    placed = weights * policy_surrogate(loss_type, ratio, advantages, logps, **options)
    scaled = policy_surrogate(loss_type, ratio, weights * advantages, logps, **options)
    torch.testing.assert_close(placed, scaled, rtol=1e-12, atol=1e-12)
    placed_grads = torch.autograd.grad(placed.sum(), [ratio, logps], allow_unused=True)
    scaled_grads = torch.autograd.grad(scaled.sum(), [ratio, logps], allow_unused=True)
    for placed_grad, scaled_grad in zip(placed_grads, scaled_grads, strict=True):
        if placed_grad is None or scaled_grad is None:  # this surrogate does not differentiate through the input
            assert placed_grad is None and scaled_grad is None
        else:
            assert placed_grad.abs().max() > 0
            torch.testing.assert_close(placed_grad, scaled_grad, rtol=1e-12, atol=1e-12)


def test_unknown_loss_type_and_missing_phi_raise():
    ratio, advantages, logps, _, _ = inputs(0, False, False)
    with pytest.raises(ValueError, match="Unknown loss type 'ppo'"):
        policy_surrogate("ppo", ratio, advantages, logps, epsilon_low=0.2, epsilon_high=0.2)
    with pytest.raises(ValueError, match="phi_seq"):
        policy_surrogate("vespo", ratio, advantages, logps, epsilon_low=0.2, epsilon_high=0.2)
