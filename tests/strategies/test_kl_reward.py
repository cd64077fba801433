"""KL in the reward (docs/methods.md §15.7) against verl's released ``kl_penalty`` and
``compute_grpo_outcome_advantage`` (verl 0.9.1 ``verl/trainer/ppo/core_algos.py`` L2188-2213 and L268-335, imported
unchanged where verl is installed) fed as ``apply_kl_penalty`` feeds them (``verl/trainer/ppo/ray_trainer.py``
L94-106: ``token_level_rewards = token_level_scores - beta * kl_penalty(old_log_probs, ref_log_prob) * mask``), and
against a float64 loop; then a real run with ``beta: 0``, where the reference is the initial checkpoint."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.kl_estimators import KL_ESTIMATORS
from sharpgrpo.strategies.kl_reward import grpo_advantages, kl_charged_rewards
from sharpgrpo.config import FIELD_RULES


def random_batch(seed: int, groups: int = 4, size: int = 4, length: int = 9):
    generator = torch.Generator().manual_seed(seed)
    rows = groups * size
    mask = (torch.arange(length)[None] < torch.randint(1, length + 1, (rows, 1), generator=generator)).double()
    old = -torch.rand(rows, length, generator=generator, dtype=torch.float64) * 3
    ref = old + torch.randn(rows, length, generator=generator, dtype=torch.float64) * 0.3
    rewards = torch.randint(0, 2, (rows,), generator=generator).double() + torch.rand(rows, generator=generator) * 0.1
    return rewards, old, ref, mask, torch.arange(groups).repeat_interleave(size)


def loop_reference(rewards, old, ref, mask, group_ids, coef):
    """k1 charge and GRPO's advantage, one completion at a time."""
    charged = []
    for i in range(len(rewards)):
        kl = sum(float(old[i, t] - ref[i, t]) for t in range(old.size(1)) if mask[i, t] > 0)
        charged.append(float(rewards[i]) - coef * kl)
    out = []
    for i in range(len(rewards)):
        group = [charged[j] for j in range(len(rewards)) if int(group_ids[j]) == int(group_ids[i])]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1))
        out.append((charged[i] - mean) / (std + 1e-4))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(5))
def test_matches_a_float64_loop(seed):
    rewards, old, ref, mask, groups = random_batch(seed)
    charged, _ = kl_charged_rewards(rewards, old, ref, mask, 0.05, "k1")
    advantages = grpo_advantages(charged, groups, "group")
    assert torch.allclose(advantages, loop_reference(rewards, old, ref, mask, groups, 0.05), atol=1e-10)
    uncharged = grpo_advantages(rewards, groups, "group")
    assert not torch.allclose(advantages, uncharged, atol=1e-3)  # the control: the charge changes the advantage


@pytest.mark.parametrize("estimator", ["k1", "k2", "low_var_kl"])
@pytest.mark.parametrize("seed", range(3))
def test_matches_verls_released_kl_penalty_and_grpo_advantage(seed, estimator):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl's released code (the verl reference "
                                     "line in docs/development.md) is not installed")
    import numpy as np

    rewards, old, ref, mask, groups = random_batch(seed)
    coef = 0.1
    charged, _ = kl_charged_rewards(rewards, old, ref, mask, coef, estimator)
    ours = grpo_advantages(charged, groups, "group")
    verl_name = {"k1": "kl", "k2": "mse", "low_var_kl": "low_var_kl"}[estimator]
    last = (mask.cumsum(1) == mask.sum(1, keepdim=True)) & (mask > 0)  # the outcome score on the last token
    scores = torch.where(last, rewards[:, None].expand_as(mask), torch.zeros_like(mask))
    kld = core_algos.kl_penalty(old, ref, kl_penalty=verl_name) * mask  # apply_kl_penalty, ray_trainer.py L100-103
    token_level_rewards = scores - coef * kld
    theirs, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards, mask, np.array(groups.tolist()),
                                                          epsilon=1e-4)  # TRL's epsilon (verl's default is 1e-6)
    expected = ours[:, None] * mask
    assert torch.allclose(theirs, expected, atol=1e-9)


def test_the_estimator_choices_are_the_kl_estimators():
    assert FIELD_RULES["kl_in_reward_estimator"].choices == KL_ESTIMATORS


def test_a_zero_coefficient_is_refused_as_inert():
    reason = STRATEGIES.get("kl_in_reward").inert(SimpleNamespace(kl_in_reward_coef=0.0))
    assert reason is not None and "kl_in_reward_coef=0" in reason


def test_the_strategy_reads_its_inputs_on_the_loss_tokens_only():
    rewards, old, ref, mask, groups = random_batch(7)
    args = SimpleNamespace(kl_in_reward_coef=0.2, kl_in_reward_estimator="k1", scale_rewards="group")
    strategy = STRATEGIES.get("kl_in_reward")(args)

    def batch(ref_values, old_values):
        return GenerationBatch(old_logps=old_values.float(), completion_mask=mask.float(),
                               completion_ids=torch.zeros_like(mask).long(), advantages=torch.zeros_like(mask).float(),
                               rewards=rewards.float(), group_ids=groups, num_generations=4, hidden_states=None,
                               unembedding_weight=None, unembedding_bias=None, temperature=1.0,
                               extras={"reference_logps": ref_values.float()})

    clean, metrics = strategy.token_advantages(batch(ref, old))
    noisy, _ = strategy.token_advantages(batch(ref.masked_fill(mask == 0, 50.0), old.masked_fill(mask == 0, -50.0)))
    assert torch.allclose(clean, noisy)
    expected = loop_reference(rewards.float().double(), old.float().double(), ref.float().double(), mask, groups, 0.2)
    assert torch.allclose(clean[:, 0].double(), expected, atol=1e-4)
    assert set(metrics) == set(STRATEGIES.get("kl_in_reward").metrics)


@pytest.mark.slow
def test_trains_with_beta_zero_against_the_initial_checkpoint(tiny_model_path, tmp_path):
    from helpers import binary_letters_reward, make_trainer, tiny_config

    args = tiny_config(tmp_path, strategies=["kl_in_reward"], kl_in_reward_coef=0.5, max_steps=3, beta=0.0,
                       learning_rate=5e-3)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward])
    assert trainer.ref_model is None  # beta = 0: TRL loaded no reference; the initial checkpoint serves
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3
    kl = [entry["kl_in_reward/kl_sum_mean"] for entry in logs]
    assert abs(kl[0]) < 1e-4  # the first generation comes from the initial policy: no KL from itself
    assert any(abs(value) > 1e-4 for value in kl[1:])  # the policy moved away from its reference
