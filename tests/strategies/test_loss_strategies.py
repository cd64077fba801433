"""The loss-side strategies' pure functions and the loss's use of ``LossTerms`` against float64 loop references.

Random inputs: several groups of completions with ragged lengths (right padding), off-policy old log-probabilities,
sequence (B, 1) and token (B, T) advantages. Every reference is a plain Python loop over tokens in float64.
"""

import math
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies import STRATEGIES, LossContext, LossTerms
from sharpgrpo.strategies.entropy_covariance import (
    clip_cov_selection,
    kl_cov_penalty,
    kl_cov_selection,
    token_covariance,
)
from sharpgrpo.strategies.geometric_mean import gmpo_sequence_loss
from sharpgrpo.strategies.trust_region import binary_kl, kl_trust_region_mask, tv_trust_region_mask
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.training.loss.aggregation import sequence_objective_loss
from sharpgrpo.training.loss.surrogates import kl_penalty, policy_surrogate
from sharpgrpo.training.loss.terms import apply_token_terms, clip_range, collect_loss_terms, weighted_kl

D = torch.float64
GROUPS, G, T = 3, 4, 7
SEEDS = [0, 1, 2]


def batch(seed, token_advantages=False):
    """(logps, old_logps, advantages, mask) of GROUPS groups of G completions, T tokens, ragged lengths."""
    generator = torch.Generator().manual_seed(seed)
    b = GROUPS * G
    logps = -torch.rand(b, T, generator=generator, dtype=D) * 3 - 0.01
    old_logps = (logps + 0.3 * torch.randn(b, T, generator=generator, dtype=D)).clamp(max=-1e-3)
    lengths = torch.randint(1, T + 1, (b,), generator=generator)
    mask = (torch.arange(T) < lengths[:, None]).to(D)
    rewards = torch.randn(GROUPS, G, generator=generator, dtype=D)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)).reshape(b, 1)
    if token_advantages:
        advantages = advantages * (0.5 + torch.rand(b, T, generator=generator, dtype=D))
    return logps, old_logps, advantages, mask


def valid_tokens(mask):
    return [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t] > 0]


def advantage_at(advantages, i, t):
    return float(advantages[i, t if advantages.shape[1] > 1 else 0])


def covariance_reference(logps, advantages, mask):
    tokens = valid_tokens(mask)
    mean_a = sum(advantage_at(advantages, i, t) for i, t in tokens) / len(tokens)
    mean_l = sum(float(logps[i, t]) for i, t in tokens) / len(tokens)
    return {(i, t): (advantage_at(advantages, i, t) - mean_a) * (float(logps[i, t]) - mean_l) for i, t in tokens}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("token_advantages", [False, True])
