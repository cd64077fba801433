"""The rollout correction's *aggregated* loss and its gradient against verl's, run unchanged on the same inputs.

tests/strategies/test_rollout_correction.py compares verl's weights and masks; this file compares what a user trains
on: the scalar loss of ``policy_loss`` (the one function ``SharpGRPOTrainer._compute_loss`` calls) and of the
trainer's ``_compute_loss`` itself, and their gradients, with verl 0.9.1's released loss path:

* decoupled mode: ``rollout_corr_helper.compute_rollout_correction_and_rejection_mask`` (the body of
  ``compute_rollout_correction_and_add_to_batch``, lines 786-901 and 1015-1075: rejection *replaces*
  ``response_mask``), then ``core_algos.compute_policy_loss_vanilla`` (lines 1286-1380: PPO clip, dual clip with
  ``clip_ratio_c``, ``pg_losses * rollout_is_weights``) aggregated by ``core_algos.agg_loss`` over the new mask;
* bypass mode: ``core_algos.compute_policy_loss_bypass_mode`` (lines 2414-2545, ``loss_type="ppo_clip"``: rejection
  on pi_theta / pi_rollout inside the loss, vanilla PPO on pi_theta / pi_rollout over the reduced mask).

TRL's loss types map to verl's ``loss_agg_mode`` as verl's engine calls ``agg_loss`` (``workers/utils/losses.py``
``ppo_loss``: ``dp_size``, ``batch_num_tokens`` = the mini-batch's ``loss_mask`` tokens, ``global_batch_size`` = its
sequences): ``grpo`` = ``seq-mean-token-mean``; ``dr_grpo`` = ``seq-mean-token-sum-norm`` with ``loss_scale_factor``
= ``max_completion_length``; ``luspo`` = ``seq-mean-token-sum``; ``dapo`` = ``token-mean`` with the engine's global
``batch_num_tokens`` (TRL's ``num_items_in_batch``, recounted after a decoupled rejection by
``training/generation/window_tokens.py``; before it in bypass mode, where verl's engine counts the mask it was given);
``bnpo`` = ``token-mean`` without global information (verl's own default: the tokens of the mask it aggregates).

Controls: ``rollout_rs_normalizer: kept`` (rejected tokens stay in the normaliser, the former behaviour) and the
dual clip turned off give a different loss on the same inputs, so each comparison can fail.
"""

from __future__ import annotations

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.training.loss.policy_loss import LossBatch, LossSettings, policy_loss
from sharpgrpo.training.strategy_set import StrategySet

D = torch.float64
VERL_MISSING = "verl's released code is not installed: see docs/development.md, the verl reference line"
AGGREGATION = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
               "dr_grpo": "seq-mean-token-sum-norm", "luspo": "seq-mean-token-sum"}
ROWS, LENGTH = 8, 11


@pytest.fixture(scope="module")
def verl():
    core = pytest.importorskip("verl.trainer.ppo.core_algos", reason=VERL_MISSING)
    helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason=VERL_MISSING)
    return core, helper


def correction_args(tmp_path, mode, loss_type, **settings):
    name = "rollout_correction" if mode == "decoupled" else "rollout_correction_bypass"
    return cpu_config(tmp_path, strategies=[name], use_vllm=True, vllm_importance_sampling_correction=False,
                      loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, beta=0.0, max_completion_length=LENGTH,
                      **settings)


def batch(seed, spread=0.35):
    """float64 (logps, old, rollout, mask, advantages (B,)): ragged rows, one of one token, rollout far enough
    from the trainer for the bounds to reject, old far enough from logps for some ratios to pass the dual clip."""
    generator = torch.Generator().manual_seed(seed)
    logps = torch.log_softmax(torch.randn(ROWS, LENGTH, 7, generator=generator, dtype=D), -1)[..., 0]
    old = logps + 0.6 * torch.randn(ROWS, LENGTH, generator=generator, dtype=D)
    rollout = old + spread * torch.randn(ROWS, LENGTH, generator=generator, dtype=D)
    lengths = torch.randint(2, LENGTH + 1, (ROWS,), generator=generator)
    lengths[0] = 1
    mask = (torch.arange(LENGTH) < lengths[:, None]).to(D)
    advantages = torch.randn(ROWS, generator=generator, dtype=D)
    return logps, old, rollout.masked_fill(mask == 0, float("nan")), mask, advantages


