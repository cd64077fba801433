"""The truncated-support bias of the vLLM importance ratio (trl#6789), on real vLLM output, and its replay.

With top-k / top-p / min-p sampling, vLLM reports each sampled token's log-probability under the renormalised
truncated distribution (TRL starts the engine with ``logprobs_mode="processed_logprobs"``), ``log q = log p - log S``;
the trainer recomputes ``log p`` over the whole vocabulary. The log of TRL's importance ratio is then ``log S`` on
every token, not a policy difference. ``sharpgrpo.strategies.rollout_correction.truncated_support_logps`` replays the
truncation on the trainer's logits and gets vLLM's numbers back.
"""

from __future__ import annotations

import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config
from vllm_marks import NEEDS_VLLM

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.strategies.rollout_correction import truncated_support, truncated_support_logps
from sharpgrpo.training.generation.vllm_outputs import engine_outputs

pytestmark = NEEDS_VLLM

TOLERANCE = 2e-3  # float32 engine and trainer (measured: about 1e-5)


@pytest.mark.parametrize("sampling", [dict(top_k=5), dict(top_p=0.7), dict(top_k=12, top_p=0.9, min_p=0.05)])
def test_truncated_vllm_logps_carry_log_kept_mass_and_replay_recovers_them(sampling, tiny_vllm_model, shared_engine,
                                                                           tmp_path):
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", temperature=0.9,
                       vllm_importance_sampling_correction=True, **sampling)
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    mask = output["completion_mask"].bool()
    vllm_logps = output["sampling_per_token_logps"]  # vLLM's own (processed: truncated, renormalised)
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    width = output["completion_ids"].shape[1]
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1]
    full = torch.log_softmax(logits.float() / 0.9, dim=-1).gather(-1, output["completion_ids"][..., None])[..., 0]
    replayed, log_kept = truncated_support_logps(logits, output["completion_ids"], 0.9, sampling.get("top_k", 0),
                                                 sampling.get("top_p", 1.0), sampling.get("min_p", 0.0))
    bias = (full - vllm_logps)[mask]
    print(sampling, "mean log ratio", bias.mean().item(), "mean log S", log_kept[mask].mean().item())
    assert bias.mean() < -0.05  # TRL's ratio exp(full - vLLM) is S < 1, a bias, not a policy change
    assert (bias - log_kept[mask]).abs().max() < TOLERANCE  # ... and it is log S, token by token
    assert (replayed[mask] - vllm_logps[mask]).abs().max() < TOLERANCE  # the replay gives vLLM's log q back
    # TRL's own: with top-k on, on vLLM's kept sets (replayed, sharpgrpo.training.generation.kept_sets), else log p
    trls = replayed if sampling.get("top_k") else full
    torch.testing.assert_close(output["old_per_token_logps"][mask], trls[mask], atol=TOLERANCE, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling-mask replay (sharpgrpo.training.generation.kept_sets): vLLM's own kept sets on the trainer's logits
# ---------------------------------------------------------------------------------------------------------------------
REPLAYED = dict(top_k=5, top_p=0.7)


def _kept_set_reader(trainer):
    from sharpgrpo.training.generation.kept_sets import READER

    return engine_outputs(trainer.vllm_generation).readers[READER]


def test_replayed_kept_sets_make_the_vllm_ratio_unbiased(tiny_vllm_model, shared_engine, tmp_path):
    """top_p 0.7, top_k 5: TRL's old log-probabilities (log q on vLLM's kept sets, replayed) against vLLM's: the mean
    log ratio is about 0; the full-vocabulary log p of the same tokens (what TRL computed before) is off by log S.
    The reference model (beta > 0, still equal to the policy) is scored on the same kept sets."""
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", temperature=0.9, beta=0.04,
                       vllm_importance_sampling_correction=True, **REPLAYED)
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    mask = output["completion_mask"].bool()
    vllm_logps = output["sampling_per_token_logps"]
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    width = output["completion_ids"].shape[1]
    with torch.no_grad():  # the plain forward (no fused head): not replayed
        logits = trainer.model(input_ids=ids, attention_mask=attention).logits[:, -width - 1:-1]
    full = torch.log_softmax(logits.float() / 0.9, dim=-1).gather(-1, output["completion_ids"][..., None])[..., 0]
    with_replay = (output["old_per_token_logps"] - vllm_logps)[mask].mean().item()
    without_replay = (full - vllm_logps)[mask].mean().item()
    print(f"top_k=5, top_p=0.7: mean log ratio with replay {with_replay:.2e}, without {without_replay:.4f}")
    assert abs(with_replay) < 0.01
    assert without_replay < -0.1  # the bias replay removes (measured -0.25 to -0.30 on this model)
    assert (output["old_per_token_logps"] - vllm_logps)[mask].abs().max() < TOLERANCE  # token by token
    assert (output["ref_per_token_logps"] - vllm_logps)[mask].abs().max() < TOLERANCE  # the reference model too

    # the engine-output seam kept the batch's RequestOutputs (what a reader of routed experts would read too)
    last = engine_outputs(trainer.vllm_generation).last
    assert [list(request.outputs[0].token_ids) for request in last] == [
        row[row_mask].tolist() for row, row_mask in zip(output["completion_ids"], mask, strict=True)]
    assert all(len(position) == 1 for request in last for position in request.outputs[0].logprobs)  # as TRL asked

    # vLLM's kept sets equal the ones recomputed from the sampling parameters on the trainer's logits (float64),
    # wherever the float64 decision is not within rounding of a boundary (there the two may fall either side)
    kept = _kept_set_reader(trainer).kept_ids(ids, attention)[:, -width:]
    scaled = logits.double() / 0.9
    reference = truncated_support(logits.double(), 0.9, **REPLAYED)
    top = scaled.topk(6, dim=-1).values
    probs = torch.softmax(scaled.topk(5, dim=-1).values, dim=-1).flip(-1).cumsum(-1)  # ascending, as vLLM sums
    ambiguous = ((top[..., 4] - top[..., 5]) < 1e-4) | ((probs - 0.3).abs() < 1e-4).any(-1)
    vllm_sets = torch.zeros_like(reference).scatter_(-1, kept.clamp_min(0), kept >= 0)
    clear = mask & ~ambiguous
    assert clear.sum() > 0.9 * mask.sum()
    assert torch.equal(vllm_sets[clear], reference[clear])
    assert (vllm_sets[mask].sum(-1) < 5).any()  # top-p cut below top-k somewhere: a case top-k alone would miss


