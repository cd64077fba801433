"""The per-token telemetry's pure functions against float64 loop references on random inputs: each token's share of
the aggregated loss (``token_loss_shares``), the clip flags, the per-completion means, and the global row order."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sharpgrpo.training.loss.aggregation import aggregate_loss, token_loss_shares
from sharpgrpo.training.telemetry.recorder import _global_order, clip_flags, sequence_means


def random_batch(seed: int, rows: int = 6, length: int = 9):
    generator = torch.Generator().manual_seed(seed)
    per_token_loss = torch.randn(rows, length, generator=generator)
    mask = (torch.rand(rows, length, generator=generator) > 0.3).float()
    mask[0] = 0.0  # a completion with no loss token
    return per_token_loss, mask


def loop_loss(per_token_loss, mask, loss_type, accumulation, window_tokens, max_length) -> float:
    """The aggregation of TRL 1.16's loss types, token by token in float64."""
    rows, length = per_token_loss.shape
    loss = 0.0
    total_mask = sum(float(mask[i, t]) for i in range(rows) for t in range(length))
    for i in range(rows):
        count = sum(float(mask[i, t]) for t in range(length))
        for t in range(length):
            term = float(per_token_loss[i, t]) * float(mask[i, t])
            if loss_type in ("grpo", "sapo"):
                loss += term / max(count, 1.0) / rows / accumulation
            elif loss_type == "bnpo":
                loss += term / max(total_mask, 1.0) / accumulation
            elif loss_type == "dr_grpo":
                loss += term / (rows * max_length) / accumulation
            elif loss_type == "luspo":
                loss += term / rows / accumulation
            else:
                loss += term / window_tokens
    return loss


@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "bnpo", "dr_grpo", "luspo", "dapo", "cispo", "vespo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_token_loss_shares_add_up_to_the_aggregated_loss(loss_type, seed):
    per_token_loss, mask = random_batch(seed)
    window = torch.tensor(23.5)
    shares = token_loss_shares(mask, loss_type, accumulation_steps=2, window_tokens=window, max_completion_length=12)
    reference = loop_loss(per_token_loss.double(), mask.double(), loss_type, 2, 23.5, 12)
    assert float((per_token_loss.double() * shares.double()).sum()) == pytest.approx(reference, rel=1e-6, abs=1e-9)
    loss, _ = aggregate_loss(per_token_loss, mask, loss_type, accumulation_steps=2, window_tokens=window,
                             max_completion_length=12)
    assert float(loss) == pytest.approx(reference, rel=1e-5, abs=1e-7)
    assert torch.all(shares[mask == 0] == 0)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "cispo", "sapo"])
def test_clip_flags_follow_trls_definitions(loss_type):
    """trl==1.16.0 (PyPI), ``trl/trainer/grpo_trainer.py`` lines 3274-3275 (``is_low_clipped``, ``is_high_clipped``
    of the PPO-clip loss types) and 3285 (``is_cispo_clipped``)."""
    generator = torch.Generator().manual_seed(3)
    ratio = 1 + 0.5 * torch.randn(5, 7, generator=generator)
    advantages = torch.randn(5, 1, generator=generator)
    low, high = clip_flags(loss_type, ratio, advantages, 0.2, 0.28)
    for i in range(5):
        for t in range(7):
            r, a = float(ratio[i, t]), float(advantages[i, 0])
            if loss_type in ("grpo", "dapo"):
                expected = (r < 0.8 and a < 0, r > 1.28 and a > 0)
            elif loss_type == "cispo":
                expected = (False, r > 0.28 and a > 0)
            else:
                expected = (False, False)
            assert (bool(low[i, t]), bool(high[i, t])) == expected


def test_sequence_means_over_the_mask():
    values, mask = random_batch(4)
    means = sequence_means(values, mask)
    for i in range(values.shape[0]):
        kept = [float(values[i, t]) for t in range(values.shape[1]) if mask[i, t]]
        assert float(means[i]) == pytest.approx(sum(kept) / max(len(kept), 1), abs=1e-6)
    assert torch.equal(sequence_means(values[:, :1], mask), values[:, 0])


def test_global_order_sorts_rows_by_row_then_position():
    columns = {
        "row": np.array([3, 1, 1, 0, 3]),
        "position": np.array([1, 1, 0, 2, 0]),
        "value": np.array([10.0, 20.0, 30.0, 40.0, 50.0]),
    }
    ordered = _global_order(columns)
    assert ordered["row"].tolist() == [0, 1, 1, 3, 3] and ordered["position"].tolist() == [2, 0, 1, 0, 1]
    assert ordered["value"].tolist() == [40.0, 30.0, 20.0, 50.0, 10.0]