def test_token_covariance_matches_loop(seed, token_advantages):
    logps, _, advantages, mask = batch(seed, token_advantages)
    covariance = token_covariance(logps, advantages, mask)
    for (i, t), value in covariance_reference(logps, advantages, mask).items():
        assert math.isclose(float(covariance[i, t]), value, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ratio", [0.0002, 0.1, 0.5])
def test_clip_cov_selects_the_smallest_keyed_candidates(seed, ratio):
    """Candidates: valid, PPO clip inactive, lb < c < ub; selected: the max(floor(ratio N), 1) of smallest key."""
    logps, old_logps, advantages, mask = batch(seed)
    keys = torch.rand(logps.shape, generator=torch.Generator().manual_seed(seed + 100), dtype=D)
    lower, upper, eps = -0.5, 2.0, 0.2
    selected, candidates, _ = clip_cov_selection(logps, old_logps, advantages, mask, epsilon_low=eps,
                                                 epsilon_high=eps, ratio=ratio, lower=lower, upper=upper, keys=keys)
    reference = []
    for (i, t), c in covariance_reference(logps, advantages, mask).items():
        r, a = math.exp(float(logps[i, t] - old_logps[i, t])), advantage_at(advantages, i, t)
        clipped = -a * min(max(r, 1 - eps), 1 + eps) > -a * r
        if not clipped and lower < c < upper:
            reference.append((float(keys[i, t]), i, t))
    assert {(i, t) for _, i, t in reference} == set(map(tuple, candidates.nonzero().tolist()))
    count = max(int(ratio * len(valid_tokens(mask))), 1)
    expected = {(i, t) for _, i, t in sorted(reference)[:count]}
    assert len(reference) > 0 and set(map(tuple, selected.nonzero().tolist())) == expected


def test_clip_cov_draws_every_candidate_equally_often():
    """With i.i.d. uniform keys each of n candidates is selected with probability k / n (verl's randperm)."""
    logps, old_logps, advantages, mask = batch(0)
    generator = torch.Generator().manual_seed(7)
    counts, draws = None, 3000
    for _ in range(draws):
        keys = torch.rand(logps.shape, generator=generator, dtype=D)
        selected, candidates, _ = clip_cov_selection(logps, old_logps, advantages, mask, epsilon_low=0.2,
                                                     epsilon_high=0.2, ratio=0.05, lower=-0.5, upper=2.0, keys=keys)
        counts = selected.to(D) if counts is None else counts + selected.to(D)
    n, k = int(candidates.sum()), max(int(0.05 * mask.sum()), 1)
    assert n > k
    frequencies = counts[candidates] / draws
    assert torch.allclose(frequencies, torch.full_like(frequencies, k / n), atol=4 * math.sqrt(k / n / draws))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ratio", [0.0002, 0.1, 0.3])
def test_kl_cov_selects_the_largest_covariances_and_penalises_them(seed, ratio):
    logps, old_logps, advantages, mask = batch(seed, token_advantages=seed == 1)
    selected, _ = kl_cov_selection(logps, advantages, mask, ratio)
    reference = sorted(covariance_reference(logps, advantages, mask).items(), key=lambda item: -item[1])
    count = max(int(ratio * len(reference)), 1)
    assert set(map(tuple, selected.nonzero().tolist())) == {token for token, _ in reference[:count]}
    penalty = kl_cov_penalty(logps, old_logps, selected, 0.7)
    for i in range(mask.shape[0]):
        for t in range(T):
            expected = 0.7 * abs(float(logps[i, t] - old_logps[i, t])) if selected[i, t] else 0.0
            assert math.isclose(float(penalty[i, t]), expected, rel_tol=1e-12, abs_tol=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_dppo_masks_match_loop(seed):
    logps, old_logps, advantages, mask = batch(seed, token_advantages=seed == 2)
    advantages = advantages.clone()
    advantages[0] = 0.0  # A = 0 takes the negative branch (verl: where(A > 0, ...))
    low, high = 0.05, 0.08
    tv = tv_trust_region_mask(logps, old_logps, advantages, low, high)
    kl, divergence = kl_trust_region_mask(logps, old_logps, advantages, 0.01, 0.02)
    for i in range(mask.shape[0]):
        for t in range(T):
            p, q, a = math.exp(float(logps[i, t])), math.exp(float(old_logps[i, t])), advantage_at(advantages, i, t)
            assert tv[i, t] == float(p - q <= high if a > 0 else p - q >= -low)
            d = q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            assert math.isclose(float(divergence[i, t]), d, rel_tol=1e-9, abs_tol=1e-12)
            assert kl[i, t] == float((d <= 0.02 or p <= q) if a > 0 else (d <= 0.01 or p >= q))
    assert 0 < tv.sum() < tv.numel() and 0 < kl.sum() < kl.numel()
    assert torch.equal(binary_kl(old_logps, old_logps), torch.zeros_like(old_logps))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("token_advantages", [False, True])
def test_gmpo_sequence_loss_value_and_gradient_match_loop(seed, token_advantages):
    logps, old_logps, advantages, mask = batch(seed, token_advantages)
    low, high = 0.25, 0.3
    logps = logps.clone().requires_grad_(True)
    loss, _ = gmpo_sequence_loss(logps, old_logps, advantages, mask, epsilon_low=low, epsilon_high=high)
    loss.sum().backward()
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        a = sum(advantage_at(advantages, i, t) for t in range(n)) / n
        clipped, free = [], []
        for t in range(n):
            x = float(logps[i, t].detach() - old_logps[i, t])
            c = min(max(x, -low), high)
            value = min(x, c) if a > 0 else max(x, c)
            clipped.append(value)
            free.append(value == x)  # the clip is inactive: the gradient flows through log p
        ratio = math.exp(sum(clipped) / n)
        assert math.isclose(float(loss[i]), -ratio * a, rel_tol=1e-12, abs_tol=1e-14)
        for t in range(T):
            grad = -a * ratio / n if t < n and free[t] else 0.0
            assert math.isclose(float(logps.grad[i, t]), grad, rel_tol=1e-10, abs_tol=1e-14)


def strategy_args(**overrides):
    values = {f.name: f.default for f in fields(StrategyParams)}
    return SimpleNamespace(**{**values, "seed": 0, "process_index": 0, "loss_type": "grpo", **overrides})


class PerTokenClipAndKL:
    """A loss strategy setting a per-token clip range and KL factor (as Archer does), for the wiring test."""

    kind = "loss"

    def __init__(self, low, high, kl_weight):
        self.low, self.high, self.kl_weight = low, high, kl_weight

    def loss_terms(self, context):
        return LossTerms(epsilon_low=self.low, epsilon_high=self.high, kl_weight=self.kl_weight), {}


class MaskAndExtra:
    """A loss strategy with a gradient mask, a token mask and an extra term, for the composition test."""

    kind = "loss"

    def __init__(self, gradient_mask, token_mask, extra):
        self.terms = LossTerms(gradient_mask=gradient_mask, token_mask=token_mask, extra_loss=extra)

    def loss_terms(self, context):
        return self.terms, {"test/metric": context.logps.new_tensor(1.0)}


@pytest.mark.parametrize("seed", SEEDS)
def test_per_token_clip_range_and_kl_weight_wiring_matches_loop(seed):
    """The per-token clip range replaces the configured one in PPO's clip, the KL factor scales beta * k3; masks of
    two strategies multiply, their extra terms add; value and gradient against a float64 loop."""
    logps, old_logps, advantages, mask = batch(seed)
    generator = torch.Generator().manual_seed(seed + 50)
    shape = logps.shape
    low = 0.05 + 0.3 * torch.rand(shape, generator=generator, dtype=D)
    high = 0.05 + 0.3 * torch.rand(shape, generator=generator, dtype=D)
    kl_weight = torch.rand(shape, generator=generator, dtype=D) * 2
    gradient_mask = (torch.rand(shape, generator=generator) > 0.3).to(D)
    token_mask = [(torch.rand(shape, generator=generator) > 0.2).to(D) for _ in range(2)]
    extra = [0.1 * torch.randn(shape, generator=generator, dtype=D) for _ in range(2)]
    ref_logps = old_logps + 0.1 * torch.randn(shape, generator=generator, dtype=D)
    beta = 0.3
    strategies = [PerTokenClipAndKL(low, high, kl_weight), MaskAndExtra(gradient_mask, token_mask[0], extra[0]),
                  MaskAndExtra(None, token_mask[1], extra[1] * logps.new_ones(()))]
    logps = logps.clone().requires_grad_(True)
    # extra terms with a graph: the second strategy's term is extra * log p
    strategies[2].terms.extra_loss = extra[1] * logps
    named = [(f"s{i}", strategy) for i, strategy in enumerate(strategies)]
    terms, metrics, _ = collect_loss_terms(named, LossContext(logps, old_logps, advantages, mask, None, 0.2, 0.2))
    assert set(metrics) == {"test/metric"}
    eps_low, eps_high = clip_range(terms, 0.2, 0.2)
    ratio = torch.exp(logps - old_logps)
    per_token = policy_surrogate("grpo", ratio, advantages, logps, epsilon_low=eps_low, epsilon_high=eps_high)
    per_token = apply_token_terms(per_token, terms)
    per_token = per_token + beta * weighted_kl(kl_penalty(ref_logps, logps, None, "none"), terms)
    (per_token * mask).sum().backward()
    for i in range(shape[0]):
        for t in range(T):
            x, a = float(logps[i, t]), advantage_at(advantages, i, t)
            r = math.exp(x - float(old_logps[i, t]))
            lo, hi = 1 - float(low[i, t]), 1 + float(high[i, t])
            clipped_r = min(max(r, lo), hi)
            surrogate = -min(r * a, clipped_r * a)
            surrogate_grad = -r * a if r * a <= clipped_r * a else 0.0  # d/dlogp of the branch min picks
            m = float(token_mask[0][i, t] * token_mask[1][i, t])
            g = float(gradient_mask[i, t])
            d = float(ref_logps[i, t]) - x
            k3 = math.exp(d) - d - 1
            value = m * surrogate + float(extra[0][i, t]) + float(extra[1][i, t]) * x
            value += beta * float(kl_weight[i, t]) * k3
            grad = m * g * surrogate_grad + float(extra[1][i, t]) + beta * float(kl_weight[i, t]) * (1 - math.exp(d))
            assert math.isclose(float(per_token[i, t]), value, rel_tol=1e-10, abs_tol=1e-12)
            expected_grad = grad * float(mask[i, t])
            assert math.isclose(float(logps.grad[i, t]), expected_grad, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_sequence_objective_loss_matches_loop(seed):
    """TRL GMPO's aggregation: mean over sequences of (sequence loss + beta * token-mean KL), / accumulation."""
    logps, _, _, mask = batch(seed)
    generator = torch.Generator().manual_seed(seed)
    sequence_loss = torch.randn(mask.shape[0], generator=generator, dtype=D)
    kl = torch.rand(logps.shape, generator=generator, dtype=D)
    loss, policy_loss = sequence_objective_loss(sequence_loss, kl, 0.04, mask, 4.0)
    expected = 0.0
    for i in range(mask.shape[0]):
        n = int(mask[i].sum())
        expected += float(sequence_loss[i]) + 0.04 * sum(float(kl[i, t]) for t in range(n)) / n
    expected /= mask.shape[0]
    assert math.isclose(float(policy_loss), expected, rel_tol=1e-12)
    assert math.isclose(float(loss), expected / 4.0, rel_tol=1e-12)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "gmpo"])
def test_registered_adapters_return_device_scalar_metrics(name):
    """Each adapter's terms have the micro-batch's shape and its metrics are 0-d tensors (no host read)."""
    logps, old_logps, advantages, mask = batch(0)
    args = strategy_args(loss_type="grpo", clip_cov_ratio=0.2, clip_cov_lb=-1.0, kl_cov_ratio=0.2)
    terms, metrics = STRATEGIES.get(name)(args).loss_terms(
        LossContext(logps, old_logps, advantages, mask, None, 0.2, 0.2))
    assert metrics and all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    for field in ("gradient_mask", "token_mask", "extra_loss"):
        value = getattr(terms, field)
        assert value is None or value.shape == logps.shape
    if name == "gmpo":
        assert terms.sequence_loss.shape == (logps.shape[0],)
        assert math.isclose(float(terms.epsilon_high), math.exp(0.4) - 1) and terms.token_mask is None
    else:
        changed = [getattr(terms, f) for f in ("gradient_mask", "token_mask", "extra_loss")]
        assert any(v is not None and bool((v != (0 if f == 2 else 1)).any()) for f, v in enumerate(changed))


def test_clip_cov_random_draw_resumes_from_its_state():
    """Clip-Cov's generator is checkpointed (``state_dict``): a strategy restored from it selects what the original
    selects next; processes draw differently (seed + process index)."""
    logps, old_logps, advantages, mask = batch(0)
    context = LossContext(logps, old_logps, advantages, mask, None, 0.2, 0.2)
    args = strategy_args(clip_cov_ratio=0.05, clip_cov_lb=-0.5, clip_cov_ub=2.0)
    original = STRATEGIES.get("clip_cov")(args)
    original.loss_terms(context)
    restored = STRATEGIES.get("clip_cov")(args)
    restored.load_state_dict(original.state_dict())
    for _ in range(3):
        assert torch.equal(original.loss_terms(context)[0].token_mask, restored.loss_terms(context)[0].token_mask)
    other_rank = STRATEGIES.get("clip_cov")(strategy_args(clip_cov_ratio=0.05, clip_cov_lb=-0.5, clip_cov_ub=2.0,
                                                          process_index=1))
    draws = [(original.loss_terms(context)[0].token_mask, other_rank.loss_terms(context)[0].token_mask)
             for _ in range(5)]
    assert any(not torch.equal(a, b) for a, b in draws)