def ours(args, logps, old, rollout, mask, advantages, num_items=None):
    """The loss and d loss / d logps of ``policy_loss`` with the configured strategy set (one micro-batch, one
    process; the Accelerator is made after the config, whose construction resets accelerate's state)."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    theta = logps.clone().requires_grad_()
    result = policy_loss(
        LossBatch(theta, torch.zeros_like(theta), mask, advantages, old_logps=old, sampling_logps=rollout,
                  num_items_in_batch=mask.sum() if num_items is None else num_items),
        StrategySet(args), LossSettings(loss_type=args.loss_type, epsilon_low=0.2, epsilon_high=0.28,
                                        max_completion_length=LENGTH), accelerator)
    (gradient,) = torch.autograd.grad(result.loss, theta)
    return result.loss.detach(), gradient, result


def verl_config(mode, args, loss_mask):
    from omegaconf import OmegaConf

    info = {"dp_size": 1, "global_batch_size": ROWS, "loss_scale_factor": LENGTH,
            "batch_num_tokens": float(loss_mask.sum()) if args.loss_type == "dapo" else None}
    if args.loss_type == "bnpo":
        info["batch_num_tokens"] = None  # verl's token-mean over the mask it aggregates
    correction = {"loss_type": "ppo_clip", "rollout_is": None, "rollout_is_threshold": args.rollout_is_threshold,
                  "rollout_rs": None if args.rollout_rs == "none" else args.rollout_rs,
                  "rollout_rs_threshold": args.rollout_rs_threshold}
    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                             "clip_ratio_c": args.rollout_clip_ratio_c, "global_batch_info": info,
                             "policy_loss": {"rollout_correction": correction if mode == "bypass" else None}})


def theirs(verl, mode, args, logps, old, rollout, mask, advantages):
    """verl's loss and d loss / d logps on the same tensors, its functions unchanged."""
    core, helper = verl
    theta = logps.clone().requires_grad_()
    token_advantages = advantages[:, None].expand_as(mask).contiguous()
    response_mask = mask.bool()
    filled = torch.where(torch.isnan(rollout), old, rollout)  # a padded NaN never reaches a loss token
    agg = AGGREGATION[args.loss_type]
    if mode == "decoupled":
        proto, response_mask, _ = helper.compute_rollout_correction_and_rejection_mask(
            old, filled, mask, rollout_is=None if args.rollout_is == "none" else args.rollout_is,
            rollout_is_threshold=args.rollout_is_threshold, rollout_rs=None if args.rollout_rs == "none"
            else args.rollout_rs, rollout_rs_threshold=args.rollout_rs_threshold)
        weights = None if proto is None else proto.batch["rollout_is_weights"]
        config = verl_config(mode, args, response_mask)
        loss, _ = core.compute_policy_loss_vanilla(old, theta, token_advantages, response_mask.bool(), agg, config,
                                                   rollout_is_weights=weights)
    else:
        config = verl_config(mode, args, mask)
        loss, _ = core.compute_policy_loss_bypass_mode(filled, theta, token_advantages, response_mask, agg, config)
        if args.rollout_rs != "none":  # the mask it trained on (computed inside its loss), for the assertions
            _, response_mask, _ = helper.compute_rollout_correction_and_rejection_mask(
                logps, filled, mask, rollout_rs=args.rollout_rs, rollout_rs_threshold=args.rollout_rs_threshold)
    (gradient,) = torch.autograd.grad(loss, theta)
    return loss.detach(), gradient, response_mask


def assert_equal_losses(a, b, tol=1e-9):
    (loss_a, grad_a), (loss_b, grad_b) = a, b
    torch.testing.assert_close(loss_a, loss_b.to(loss_a.dtype), rtol=tol, atol=tol)
    torch.testing.assert_close(grad_a, grad_b.to(grad_a.dtype), rtol=tol, atol=tol)


