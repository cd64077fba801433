"""Archer's per-token clip bounds and KL weights (docs/methods.md §11.5) against a float64 loop reference and against
the authors' released loss on fixed inputs.

Released code read: wizard-III/ArcherCodeR at commit 8a1785beff0749a5b5b7f3d8751cd19c1d0e570a,
``verl/workers/actor/dp_actor.py`` l. 403-441 (per response, ``torch.nanquantile`` of the masked current-policy
entropies at ``token_entropy_quantile``; tokens <= the quantile are low-entropy; the KL (``low_var_kl``) averaged over
the low- and the high-entropy tokens separately, times ``kl_loss_coef`` and ``high_entropy_kl_loss_scale_coef``) and
``verl/trainer/ppo/core_algos.py`` l. 597-605 (``compute_policy_loss``: the ratio clipped to the low-entropy range on
low-entropy tokens, to the high-entropy range elsewhere). Defaults from ``scripts/train/run_archer_qwen2.5_1.5b_code.sh``
l. 11-20, 61-67. ``released_loss`` below re-derives that loss (token-mean aggregation, without the dual-clip branch
for A < 0 that TRL's loss does not have) from this reading.

The loss that applies ``LossTerms`` is wired by the loss-side interface's own change; ``ppo_loss_with_terms`` here is
the per-token clipped surrogate with per-token bounds and KL weights that it computes.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from sharpgrpo.strategies.archer import archer_token_terms, response_entropy_thresholds
from sharpgrpo.strategies.base import STRATEGIES, LossContext
from sharpgrpo.strategy_params import StrategyParams


def loop_quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, as torch.nanquantile)."""
    values = sorted(values)
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def random_batch(seed: int, rows: int = 5, length: int = 11):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    entropies = torch.rand(rows, length, generator=g) * 3
    return entropies, mask


