"""Clip-Cov, KL-Cov, DPPO (TV and KL) and GMPO reproduce verl's released policy losses on fixed inputs.

Upstream: verl-project/verl, commit 1dda039b9c6311889a9c9a26040677e1254814f9, ``verl/trainer/ppo/core_algos.py``:
``compute_policy_loss_dppo_tv`` (lines 1379-1457), ``compute_policy_loss_dppo_kl`` (1460-1542),
``compute_policy_loss_clip_cov`` (1742-1844), ``compute_policy_loss_kl_cov`` (1847-1924),
``compute_policy_loss_geo_mean`` (1927-2010), each with ``loss_agg_mode="token-mean"`` (``agg_loss``, one process).
The expected values below were produced by running those functions themselves (with verl's ``masked_mean`` from
``verl/utils/torch_functional.py``) on the inputs of this file in float64; the test assembles the same loss from
sharpgrpo's pieces (the strategy's ``loss_terms``, ``policy_surrogate``, ``apply_token_terms``, ``aggregate_loss`` with
``bnpo``, or ``cispo`` with the micro-batch as its window: TRL's token-mean over the micro-batch) and compares the loss and its gradient with respect to each token's
log-probability. Where sharpgrpo spells verl's settings differently: verl's ``clip_ratio`` is ``epsilon`` for Clip-Cov
and KL-Cov, ``dppo_*_low/high`` for DPPO and ``gmpo_epsilon_*`` for GMPO; verl's DPPO truncation ``clip_ratio_c`` is the
``cispo`` loss type's ``epsilon_high``.
"""

from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies import STRATEGIES, LossContext
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.training.loss.aggregation import aggregate_loss, sequence_objective_loss
from sharpgrpo.training.loss.surrogates import policy_surrogate
from sharpgrpo.training.loss.terms import apply_token_terms, clip_range

D = torch.float64
LOGPS = torch.tensor([[-0.05, -1.2, -3.5, -0.4], [-2.8, -0.1, -0.9, -4.0], [-0.3, -2.2, -0.02, -1.6]], dtype=D)
OLD_LOGPS = LOGPS + torch.tensor([[-0.3, 0.3, -0.25, 0.05], [0.1, -0.3, 0.5, 0.2], [-0.15, 0.02, 0.0, 0.0]], dtype=D)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]], dtype=D)
ADVANTAGES = torch.tensor([[2.5], [-2.0], [0.8]], dtype=D)  # verl gets them broadcast to (3, 4)

# name: (sharpgrpo strategy, its settings, the loss type, verl's settings, verl's loss, verl's d loss / d log p)
RELEASED = {
    "clip_cov": (
        "clip_cov", dict(clip_cov_ratio=0.25), "bnpo", "clip_ratio=0.2, clip_cov_ratio=0.25 (lb 1, ub 5)",
        -0.5851060299311466,
        [[0.0, -0.205782839078, 0.0, 0.0], [0.0, 0.299968623906, 0.0, 0.0], [-0.103274154909, -0.087128770961, 0, 0]],
    ),
    "kl_cov": (
        "kl_cov", dict(kl_cov_ratio=0.25, kl_cov_coef=1.0), "bnpo", "kl_cov_ratio=0.25, ppo_kl_coef=1",
        -0.7117780261993645,
        [[-0.263849668771, -0.205782839078, -0.356673726858, -0.264230395695],
         [0.089963870675, 0.299968623906, 0.134784591047, 0.0], [-0.103274154909, -0.087128770961, 0.0, 0.0]],
    ),
    "dppo_tv": (
        "dppo_tv", dict(dppo_tv_low=0.15, dppo_tv_high=0.15), "cispo", "clip_ratio=0.15, clip_ratio_c=1.2",
        1.1522871587576857,
        [[0.0, -0.205782839078, -0.333333333333, -0.264230395695], [0.201074981786, 0.266666666667, 0.0, 0.0],
         [-0.103274154909, -0.087128770961, 0.0, 0.0]],
    ),
    "dppo_kl": (
        "dppo_kl", dict(dppo_kl_low=0.02, dppo_kl_high=0.02), "cispo", "clip_ratio=0.02, clip_ratio_c=1.2",
        1.1213049122849315,
        [[0.0, -0.205782839078, -0.333333333333, -0.264230395695], [0.201074981786, 0.266666666667, 0.0, 0.0],
         [0.0, -0.087128770961, 0.0, 0.0]],
    ),
}
GEO_MEAN_LOSS = -0.5369636615866824  # clip_ratio=0.4
GEO_MEAN_GRAD = [[-0.219014810623] * 4, [0.207890439778, 0.207890439778, 0.0, 0.0], [-0.142287868449] * 2 + [0.0] * 2]


def strategy_args(**overrides):
    """The strategy parameters' declared defaults, with the trainer fields the adapters read."""
    values = {f.name: f.default for f in fields(StrategyParams)}
    return SimpleNamespace(**{**values, "seed": 0, "process_index": 0, **overrides})


