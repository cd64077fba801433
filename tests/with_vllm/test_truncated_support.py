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
from sharpgrpo.strategies.rollout_correction import truncated_support_logps

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
    torch.testing.assert_close(output["old_per_token_logps"][mask], full[mask], atol=TOLERANCE, rtol=0)  # TRL's own