@pytest.mark.parametrize("kl_mean", ["split", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_terms_match_loop_reference(seed, kl_mean):
    entropies, mask = random_batch(seed)
    q, low_clip, high_clip, scale = 0.8, (0.2, 0.25), (0.5, 0.6), 0.3
    eps_low, eps_high, kl_weight, high = archer_token_terms(entropies, mask, q, low_clip, high_clip, scale, kl_mean)
    rows, length = mask.shape
    is_high = {}
    for i in range(rows):
        values = [float(entropies[i, t]) for t in range(length) if mask[i, t]]
        threshold = loop_quantile(values, q)
        for t in range(length):
            if mask[i, t]:
                is_high[i, t] = float(entropies[i, t]) > threshold
    n, n_high = len(is_high), sum(is_high.values())
    for i in range(rows):
        for t in range(length):
            if not mask[i, t]:
                assert float(kl_weight[i, t]) == 0.0 and not bool(high[i, t])
                continue
            h = is_high[i, t]
            assert bool(high[i, t]) == h
            assert float(eps_low[i, t]) == pytest.approx(high_clip[0] if h else low_clip[0])
            assert float(eps_high[i, t]) == pytest.approx(high_clip[1] if h else low_clip[1])
            if kl_mean == "token":
                expected = scale if h else 1.0
            else:
                expected = scale * n / n_high if h else n / (n - n_high)
            assert float(kl_weight[i, t]) == pytest.approx(expected, rel=1e-6)


def test_threshold_is_per_response():
    entropies = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    threshold = response_entropy_thresholds(entropies, mask, 0.8)
    torch.testing.assert_close(threshold, torch.tensor([[3.2], [26.0]]))
    _, _, _, high = archer_token_terms(entropies, mask, 0.8, (0.2, 0.2), (0.5, 0.5), 0.0)
    assert high.tolist() == [[False, False, False, False, True], [False, False, True, False, False]]


def low_var_kl(logp, ref_logp):
    """verl's ``low_var_kl`` (k3, clamped to [-10, 10]); TRL's k3 is the same expression."""
    kl = ref_logp - logp
    return (torch.exp(kl) - kl - 1).clamp(-10, 10)


def released_loss(logp, old_logp, ref_logp, advantages, entropies, mask, q=0.8, low=(0.2, 0.2), high=(0.5, 0.5),
                  kl_coef=0.001, high_kl_coef=0.0):
    """ArcherCodeR's policy loss + KL loss of one micro-batch (the reading in the module docstring)."""
    m = mask.float()
    thresholds = torch.nanquantile(torch.where(mask.bool(), entropies, torch.nan), q, dim=-1, keepdim=True)
    low_set = ((entropies <= thresholds) & mask.bool()).float()
    high_set = ((entropies > thresholds) & mask.bool()).float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.where(low_set.bool(), ratio.clamp(1 - low[0], 1 + low[1]), ratio.clamp(1 - high[0], 1 + high[1]))
    pg = torch.maximum(-advantages * ratio, -advantages * clipped)
    pg_loss = (pg * m).sum() / m.sum()
    kld = low_var_kl(logp, ref_logp)
    return pg_loss + kl_coef * (kld * low_set).sum() / low_set.sum() + high_kl_coef * (kld * high_set).sum() / high_set.sum()


def ppo_loss_with_terms(logp, old_logp, ref_logp, advantages, mask, terms, beta):
    """Per-token clipped surrogate with the terms' bounds, plus beta * kl_weight * k3, averaged over the tokens."""
    m = mask.float()
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - terms.epsilon_low, 1 + terms.epsilon_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages) + beta * terms.kl_weight * low_var_kl(logp, ref_logp)
    return (per_token * m).sum() / m.sum()


def test_reproduces_the_released_loss_and_gradient_on_fixed_inputs():
    """Fixed inputs: 4 responses of up to 12 tokens (seed 11), ratios within exp(+-0.6) so both clip ranges bind,
    advantages of both signs, the released defaults (quantile 0.8, clips 0.2 / 0.5, kl_loss_coef 0.001, high-entropy
    KL coefficient 0) and, to exercise the high-entropy KL path too, a coefficient 0.0005."""
    g = torch.Generator().manual_seed(11)
    mask = (torch.arange(12)[None, :] < torch.tensor([12, 9, 5, 11])[:, None]).long()
    old_logp = -torch.rand(4, 12, generator=g, dtype=torch.float64) * 3
    logp = (old_logp + (torch.rand(4, 12, generator=g, dtype=torch.float64) - 0.5) * 1.2).requires_grad_()
    ref_logp = old_logp + (torch.rand(4, 12, generator=g, dtype=torch.float64) - 0.5) * 0.4
    advantages = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 12)
    entropies = torch.rand(4, 12, generator=g, dtype=torch.float64) * 2
    for high_kl_coef in (0.0, 0.0005):
        # archer_high_entropy_kl_scale is the released high_entropy_kl_loss_scale_coef itself (not a multiple of beta)
        params = types.SimpleNamespace(**dataclasses.asdict(StrategyParams(archer_high_entropy_kl_scale=high_kl_coef)),
                                       beta=0.001)
        context = LossContext(logp, old_logp, advantages, mask, entropies, 0.2, 0.2)
        terms, metrics = STRATEGIES.get("archer")(params).loss_terms(context)
        ours = ppo_loss_with_terms(logp, old_logp, ref_logp, advantages, mask, terms, beta=0.001)
        released = released_loss(logp, old_logp, ref_logp, advantages, entropies, mask, high_kl_coef=high_kl_coef)
        torch.testing.assert_close(ours, released, rtol=1e-12, atol=1e-12)
        grad_ours, = torch.autograd.grad(ours, logp)
        grad_released, = torch.autograd.grad(released, logp)
        torch.testing.assert_close(grad_ours, grad_released, rtol=1e-10, atol=1e-12)
        assert 0.1 < float(metrics["archer/frac_high_entropy"]) < 0.3
    # both clip ranges matter on these inputs: with the configured 0.2 everywhere the loss differs
    uniform = type(terms)(epsilon_low=torch.full_like(entropies, 0.2), epsilon_high=torch.full_like(entropies, 0.2),
                          kl_weight=terms.kl_weight)
    assert float(ppo_loss_with_terms(logp, old_logp, ref_logp, advantages, mask, uniform, 0.001)) != pytest.approx(
        float(ours), rel=1e-6)


