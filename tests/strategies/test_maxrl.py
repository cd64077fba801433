"""MaxRL (docs/methods.md §18.1) against the authors' released estimator.

The reference is a float64 loop doing exactly what tajwarfahim/maxrl@c0698eb ``verl/trainer/ppo/core_algos.py``
``compute_maxrl_outcome_advantage`` L402-441 does (the released module imports verl's internals and cannot be
imported here): scores = token_level_rewards.sum(-1) (L409); a dict from each prompt index to its scores (L417-418);
each index's mean ``torch.mean`` of its scores, a group of one mean 0 (L424-430); score_i <- (score_i - mean) /
(mean + epsilon), epsilon = 1e-6 (L406, L435-436); times the response mask (L438). The reward sits on each
completion's last response token as verl's reward managers place it. The strategy runs through the trainer's own
advantage path (``run_advantage_strategies`` with the trainer's output checker); a real generation batch of the tiny
model and two training steps are in ``tests/integration/test_token_credit_training.py``.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.maxrl import maxrl_advantages
from sharpgrpo.training.generation.advantage_pipeline import run_advantage_strategies
from sharpgrpo.training.output_checks import StrategyOutputChecker
from sharpgrpo.validation import ConfigError

SEEDS = [0, 1, 2, 3, 4]


def released_maxrl(token_level_rewards, response_mask, index, epsilon=1e-6):
    """tajwarfahim/maxrl core_algos.py L402-441, line by line, in float64."""
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0, dtype=torch.float64)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2mean[index[i]] + epsilon)
    return scores.unsqueeze(-1) * response_mask


def last_token_rewards(scores, mask):
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.size(0)):
        length = int(mask[i].sum())
        out[i, length - 1] = scores[i]
    return out


def random_batch(seed: int, groups: int = 5, num_generations: int = 6, length: int = 7) -> GenerationBatch:
    g = torch.Generator().manual_seed(seed)
    size = groups * num_generations
    rewards = (torch.rand(size, generator=g) < torch.rand(size, generator=g)).double()
    rewards[:num_generations] = 0.0  # an all-fail group (mean 0)
    rewards[num_generations : 2 * num_generations] = 1.0  # an all-correct group
    rewards[2 * num_generations : 3 * num_generations] = 0.0
    rewards[2 * num_generations] = 1.0  # one success in six: the largest advantage, 5
    lengths = torch.randint(1, length + 1, (size,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    return GenerationBatch(
        old_logps=None, completion_mask=mask, completion_ids=torch.zeros(size, length, dtype=torch.long),
        advantages=torch.randn(size, length, generator=g, dtype=torch.float64), rewards=rewards,
        group_ids=torch.arange(size) // num_generations, num_generations=num_generations,
    )


def run_maxrl(batch: GenerationBatch):
    strategy = STRATEGIES.get("maxrl")(SimpleNamespace())
    checker = StrategyOutputChecker({"maxrl": STRATEGIES.get("maxrl")})
    advantages, metrics, stages = run_advantage_strategies([strategy], batch, checker)
    return advantages, dict(metrics), stages


@pytest.mark.parametrize("seed", SEEDS)
def test_matches_the_released_estimator_through_the_advantage_path(seed):
    batch = random_batch(seed)
    mask = batch.completion_mask
    expected = released_maxrl(last_token_rewards(batch.rewards, mask), mask, batch.group_ids.tolist())
    got, metrics, stages = run_maxrl(batch)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got * mask, expected, rtol=0, atol=1e-9)
    assert torch.all(got[:12] == 0)  # all-fail and all-correct groups: no signal, as released
    assert metrics["maxrl/frac_all_fail_groups"] == pytest.approx(1 / 5)
    assert metrics["maxrl/max_advantage"] == pytest.approx(5 / (1 + 6e-6), rel=1e-12)
    group_means = batch.rewards.view(5, 6).mean(dim=1).repeat_interleave(6)
    torch.testing.assert_close(stages[1], group_means[:, None].expand_as(got))  # the group_mean column


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_controls_differ(seed):
    """GRPO's std normalisation, and the mean normalisation without the released epsilon, both miss at 1e-9."""
    batch = random_batch(seed)
    mask = batch.completion_mask
    expected = released_maxrl(last_token_rewards(batch.rewards, mask), mask, batch.group_ids.tolist())
    rewards = batch.rewards.view(5, 6)
    grpo = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).flatten()
    mean = rewards.mean(1, keepdim=True)
    no_eps = torch.where(mean > 0, (rewards - mean) / mean, 0.0).flatten()
    for control in (grpo, no_eps):
        assert (control[:, None] * mask - expected).abs().max() > 1e-9


def test_non_binary_rewards_are_refused_in_one_line():
    batch = random_batch(0)
    rewards = batch.rewards.clone()
    rewards[7] = 0.5
    with pytest.raises(ValueError, match=r"maxrl needs binary rewards.*completion 7 .* reward 0\.5") as error:
        run_maxrl(GenerationBatch(**{**batch.__dict__, "rewards": rewards}))
    assert "\n" not in str(error.value)


def test_a_group_of_one_is_refused():
    with pytest.raises(ValueError, match="groups of at least two"):
        maxrl_advantages(torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 1]))


def test_composes_first_and_is_refused_with_another_estimator(tmp_path):
    cpu_config(tmp_path, strategies=["maxrl", "passk_mixed"], num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match="list maxrl first"):
        cpu_config(tmp_path, strategies=["thr", "maxrl"], num_generations=4, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match="maxrl and rloo are both advantage estimators"):
        cpu_config(tmp_path, strategies=["maxrl", "rloo"], num_generations=4, per_device_train_batch_size=4)
