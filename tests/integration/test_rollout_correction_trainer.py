"""The rollout correction through ``SharpGRPOTrainer`` itself: the generation-time token count of the window-normalised
loss types (``recount_window_tokens``) and ``_compute_loss`` on the tiny model, against verl 0.9.1's released loss.

The trainer is built without vLLM (the default test venv has none) and given the correction's strategy set from a
config that names it (``use_vllm=True`` in that config: what the strategies read); the batch carries sampling
log-probabilities as vLLM's would be (the trainer's own plus noise, NaN on padding). Everything after is the trainer's
own path: ``_generate_and_score_completions``' recount (old log-probabilities by the trainer's forward, stored for the
loss), then ``_compute_loss``'s forward, ``LossSettings.from_trainer`` and ``policy_loss``, and the gradient on the
model's parameters. verl's side: ``compute_rollout_correction_and_rejection_mask`` then ``compute_policy_loss_vanilla``
with ``agg_loss``'s ``token-mean`` over ``batch_num_tokens`` = the rejected mask's tokens (its engine's count), on the
same forward's log-probabilities. The real vLLM path runs in tests/with_vllm (the CI's vLLM venv).
"""

from __future__ import annotations

import pytest
import torch
from helpers import cpu_config, make_trainer

from sharpgrpo.training.generation.window_tokens import recount_window_tokens
from sharpgrpo.training.strategy_set import StrategySet

pytestmark = pytest.mark.slow
B, PROMPT, T = 8, 5, 6
SETTINGS = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4")


def inputs_for(trainer, seed):
    generator = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    completion_mask = torch.ones(B, T, dtype=torch.long)
    for row, length in enumerate(torch.randint(2, T + 1, (B,), generator=generator).tolist()):
        completion_mask[row, length:] = 0
    inputs = {"prompt_ids": torch.randint(0, vocab, (B, PROMPT), generator=generator),
              "prompt_mask": torch.ones(B, PROMPT, dtype=torch.long),
              "completion_ids": torch.randint(0, vocab, (B, T), generator=generator),
              "completion_mask": completion_mask, "advantages": torch.randn(B, generator=generator),
              "num_items_in_batch": completion_mask.sum()}
    with torch.no_grad():
        logps = trainer._sampling_logps(inputs)
    sampling = logps + 0.4 * torch.randn(B, T, generator=generator)
    inputs["sampling_per_token_logps"] = sampling.masked_fill(completion_mask == 0, float("nan"))
    return inputs


def test_trainer_loss_and_parameter_gradients_equal_verls(tiny_model_path, tmp_path):
    core = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl's released code is not installed")
    helper = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    from omegaconf import OmegaConf

    strategy_args = cpu_config(tmp_path, strategies=["rollout_correction"], use_vllm=True,  # built first: a
                               vllm_importance_sampling_correction=False, loss_type="dapo", **SETTINGS)  # config
    args = cpu_config(tmp_path, loss_type="dapo", per_device_train_batch_size=B, num_generations=4,  # resets
                      max_completion_length=T, epsilon_high=0.28)  # accelerate's state, the trainer sets it up
    trainer = make_trainer(tiny_model_path, args)
    trainer.model.train()
    trainer.strategies = StrategySet(strategy_args)
    inputs = inputs_for(trainer, seed=0)
    before = int(inputs["num_items_in_batch"])
    inputs = recount_window_tokens(trainer, inputs)  # what generate_batch runs in _generate_and_score_completions
    old = inputs["old_per_token_logps"]
    filled = torch.where(torch.isnan(inputs["sampling_per_token_logps"]), old, inputs["sampling_per_token_logps"])
    proto, kept, _ = helper.compute_rollout_correction_and_rejection_mask(
        old, filled, inputs["completion_mask"].float(), rollout_is="token", rollout_is_threshold=2.0,
        rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4")
    assert int(inputs["num_items_in_batch"]) == int(kept.sum()) < before  # verl's batch_num_tokens after rejection

    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    ours = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}

    trainer.model.zero_grad()
    logps = trainer._sampling_logps(inputs)  # the same forward, with its graph
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                               "global_batch_info": {"dp_size": 1, "batch_num_tokens": float(kept.sum()),
                                                     "global_batch_size": B, "loss_scale_factor": None}})
    advantages = inputs["advantages"][:, None].expand(B, T)
    verl_loss, _ = core.compute_policy_loss_vanilla(old, logps, advantages, kept.bool(), "token-mean", config,
                                                    rollout_is_weights=proto.batch["rollout_is_weights"])
    verl_loss.backward()
    torch.testing.assert_close(loss.detach(), verl_loss.detach(), rtol=1e-5, atol=1e-7)
    assert ours.keys() and all(trainer.model.get_parameter(n).grad is not None for n in ours)
    for name, grad in ours.items():
        torch.testing.assert_close(grad, trainer.model.get_parameter(name).grad, rtol=1e-4, atol=1e-7, msg=name)
    assert any(float(g.abs().max()) > 0 for g in ours.values())
