"""Dynamic sampling with vLLM generation (docs/methods.md §15.5): the refill rounds go through TRL's colocated vLLM
engine, and no group trained on has equal rewards."""

from __future__ import annotations

from vllm_marks import NEEDS_VLLM

pytestmark = NEEDS_VLLM

G = 4


def solved_often_reward(prompts, completions, allowed, **kwargs):
    """1 when at least a quarter of the first 8 letters are allowed: most groups of the warm-started model are solved
    by every completion at the start (tests/integration/test_dynamic_sampling.py)."""
    from sharpgrpo.data.demo import allowed_letters_reward

    return [float(r >= 0.25) for r in allowed_letters_reward(prompts, completions, allowed)]


def test_dynamic_sampling_refills_through_the_colocated_engine(tiny_vllm_model, shared_engine, tmp_path):
    from helpers import make_trainer, tiny_config

    from sharpgrpo import SharpGRPOTrainer

    trained = []

    class Recording(SharpGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                trained.append(self._generation.rewards_per_func[:, 0].clone())
            return output

    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", per_device_train_batch_size=16,
                       num_generations=G, max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=6)
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[solved_often_reward], train_dataset=64,
                           trainer_class=Recording)
    trainer.train()
    assert trainer._last_loaded_step == 1  # vLLM generated both steps, after syncing each
    logged = [entry for entry in trainer.state.log_history if "dynamic_sampling/extra_rounds" in entry]
    assert len(logged) == 2 and len(trained) == 2
    for rewards, entry in zip(trained, logged, strict=True):
        grouped = rewards.view(-1, G)
        equal = int((grouped.max(dim=1).values == grouped.min(dim=1).values).sum())
        assert equal == entry["dynamic_sampling/groups_unfilled"]  # only groups the bound forced in
        assert 0 <= entry["dynamic_sampling/extra_rounds"] <= 6
        assert entry["dynamic_sampling/groups_generated"] == 4 * (entry["dynamic_sampling/extra_rounds"] + 1)
    assert sum(entry["dynamic_sampling/groups_dropped"] for entry in logged) >= 1  # the filter had work to do


def test_refill_rounds_keep_their_kept_sets_under_truncated_sampling(tiny_vllm_model, shared_engine, tmp_path):
    """top_k 5, top_p 0.7 with dynamic sampling: the batch the loss sees mixes rows of several generate calls, and every
    one is scored on its kept sets (``kept_sets.KeptSetReader`` keeps 1 + dynamic_sampling_max_rounds calls), so
    rollout_correction measures no mismatch; a row scored on the full vocabulary would add about 0.48 (log S) to
    rollout_corr/kl (tests/with_vllm/test_truncated_support.py)."""
    from helpers import make_trainer, tiny_config

    args = tiny_config(tmp_path, use_vllm=True, vllm_mode="colocate", per_device_train_batch_size=16,
                       num_generations=G, max_steps=2, dynamic_sampling=True, dynamic_sampling_max_rounds=6,
                       temperature=0.9, top_k=5, top_p=0.7, strategies=["rollout_correction"],
                       vllm_importance_sampling_correction=False)
    trainer = make_trainer(tiny_vllm_model, args, reward_funcs=[solved_often_reward], train_dataset=64)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "dynamic_sampling/extra_rounds" in entry]
    assert len(logged) == 2 and sum(entry["dynamic_sampling/extra_rounds"] for entry in logged) >= 1
    for entry in logged:
        assert abs(entry["rollout_corr/kl"]) < 1e-3, entry
