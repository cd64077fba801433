"""The registered rollout-correction strategies (``rollout_correction``: decoupled; ``rollout_correction_bypass``) as
loss-side adapters of sharpgrpo/strategies/rollout_correction.py, and their config refusals.

* decoupled: the token factor is the weights of pi_old / pi_rollout times the rejection mask, the functions' own
  (which tests/strategies/test_rollout_correction.py checks against verl's released helper);
* bypass: with the factor and per-token clip range it sets, TRL's PPO-clip surrogate on r = pi_theta / pi_old equals
  the PPO-clip surrogate on pi_theta / pi_rollout (verl's bypass mode) in value and gradient, float64;
* TRL's four ``vllm_importance_sampling_mode``s are the family's token/sequence x truncate/mask weights (TRL 1.16's
  ``_generate_and_score_completions``, trl/trainer/grpo_trainer.py lines 2660-2707 of the installed 1.16.0, written
  out here as a float64 loop).
"""

from __future__ import annotations

import math
from dataclasses import fields
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies import STRATEGIES, LossContext
from sharpgrpo.strategies import rollout_correction as rc
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.training.loss.surrogates import policy_surrogate
from sharpgrpo.training.loss.terms import apply_token_terms, clip_range

D = torch.float64


def strategy_args(**overrides):
    values = {f.name: f.default for f in fields(StrategyParams)}
    return SimpleNamespace(**{**values, "loss_type": "grpo", "seed": 0, "process_index": 0, **overrides})


def inputs(seed=0, rows=5, length=7, spread=0.3):
    generator = torch.Generator().manual_seed(seed)
    logps = torch.log_softmax(torch.randn(rows, length, 9, generator=generator, dtype=D), -1)[..., 0]
    old = logps + 0.1 * torch.randn(rows, length, generator=generator, dtype=D)
    rollout = old + spread * torch.randn(rows, length, generator=generator, dtype=D)
    lengths = torch.randint(2, length + 1, (rows,), generator=generator)
    mask = (torch.arange(length) < lengths[:, None]).to(D)
    advantages = torch.randn(rows, 1, generator=generator, dtype=D)
    rollout = rollout.masked_fill(mask == 0, float("nan"))  # TRL pads vLLM's log-probabilities; NaN must not leak
    return logps, old, rollout, mask, advantages


@pytest.mark.parametrize("settings", [
    dict(), dict(rollout_is="token", rollout_is_threshold=1.2),
    dict(rollout_is="geometric", rollout_is_handling="mask", rollout_is_threshold=1.1),
    dict(rollout_is="none", rollout_rs="seq_mean_k3", rollout_rs_threshold="0.01"),
    dict(rollout_is="sequence", rollout_rs="token_k1,seq_max_k2", rollout_rs_threshold="0.8_1.25,0.05",
         rollout_is_batch_normalize=True),
])
def test_decoupled_factor_is_the_functions_weights_times_rejection(settings):
    logps, old, rollout, mask, advantages = inputs()
    args = strategy_args(**settings)
    terms, metrics = STRATEGIES.get("rollout_correction")(args).loss_terms(
        LossContext(logps.requires_grad_(), old, advantages, mask, None, 0.2, 0.2, None, rollout))
    log_r = (old - torch.nan_to_num(rollout)) * mask
    expected = mask.clone()
    if args.rollout_rs != "none":
        expected = rc.rejection_mask(log_r, mask, args.rollout_rs, args.rollout_rs_threshold)
    if args.rollout_is != "none":
        expected = expected * rc.importance_weights(log_r, mask, args.rollout_is, args.rollout_is_threshold,
                                                    args.rollout_is_handling, args.rollout_is_batch_normalize)
    factor = (mask if terms.token_mask is None else terms.token_mask) * mask
    if terms.loss_mask is not None:  # rejection: out of the loss and its normaliser (verl's response_mask)
        factor = factor * terms.loss_mask
    torch.testing.assert_close(factor, expected, rtol=1e-12, atol=1e-12)
    assert (terms.loss_mask is not None) == (args.rollout_rs != "none")  # excluded: the rejection is the loss mask
    assert (terms.token_mask is not None) == (args.rollout_is != "none")  # the weights alone are the factor
    assert terms.epsilon_low is None and not any(t.requires_grad for t in (terms.token_mask, terms.loss_mask)
                                                 if t is not None)
    assert all(torch.isfinite(v) for v in metrics.values())
    assert metrics["rollout_corr/kl"] == pytest.approx(float(rc.mismatch_diagnostics(old, torch.nan_to_num(rollout),
                                                                                      mask)["kl"]), rel=1e-9)
    assert not torch.equal(factor, mask)  # the inputs differ enough for the factor to act


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_bypass_equals_ppo_clip_on_the_rollout_ratio(seed, loss_type):
    logps, old, rollout, mask, advantages = inputs(seed)
    args = strategy_args(loss_type=loss_type, rollout_rs="seq_sum_k1", rollout_rs_threshold="0.3_3",
                         rollout_clip_ratio_c=0.0)  # the dual clip: tests/strategies/test_rollout_correction_loss.py
    ours = logps.clone().requires_grad_()
    terms, _ = STRATEGIES.get("rollout_correction_bypass")(args).loss_terms(
        LossContext(ours, old, advantages, mask, None, 0.2, 0.28, None, rollout))
    low, high = clip_range(terms, 0.2, 0.28)
    loss = apply_token_terms(policy_surrogate(loss_type, torch.exp(ours - old), advantages, ours, epsilon_low=low,
                                              epsilon_high=high), terms) * terms.loss_mask
    theirs = logps.clone().requires_grad_()
    # verl's bypass rejects on pi_theta / pi_rollout (compute_policy_loss_bypass_mode: old_log_prob=log_prob)
    keep = rc.rejection_mask((logps - torch.nan_to_num(rollout)) * mask, mask, "seq_sum_k1", "0.3_3")
    direct = policy_surrogate(loss_type, torch.exp(theirs - torch.nan_to_num(rollout)), advantages, theirs,
                              epsilon_low=0.2, epsilon_high=0.28) * keep  # PPO on pi_theta / pi_rollout
    torch.testing.assert_close(loss * mask, direct * mask, rtol=1e-10, atol=1e-12)
    (loss * mask).sum().backward()
    (direct * mask).sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-10, atol=1e-12)
    on_old = policy_surrogate(loss_type, torch.exp(logps - old), advantages, logps, epsilon_low=0.2,
                              epsilon_high=0.28)
    assert not torch.allclose(on_old * mask, direct * mask)  # control: the rollout ratio is not pi_old's
    assert 0 < keep[mask.bool()].sum() < mask.sum() or seed != 0  # seed 0 exercises the rejection


