"""Dynamic sampling with refill (docs/methods.md §15.5).

The group filter against verl's (verl-project/verl@1dda039 ``verl/trainer/ppo/v1/replay_buffer.py`` L293-297,
reproduced: a group is dropped when ``len(values) > 1 and np.std(values) == 0.0``); the row joining of several
rounds; and training on the tiny model, where the task is solved for most prompts at the start.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sharpgrpo.training.generation.dynamic_sampling import draw_prompt_indices, groups_pass, merge_outputs, pad_cat


def verl_dropped(values: list[float]) -> bool:  # replay_buffer.py L295: classified (dropped) when not None
    return (float(values[0]) if len(values) > 1 and float(np.std(values)) == 0.0 else None) is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_filter_matches_verls_on_rewards_without_rounding(seed):
    rng = random.Random(seed)
    G, groups = 4, 200
    values = []
    for _ in range(groups):
        kind = rng.random()
        if kind < 0.4:  # binary accuracy, often all 0 or all 1
            values += [float(rng.random() < rng.choice([0.0, 0.5, 1.0])) for _ in range(G)]
        elif kind < 0.7:  # a small integer reward (K&K's -2..3 style), sometimes all equal
            level = rng.randint(-2, 3)
            values += [float(level if rng.random() < 0.7 else rng.randint(-2, 3)) for _ in range(G)]
        else:  # continuous
            values += [rng.gauss(0, 1) for _ in range(G)]
    got = groups_pass(torch.tensor(values, dtype=torch.float64), G)
    expected = [not verl_dropped(values[i * G:(i + 1) * G]) for i in range(groups)]
    assert got.tolist() == expected
    assert 0 < sum(expected) < groups  # both kinds present: the comparison can fail


def test_group_filter_on_equal_floats_and_missing_values():
    """Equal rewards fail whatever their mean rounds to (verl's float std keeps [0.1] * 3: the documented
    difference); NaN (a reward function that skipped the row) is left out; one value left fails."""
    assert float(np.std([0.1, 0.1, 0.1])) > 0  # why max > min is used instead of std > 0
    nan = float("nan")
    values = torch.tensor([0.1, 0.1, 0.1, 1.0, nan, 0.0, nan, nan, 1.0, 2.0, 2.0, nan], dtype=torch.float64)
    assert groups_pass(values, 3).tolist() == [False, True, False, False]


def test_prompt_draw_is_seeded_distinct_and_covers_small_sets():
    first = draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=1)
    assert first == draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=1)  # resumable
    assert len(set(first)) == 8 and all(0 <= i < 50 for i in first)
    assert first != draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=2)
    assert first != draw_prompt_indices(50, 8, seed=3, generation_index=3, round_index=1)
    small = draw_prompt_indices(3, 8, seed=0, generation_index=0, round_index=1)
    assert len(small) == 8 and set(small) <= {0, 1, 2}


def test_rows_of_two_rounds_join_with_trls_padding():
    pad = 9
    first = {"prompt_ids": torch.tensor([[pad, 1, 2], [3, 4, 5]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
             "completion_ids": torch.tensor([[6, 7], [8, pad]]), "completion_mask": torch.tensor([[1, 1], [1, 0]]),
             "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(3.0)}
    second = {"prompt_ids": torch.tensor([[1], [2]]), "prompt_mask": torch.tensor([[1], [1]]),
              "completion_ids": torch.tensor([[1, 2, 3], [4, pad, pad]]),
              "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]), "advantages": torch.tensor([1.0, -1.0]),
              "num_items_in_batch": torch.tensor(4.0)}
    merged = merge_outputs([(first, torch.tensor([1])), (second, torch.tensor([0, 1]))], pad)
    assert "num_items_in_batch" not in merged  # recounted by the sampler over all processes
    assert merged["prompt_ids"].tolist() == [[3, 4, 5], [pad, pad, 1], [pad, pad, 2]]
    assert merged["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert merged["completion_ids"].tolist() == [[8, pad, pad], [1, 2, 3], [4, pad, pad]]
    assert merged["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert merged["advantages"].tolist() == [-0.5, 1.0, -1.0]
    assert pad_cat([torch.ones(1, 2, 3), torch.zeros(2, 1, 3)], 5.0)[1:, 1].eq(5.0).all()
