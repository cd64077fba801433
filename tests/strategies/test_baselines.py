"""RLOO and REINFORCE++ advantage strategies (docs/methods.md §15) against verl's released estimators.

The references below are float64 loops reproducing verl's released code line by line (verl-project/verl@1dda039,
``verl/trainer/ppo/core_algos.py``): ``compute_rloo_outcome_advantage`` L587-636,
``compute_reinforce_plus_plus_outcome_advantage`` L693-731 and
``compute_reinforce_plus_plus_baseline_outcome_advantage`` L533-584, with ``verl_F.masked_mean`` / ``masked_var`` /
``masked_whiten`` (``verl/utils/torch_functional.py`` L294-346); they always run. Where verl's released package is
installed (verl 0.9.1 on PyPI, docs/development.md: "Tests against verl's released code"), the released functions are
also called unchanged on the same batches (verl 0.9.1 ``verl/trainer/ppo/core_algos.py``:
``compute_reinforce_plus_plus_baseline_outcome_advantage`` L533-584, ``compute_rloo_outcome_advantage`` L587-636,
``compute_reinforce_plus_plus_outcome_advantage`` L693-731); that test skips with the reason where it is not.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.strategies.baselines import last_token_rewards, reinforce_pp_advantages, rloo_advantages
from sharpgrpo.validation import ConfigError

SEEDS = [0, 1, 2, 3]


# --- verl's released code, reproduced in float64 loops ------------------------------------------------------------
def verl_masked_mean(values, mask):  # torch_functional.py L294-308 (masked_sum: values * mask summed)
    return (values * mask).sum() / (mask.sum() + 1e-8)


def verl_masked_whiten(values, mask):  # torch_functional.py L311-346 (unbiased=True, shift_mean=True)
    mean = verl_masked_mean(values, mask)
    variance = verl_masked_mean((values - mean) ** 2, mask)
    mask_sum = mask.sum()
    variance = variance * (mask_sum / (mask_sum - 1))
    return (values - mean) * torch.rsqrt(variance + 1e-8)


def verl_token_level_rewards(scores, mask):
    """verl's reward managers write the outcome score on the last response token (dapo.py L132:
    reward_tensor[i, valid_response_length - 1] = reward); response masks are left-aligned."""
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for i in range(mask.size(0)):
        length = int(mask[i].sum())
        if length:
            out[i, length - 1] = scores[i]
    return out


def verl_rloo(token_level_rewards, response_mask, index):  # core_algos.py L613-636
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0, dtype=torch.float64)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        n = len(id2score[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - id2mean[index[i]] * n / (n - 1)
    return scores.unsqueeze(-1) * response_mask


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):  # core_algos.py L716-731
    returns = torch.zeros_like(token_level_rewards)
    running_return = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        new_running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = new_running_return * response_mask[:, t]
        running_return = new_running_return * response_mask[:, t] + running_return * (1 - response_mask[:, t])
    return verl_masked_whiten(returns, response_mask) * response_mask


def verl_reinforce_pp_baseline(token_level_rewards, response_mask, index):  # core_algos.py L560-584
    response_length = token_level_rewards.shape[-1]
    scores = token_level_rewards.sum(dim=-1)
    id2score = defaultdict(list)
    id2mean = {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx in id2score:
        if len(id2score[idx]) == 1:
            id2mean[idx] = torch.tensor(0.0, dtype=torch.float64)
        else:
            id2mean[idx] = torch.mean(torch.stack(id2score[idx]))
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, response_length]) * response_mask
    return verl_masked_whiten(scores, response_mask) * response_mask


# --- shared inputs ---------------------------------------------------------------------------------------------------
def random_batch(seed: int, groups: int = 4, num_generations: int = 5, length: int = 7, binary: bool = False):
    g = torch.Generator().manual_seed(seed)
    size = groups * num_generations
    if binary:
        rewards = (torch.rand(size, generator=g) < 0.5).double()
        rewards[:num_generations] = 1.0  # one group all correct: its RLOO advantages are 0
    else:
        rewards = torch.randn(size, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, length + 1, (size,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    group_ids = torch.arange(size) // num_generations
    batch = GenerationBatch(
        old_logps=None, completion_mask=mask, completion_ids=torch.zeros(size, length, dtype=torch.long),
        advantages=torch.randn(size, length, generator=g, dtype=torch.float64), rewards=rewards, group_ids=group_ids,
        num_generations=num_generations,
    )
    return batch


def strategy(name: str, **params):
    return STRATEGIES.get(name)(SimpleNamespace(**params))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("binary", [False, True])
def test_rloo_matches_verl(seed, binary):
    batch = random_batch(seed, binary=binary)
    index = batch.group_ids.tolist()
    expected = verl_rloo(verl_token_level_rewards(batch.rewards, batch.completion_mask), batch.completion_mask, index)
    got, metrics = strategy("rloo").token_advantages(batch)
    assert got.dtype == torch.float64 and got.shape == batch.advantages.shape
    torch.testing.assert_close(got * batch.completion_mask, expected, rtol=1e-12, atol=1e-12)
    if binary:
        assert metrics["rloo/frac_zero_advantage"] >= 5 / 20  # the all-correct group


def test_rloo_is_the_leave_one_out_mean_and_group_of_one_keeps_its_reward():
    rewards = torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0], dtype=torch.float64)
    got = rloo_advantages(rewards, torch.tensor([0, 0, 0, 1, 2]))
    assert got.tolist() == pytest.approx([1.0, -0.5, -0.5, 3.0, 5.0], abs=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_verl(seed, gamma):
    batch = random_batch(seed)
    expected = verl_reinforce_pp(verl_token_level_rewards(batch.rewards, batch.completion_mask),
                                 batch.completion_mask, gamma)
    got = reinforce_pp_advantages(last_token_rewards(batch.rewards, batch.completion_mask), batch.completion_mask,
                                  gamma)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    got, metrics = strategy("reinforce_pp", reinforce_pp_gamma=gamma).token_advantages(batch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert set(metrics) == {"reinforce_pp/return_mean", "reinforce_pp/return_std"}


def test_reinforce_pp_carries_the_return_through_tool_tokens():
    """A tool result inside the completion (mask 0) passes the running return through (verl L722-726)."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.float64)
    rewards = torch.tensor([2.0, -1.0], dtype=torch.float64)
    batch = GenerationBatch(old_logps=None, completion_mask=mask, completion_ids=torch.zeros(2, 6, dtype=torch.long),
                            advantages=torch.zeros(2, 6, dtype=torch.float64), rewards=rewards,
                            group_ids=torch.tensor([0, 0]), num_generations=2)
    token_rewards = torch.zeros(2, 6, dtype=torch.float64)
    token_rewards[0, 5], token_rewards[1, 4] = 2.0, -1.0
    assert torch.equal(last_token_rewards(rewards, mask), token_rewards)
    expected = verl_reinforce_pp(token_rewards, mask, 0.5)
    got = reinforce_pp_advantages(token_rewards, mask, 0.5)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert got[0, 2] == 0 and got[0, 3] == 0 and got[0, 1] != 0
    got, _ = strategy("reinforce_pp", reinforce_pp_gamma=0.5).token_advantages(batch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_pp_baseline_matches_verl(seed):
    batch = random_batch(seed, binary=seed % 2 == 0)
    expected = verl_reinforce_pp_baseline(verl_token_level_rewards(batch.rewards, batch.completion_mask),
                                          batch.completion_mask, batch.group_ids.tolist())
    got, _ = strategy("reinforce_pp_baseline").token_advantages(batch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_three_match_verls_released_functions(seed):
    core_algos = pytest.importorskip(
        "verl.trainer.ppo.core_algos",
        reason="verl's released code is not installed: see docs/development.md, the verl reference line")
    batch = random_batch(seed, binary=seed % 2 == 0)
    mask, index = batch.completion_mask, batch.group_ids.numpy()
    rewards = verl_token_level_rewards(batch.rewards, mask)
    expected, _ = core_algos.compute_rloo_outcome_advantage(rewards.clone(), mask, index)
    got, _ = strategy("rloo").token_advantages(batch)
    torch.testing.assert_close(got * mask, expected, rtol=1e-12, atol=1e-12)
    for gamma in (1.0, 0.9):
        expected, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
            rewards.clone(), mask, config=SimpleNamespace(gamma=gamma))
        got, _ = strategy("reinforce_pp", reinforce_pp_gamma=gamma).token_advantages(batch)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    expected, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask, index)
    got, _ = strategy("reinforce_pp_baseline").token_advantages(batch)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_controls_differ_from_grpo_and_from_each_other():
    """Control: the three estimators and TRL's group normalisation give different advantages on the same batch, and
    the reference itself tells a wrong baseline apart (the RLOO scale n/(n-1) dropped)."""
    batch = random_batch(7)
    mask = batch.completion_mask
    rloo, _ = strategy("rloo").token_advantages(batch)
    rpp, _ = strategy("reinforce_pp", reinforce_pp_gamma=1.0).token_advantages(batch)
    rppb, _ = strategy("reinforce_pp_baseline").token_advantages(batch)
    grouped = batch.rewards.view(-1, batch.num_generations)
    grpo = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()
    outputs = [rloo * mask, rpp, rppb, grpo[:, None] * mask]
    for i in range(len(outputs)):
        for j in range(i + 1, len(outputs)):
            assert (outputs[i] - outputs[j]).abs().max() > 1e-3, (i, j)
    plain_centred = (grouped - grouped.mean(1, keepdim=True)).flatten()[:, None] * mask
    assert (rloo * mask - plain_centred).abs().max() > 1e-3


