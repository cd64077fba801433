"""The old (sampling) log-probabilities the advantage strategies read when TRL generates with a real vLLM engine
(docs/methods.md §13.4 and §17.3), colocate mode, float32 engine (tests/with_vllm/conftest.py):

* untruncated sampling, no importance-sampling correction: vLLM's own log-probabilities, as TRL padded them, equal to
  the policy's within 2e-3 (the weights were synced before generating);
* top-k sampling: the policy's own (a no-grad forward) on vLLM's kept sets (replayed, docs/methods.md §17.3), so equal
  to vLLM's truncated, renormalised ones (tests/with_vllm/test_truncated_support.py shows the full-vocabulary ones
  differ);
* ``vllm_importance_sampling_correction``: TRL's ``old_per_token_logps`` (the policy's own, recomputed by TRL).
"""

from __future__ import annotations

import torch
from helpers import binary_letters_reward, make_trainer, tiny_config
from vllm_marks import NEEDS_VLLM

from sharpgrpo.data.demo import demo_dataset

pytestmark = NEEDS_VLLM
TOLERANCE = 2e-3


def strategy_old_logps(model, tmp_path, top_k: int, importance_sampling: bool):
    from trl import GRPOTrainer

    args = tiny_config(tmp_path, strategies="cw_grpo", per_device_train_batch_size=8, num_generations=4,
                       max_completion_length=6, temperature=0.9, top_k=top_k, use_vllm=True, vllm_mode="colocate",
                       vllm_importance_sampling_correction=importance_sampling)
    trainer = make_trainer(model, args, reward_funcs=[binary_letters_reward], train_dataset=8)
    trainer.model.train()
    output = GRPOTrainer._generate_and_score_completions(trainer, [demo_dataset(8)[i // 4] for i in range(8)])
    old_logps, _, _ = trainer._policy().strategy_inputs(output, {}, needs_hidden_states=False, needs_old_logps=True)
    with torch.no_grad():
        policy_logps = trainer._sampling_logps(output)
    return output, old_logps, policy_logps, output["completion_mask"].bool()


def test_untruncated_vllm_logps_are_used(tiny_vllm_model, shared_engine, tmp_path):
    output, old_logps, policy_logps, mask = strategy_old_logps(tiny_vllm_model, tmp_path, 0, False)
    assert "old_per_token_logps" not in output  # on-policy, no IS correction: TRL computed none
    assert torch.equal(old_logps[mask], output["sampling_per_token_logps"][mask])  # vLLM's own, as returned
    assert (old_logps[mask] - policy_logps[mask]).abs().max() < TOLERANCE  # = the policy's


def test_truncated_vllm_logps_are_replaced_by_the_policys_on_the_kept_sets(tiny_vllm_model, shared_engine, tmp_path):
    output, old_logps, policy_logps, mask = strategy_old_logps(tiny_vllm_model, tmp_path, 3, False)
    vllm_logps = output["sampling_per_token_logps"]
    torch.testing.assert_close(old_logps[mask], policy_logps[mask], atol=0, rtol=0)  # the policy's own
    assert (vllm_logps[mask] - policy_logps[mask]).abs().max() < TOLERANCE  # on vLLM's kept sets (replayed)


def test_importance_sampling_correction_uses_trls_recomputed_logps(tiny_vllm_model, shared_engine, tmp_path):
    output, old_logps, policy_logps, mask = strategy_old_logps(tiny_vllm_model, tmp_path, 3, True)
    assert old_logps is output["old_per_token_logps"]
    torch.testing.assert_close(old_logps[mask], policy_logps[mask], atol=1e-5, rtol=1e-5)