DECOUPLED = [
    dict(rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),  # decoupled_seq_is_rs
    dict(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4"),
    dict(rollout_is="none", rollout_rs="seq_mean_k3", rollout_rs_threshold="0.05"),  # a k3_rs preset's shape
    dict(rollout_is="token", rollout_rs="token_k2,seq_max_k3", rollout_rs_threshold="0.05,0.3"),
]
BYPASS = [  # a dual-clip bound of 1.5 (verl takes any above 1) binds on tokens the rejection keeps
    dict(rollout_rs="seq_mean_k1", rollout_rs_threshold="0.8_1.25", rollout_clip_ratio_c=1.5),  # geo_rs's shape
    dict(rollout_rs="token_k1", rollout_rs_threshold="0.3_3.0", rollout_clip_ratio_c=1.5),
    dict(rollout_rs="none"),  # bypass_ppo_clip: no rejection, verl's default dual clip (3) acts
]


@pytest.mark.parametrize("loss_type", list(AGGREGATION))
@pytest.mark.parametrize("settings", DECOUPLED)
@pytest.mark.parametrize("seed", [0, 1])
def test_decoupled_loss_and_gradient_equal_verls(verl, tmp_path, loss_type, settings, seed):
    logps, old, rollout, mask, advantages = batch(seed)
    args = correction_args(tmp_path, "decoupled", loss_type, **settings)
    verl_loss, verl_grad, kept = theirs(verl, "decoupled", args, logps, old, rollout, mask, advantages)
    assert 0 < kept.sum() < mask.sum()  # the rejection acts on these inputs
    loss, grad, result = ours(args, logps, old, rollout, mask, advantages, num_items=kept.sum())
    assert_equal_losses((loss, grad), (verl_loss, verl_grad))
    assert torch.equal(result.tensors.loss_mask, kept.to(D))  # the mask the loss aggregated over is verl's
    kept_args = correction_args(tmp_path, "decoupled", loss_type, rollout_rs_normalizer="kept", **settings)
    control, _, _ = ours(kept_args, logps, old, rollout, mask, advantages, num_items=mask.sum())
    # Keeping rejected tokens in the normaliser changes the loss exactly where a normaliser counts tokens: the
    # batch's (bnpo, dapo) or a partly rejected sequence's (grpo); dr_grpo and luspo divide by constants.
    partly = ((kept.sum(-1) > 0) & (kept.sum(-1) < mask.sum(-1))).any()
    counts_tokens = loss_type in ("bnpo", "dapo") or (loss_type == "grpo" and partly)
    assert torch.allclose(control, verl_loss, rtol=1e-9, atol=0) != counts_tokens


@pytest.mark.parametrize("loss_type", list(AGGREGATION))
@pytest.mark.parametrize("settings", BYPASS)
@pytest.mark.parametrize("seed", [0, 1])
def test_bypass_loss_and_gradient_equal_verls(verl, tmp_path, loss_type, settings, seed):
    """verl's bypass rejects on pi_theta / pi_rollout and keeps its dual clip on that ratio; old != logps here
    (num_iterations > 1), so the statistic of pi_old / pi_rollout would reject other tokens."""
    logps, old, rollout, mask, advantages = batch(seed)
    args = correction_args(tmp_path, "bypass", loss_type, **settings)
    verl_loss, verl_grad, kept = theirs(verl, "bypass", args, logps, old, rollout, mask, advantages)
    loss, grad, _ = ours(args, logps, old, rollout, mask, advantages)
    assert_equal_losses((loss, grad), (verl_loss, verl_grad))
    ratio = torch.exp(logps - torch.where(torch.isnan(rollout), old, rollout))
    capped = (advantages[:, None] < 0) & (ratio > args.rollout_clip_ratio_c) & kept.bool()
    assert capped.any()  # the dual clip binds on tokens the loss keeps
    if args.rollout_rs != "none":
        assert 0 < kept.sum() < mask.sum()  # and the rejection acts
    no_dual_clip = correction_args(tmp_path, "bypass", loss_type, **{**settings, "rollout_clip_ratio_c": 0.0})
    control, _, _ = ours(no_dual_clip, logps, old, rollout, mask, advantages)
    assert not torch.allclose(control, verl_loss, rtol=1e-6, atol=0)


def test_a_nan_sampling_logp_leaves_its_token_uncorrected_as_trls_correction_does(tmp_path):
    """TRL 1.16 reads a NaN sampling log-probability as a log-ratio of 0 (ratio exactly 1): the loss with one NaN
    equals the loss where that token's sampling log-probability is the trainer's own; reading NaN as 0 (the former
    behaviour) gave that token the weight exp(log p_old), and a different loss."""
    logps, old, rollout, mask, advantages = batch(3, spread=0.1)
    args = correction_args(tmp_path, "decoupled", "grpo", rollout_is="token", rollout_is_threshold=5.0)
    holed = rollout.clone()
    holed[2, 1] = float("nan")
    filled = rollout.clone()
    filled[2, 1] = old[2, 1]
    loss, grad, _ = ours(args, logps, old, holed, mask, advantages)
    expected, expected_grad, _ = ours(args, logps, old, filled, mask, advantages)
    assert_equal_losses((loss, grad), (expected, expected_grad), tol=1e-12)
    as_zero = rollout.clone()
    as_zero[2, 1] = 0.0
    control, _, _ = ours(args, logps, old, as_zero, mask, advantages)
    assert not torch.allclose(control, loss)


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_loss_types_without_a_verl_counterpart_drop_rejected_tokens_as_padding(tmp_path, loss_type):
    """Where verl has no such loss, the rule is the same one: a rejected token counts as padding. The loss equals
    the same correction without rejection on a batch whose mask lacks the rejected tokens (float64, 1e-12)."""
    logps, old, rollout, mask, advantages = batch(4)
    settings = dict(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4", rollout_clip_ratio_c=0)
    args = correction_args(tmp_path, "decoupled", loss_type, **settings)
    loss, grad, result = ours(args, logps, old, rollout, mask, advantages)
    kept = result.tensors.loss_mask
    assert 0 < kept.sum() < mask.sum()
    plain = correction_args(tmp_path, "decoupled", loss_type, **{**settings, "rollout_rs": "none"})
    expected, expected_grad, _ = ours(plain, logps, old, rollout, kept, advantages,
                                      num_items=mask.sum())
    assert_equal_losses((loss, grad), (expected, expected_grad), tol=1e-12)