def sharpgrpo_loss(name, settings, loss_type, epsilon_low, epsilon_high):
    """Our loss on the fixed inputs: the strategy's terms folded into TRL's surrogate, token-mean aggregated."""
    logps = LOGPS.clone().requires_grad_(True)
    strategy = STRATEGIES.get(name)(strategy_args(loss_type=loss_type, **settings))
    context = LossContext(logps, OLD_LOGPS, ADVANTAGES, MASK, None, epsilon_low, epsilon_high)
    terms, metrics = strategy.loss_terms(context)
    low, high = clip_range(terms, epsilon_low, epsilon_high)
    ratio = torch.exp(logps - OLD_LOGPS)
    per_token = policy_surrogate(loss_type, ratio, ADVANTAGES, logps, epsilon_low=low, epsilon_high=high)
    per_token = apply_token_terms(per_token, terms)
    # cispo normalises by the window's tokens: here the micro-batch is the window, its token-mean.
    loss, _ = aggregate_loss(per_token, MASK, loss_type, accumulation_steps=1, window_tokens=MASK.sum())
    loss.backward()
    return loss.detach(), logps.grad, metrics


@pytest.mark.parametrize("case", sorted(RELEASED))
def test_reproduces_verl_loss_and_token_gradients(case):
    """verl's loss and per-token gradient (values from running verl's functions, module docstring)."""
    name, settings, loss_type, _, verl_loss, verl_grad = RELEASED[case]
    # Clip-Cov and KL-Cov use the PPO clip epsilon = verl's clip_ratio 0.2; DPPO's cispo truncation C = 1.2.
    epsilon_low, epsilon_high = (0.2, 1.2) if loss_type == "cispo" else (0.2, 0.2)
    loss, grad, _ = sharpgrpo_loss(name, settings, loss_type, epsilon_low, epsilon_high)
    torch.testing.assert_close(loss, torch.tensor(verl_loss, dtype=D), atol=1e-9, rtol=0)
    torch.testing.assert_close(grad, torch.tensor(verl_grad, dtype=D), atol=1e-9, rtol=0)


@pytest.mark.parametrize("case", ["dppo_tv", "dppo_kl"])
def test_dppo_on_a_ppo_clip_loss_type_has_verls_gradient(case):
    """With a PPO-clip loss type the mask replaces the clip (``dppo_keep_clip`` false): the surrogate is -r A, whose
    gradient is verl's -A sg[min(r, C)] grad log p with C = inf: verl's gradient at C = 1.2 times r / min(r, 1.2)
    (two tokens inside the region have r > 1.2: (0, 2) and (1, 1))."""
    name, settings, _, _, _, verl_grad = RELEASED[case]
    _, grad, _ = sharpgrpo_loss(name, settings, "bnpo", 0.2, 0.2)
    ratio = torch.exp(LOGPS - OLD_LOGPS)
    assert ((ratio > 1.2) & (torch.tensor(verl_grad, dtype=D) != 0)).sum() == 2
    expected = torch.tensor(verl_grad, dtype=D) * ratio / ratio.clamp(max=1.2)
    torch.testing.assert_close(grad, expected, atol=1e-9, rtol=0)


def test_clip_cov_detach_option_keeps_the_value_and_verls_gradient():
    """``clip_cov_keep_value`` (the paper's "detach"): same gradient as verl, the selected tokens' value kept."""
    name, settings, _, _, verl_loss, verl_grad = RELEASED["clip_cov"]
    loss, grad, _ = sharpgrpo_loss(name, {**settings, "clip_cov_keep_value": True}, "bnpo", 0.2, 0.2)
    torch.testing.assert_close(grad, torch.tensor(verl_grad, dtype=D), atol=1e-9, rtol=0)
    ratio = torch.exp(LOGPS - OLD_LOGPS)
    selected_values = -(ADVANTAGES * ratio)[0, 3] - (ADVANTAGES * ratio)[1, 0]  # the two tokens Clip-Cov selects
    torch.testing.assert_close(loss, torch.tensor(verl_loss, dtype=D) + selected_values / MASK.sum(), atol=1e-9,
                               rtol=0)


def test_gmpo_reproduces_verl_geo_mean():
    """verl's ``geo_mean`` (clip_ratio 0.4 both sides): the mean over sequences of -A_i exp(mean clipped log r)."""
    logps = LOGPS.clone().requires_grad_(True)
    strategy = STRATEGIES.get("gmpo")(strategy_args(loss_type="grpo", gmpo_epsilon_low=0.4, gmpo_epsilon_high=0.4))
    terms, _ = strategy.loss_terms(LossContext(logps, OLD_LOGPS, ADVANTAGES, MASK, None, 0.2, 0.2))
    loss, _ = sequence_objective_loss(terms.sequence_loss, None, 0.0, MASK, 1.0)
    loss.backward()
    # verl divides by (tokens + 1e-8) where TRL (and we) divide by max(tokens, 1): a relative 1e-8 apart.
    torch.testing.assert_close(loss.detach(), torch.tensor(GEO_MEAN_LOSS, dtype=D), atol=1e-8, rtol=0)
    torch.testing.assert_close(logps.grad, torch.tensor(GEO_MEAN_GRAD, dtype=D), atol=1e-8, rtol=0)