def trl_importance_ratio(old, sampling, mask, mode, cap):
    """TRL 1.16's vLLM importance-sampling ratio (grpo_trainer.py lines 2660-2707), float64 loops, clip_min None."""
    out = torch.zeros_like(old)
    for i in range(old.shape[0]):
        diffs = [float(old[i, t] - sampling[i, t]) * float(mask[i, t]) for t in range(old.shape[1])]
        diffs = [0.0 if math.isnan(d) else d for d in diffs]
        for t in range(old.shape[1]):
            ratio = math.exp(sum(diffs)) if mode.startswith("sequence") else math.exp(diffs[t])
            out[i, t] = min(ratio, cap) if mode.endswith("truncate") else (0.0 if ratio > cap else ratio)
    return out


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_trls_four_modes_are_members_of_the_family(mode):
    _, old, rollout, mask, _ = inputs(3, spread=0.4)
    level, handling = mode.split("_")
    ours = rc.importance_weights((old - torch.nan_to_num(rollout)) * mask, mask, level, 1.5, handling)
    expected = trl_importance_ratio(old, torch.nan_to_num(rollout), mask, mode, 1.5)
    torch.testing.assert_close(ours * mask, expected * mask, rtol=1e-12, atol=1e-12)
    valid = expected[mask.bool()]
    assert (valid != 1.5).any() and ((valid == 1.5) | (valid == 0)).any()  # the cap is exercised


@pytest.mark.parametrize("overrides, setting", [
    (dict(use_vllm=False), "use_vllm=True"),
    (dict(use_vllm=True), "vllm_importance_sampling_correction=false"),
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, top_p=0.7), "set top_k"),  # kept set unbounded
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, top_k=50), "top_k=50"),  # over max_logprobs
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, top_k=5, vllm_mode="server"), "vLLM server"),
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, rollout_rs="seq_max_k1",
          rollout_rs_threshold="2"), "rollout_rs="),
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, rollout_rs="token_k2"), "rollout_rs_threshold"),
    (dict(use_vllm=True, vllm_importance_sampling_correction=False, rollout_is="tokens"), "rollout_is"),
])
def test_bad_settings_are_refused_at_config_time(overrides, setting, tmp_path):
    from helpers import cpu_config

    from sharpgrpo.validation import ConfigError

    with pytest.raises(ConfigError) as error:
        cpu_config(tmp_path, strategies=["rollout_correction"], **overrides)
    assert setting in str(error.value) and "\n" not in str(error.value)


def test_truncated_sampling_passes_where_vllms_kept_sets_are_replayed(tmp_path):
    from helpers import cpu_config

    args = cpu_config(tmp_path, strategies=["rollout_correction"], use_vllm=True, vllm_mode="colocate",
                      vllm_importance_sampling_correction=False, top_k=5, top_p=0.7)
    assert rc.replays_kept_sets(args) and rc.kept_set_problem(args) is None
    args = cpu_config(tmp_path, strategies=["rollout_correction"], use_vllm=True, vllm_mode="colocate",
                      vllm_importance_sampling_correction=False, generation_kwargs={"top_k": 8, "min_p": 0.05})
    assert rc.replays_kept_sets(args)
    assert not rc.replays_kept_sets(cpu_config(tmp_path, use_vllm=True, vllm_mode="colocate"))  # nothing truncated


def test_a_valid_setting_passes_and_composes_with_a_weight_strategy(tmp_path):
    from helpers import cpu_config

    args = cpu_config(tmp_path, strategies=["grpo_sg", "rollout_correction"], use_vllm=True,
                      vllm_importance_sampling_correction=False, rollout_rs="seq_mean_k1",
                      rollout_rs_threshold="0.999_1.001")
    assert args.strategies == ["grpo_sg", "rollout_correction"]