def test_rollout_correction_trains_with_truncated_sampling(tiny_vllm_model, shared_engine, tmp_path):
    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", max_steps=2, temperature=0.9,
                       strategies=["rollout_correction"], vllm_importance_sampling_correction=False, **REPLAYED)
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[binary_letters_reward])
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and trainer._last_loaded_step == 1
    for entry in logs:  # pi_old and pi_rollout on the same kept sets: no mismatch (log S is about 0.27 here)
        assert abs(entry["rollout_corr/kl"]) < 1e-3, entry
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


def test_a_kept_set_without_its_sampled_token_is_refused():
    from vllm.outputs import CompletionOutput, SamplingMask

    from sharpgrpo.training.generation.kept_sets import completion_kept_ids

    good = CompletionOutput(index=0, text="", token_ids=[3, 7], cumulative_logprob=None, logprobs=None,
                            sampling_mask=SamplingMask([[3, 4], [7]]))
    assert completion_kept_ids(good).tolist() == [[3, 4], [7, -1]]
    bad = CompletionOutput(index=0, text="", token_ids=[3, 7], cumulative_logprob=None, logprobs=None,
                           sampling_mask=SamplingMask([[3, 4], [8]]))
    with pytest.raises(ValueError, match="does not hold the sampled token 7"):
        completion_kept_ids(bad)


def test_replay_covers_a_lora_policy_and_its_reference(tiny_vllm_model, shared_engine, tmp_path):
    """LoRA with beta > 0: the reference is the base model (adapter disabled, the same forward), so at the first
    generation (the adapter's B = 0) TRL's old and reference log-probabilities both equal vLLM's on the kept sets; then
    rollout_correction_bypass trains 2 steps with finite metrics."""
    import math

    from peft import LoraConfig
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer

    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", max_steps=2, temperature=0.9, beta=0.04,
                       strategies=["rollout_correction_bypass"], vllm_importance_sampling_correction=False,
                       loss_type="grpo", **REPLAYED)
    trainer = SharpGRPOTrainer(model=tiny_vllm_model, reward_funcs=[binary_letters_reward], args=args,
                               train_dataset=demo_dataset(64), processing_class=AutoTokenizer.from_pretrained(
                                   tiny_vllm_model),
                               peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    trainer.model.train()
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    mask = output["completion_mask"].bool()
    vllm_logps = output["sampling_per_token_logps"]
    assert (output["ref_per_token_logps"] - vllm_logps)[mask].abs().max() < TOLERANCE
    policy = trainer._sampling_logps(output)  # the policy's own forward (adapter active)
    assert (policy - vllm_logps)[mask].abs().max() < TOLERANCE
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        assert all(math.isfinite(v) for v in entry.values() if isinstance(v, (int, float))), entry
        assert abs(entry["rollout_corr/kl"]) < 1e-3, entry