def test_archer_warns_without_kl(tmp_path):
    from helpers import cpu_config

    with pytest.warns(UserWarning, match="archer with beta=0"):  # off-policy: only the clip ranges act
        STRATEGIES.get("archer").check_config(cpu_config(tmp_path, num_iterations=2))


def test_archer_settings_mean_what_the_released_names_say(tmp_path):
    """archer_high_entropy_kl_scale is the released coefficient used alone: > 0 needs beta > 0 (the reference model),
    TRL's default use_bias_correction_kl warns (the released KL has no ratio), and settings under which nothing
    depends on entropy are declared inert."""
    from helpers import cpu_config

    from sharpgrpo.validation import ConfigError

    archer = STRATEGIES.get("archer")
    with pytest.raises(ConfigError, match=r"archer_high_entropy_kl_scale=0.0005 with beta=0"):
        archer.check_config(cpu_config(tmp_path, archer_high_entropy_kl_scale=0.0005))
    with pytest.warns(UserWarning, match="use_bias_correction_kl=true"):
        archer.check_config(cpu_config(tmp_path, beta=0.001, use_bias_correction_kl=True))
    import warnings

    released = cpu_config(tmp_path, beta=0.001, use_bias_correction_kl=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        archer.check_config(released)
    assert archer.inert(cpu_config(tmp_path, beta=0.001)) is None  # the released defaults act
    same = dict(archer_high_entropy_clip_low=0.2, archer_high_entropy_clip_high=0.2)
    assert "nothing depends on entropy" in archer.inert(cpu_config(tmp_path, **same))
    assert archer.inert(cpu_config(tmp_path, beta=0.001, **same)) is None  # split KL means still differ by entropy
    assert "same KL coefficient" in archer.inert(cpu_config(tmp_path, beta=0.001, archer_kl_mean="token",
                                                            archer_high_entropy_kl_scale=0.001, **same))


def test_trl_delta_reproduces_the_released_dual_clip():
    """verl's dual clip (ArcherCodeR core_algos.py l. 590-611: for A < 0, min(max(-A r, -A clip(r)), -A c)) equals
    TRL's two-sided clipping -min(min(r, delta) A, clip(r) A) with delta = c, token by token, whenever c >= 1 +
    epsilon_high (the released c = 10, run_archer_qwen2.5_1.5b_code.sh l. 92)."""
    g = torch.Generator().manual_seed(5)
    ratio = torch.exp(torch.randn(4000, generator=g, dtype=torch.float64) * 1.5)  # ratios far beyond both bounds
    advantages = torch.randn(4000, generator=g, dtype=torch.float64)
    eps_low = torch.where(torch.rand(4000, generator=g) < 0.2, 0.5, 0.2).to(torch.float64)  # archer's two ranges
    eps_high = eps_low.clone()
    clipped = torch.minimum(torch.maximum(ratio, 1 - eps_low), 1 + eps_high)
    c = 10.0
    released_1 = torch.maximum(-advantages * ratio, -advantages * clipped)
    released = torch.where(advantages < 0, torch.minimum(-advantages * c, released_1), released_1)
    trl = -torch.minimum(torch.clamp(ratio, max=c) * advantages, clipped * advantages)
    torch.testing.assert_close(trl, released, rtol=0, atol=0)
    assert bool(((advantages < 0) & (ratio > c)).any())  # the dual clip binds on these inputs