def test_composes_first_and_refuses_to_follow_another_advantage_strategy():
    check = STRATEGIES.get("rloo").check_config
    check(SimpleNamespace(strategies=["grpo_sg", "rloo", "passk_mixed"]))  # a weight strategy may precede it
    with pytest.raises(ConfigError, match="list rloo first"):
        check(SimpleNamespace(strategies=["passk_mixed", "rloo"]))
    with pytest.raises(ConfigError, match="both advantage estimators"):
        check(SimpleNamespace(strategies=["rloo", "reinforce_pp"]))


def test_passk_mixed_after_rloo_mixes_the_rloo_advantage():
    """Composition: the strategy after ``rloo`` receives RLOO's advantages as A_grpo (q A + (1 - q) A_passk)."""
    from sharpgrpo.strategies.passk import mixed_advantages

    batch = random_batch(3, binary=True)
    rloo, _ = strategy("rloo").token_advantages(batch)
    from dataclasses import replace

    correct = batch.rewards == 1
    got, _ = strategy("passk_mixed", passk_k=2).token_advantages(replace(batch, advantages=rloo, correct=correct))
    for start in range(0, 20, 5):
        rows = slice(start, start + 5)
        expected = mixed_advantages(rloo[rows], correct[rows], 2)
        torch.testing.assert_close(got[rows], expected)
