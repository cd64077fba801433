"""``generation_capture.logps_from_hidden_states``: the sampling log-probabilities from hidden states, chunked over
the vocabulary, against a float64 loop reference; no temporary larger than ``chunk_size x V`` elements."""

from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from sharpgrpo.training.generation.capture import logps_from_hidden_states


def reference(hidden, ids, weight, bias, temperature):
    """log softmax((h W^T + b) / T)[y], one token at a time in float64 Python loops."""
    rows, length = ids.shape
    out = torch.zeros(rows, length, dtype=torch.float64)
    h64, w64 = hidden.double(), weight.double()
    for b in range(rows):
        for t in range(length):
            logits = [
                (float(h64[b, t] @ w64[v]) + (float(bias[v]) if bias is not None else 0.0)) / temperature
                for v in range(weight.shape[0])
            ]
            top = max(logits)
            lse = top + math.log(sum(math.exp(z - top) for z in logits))
            out[b, t] = logits[int(ids[b, t])] - lse
    return out


class LargestTensor(TorchFunctionMode):
    """Records the element count of the largest tensor any torch function returns inside the block."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, tuple) else (result,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
        return result


@pytest.mark.parametrize(("chunk_size", "rows_per_chunk", "with_bias", "temperature"),
                         [(1, 1, False, 1.0), (2, 3, True, 0.7), (4, 8, True, 1.3), (10_000, 8, False, 1.0)])
def test_matches_float64_loop_reference(chunk_size, rows_per_chunk, with_bias, temperature):
    generator = torch.Generator().manual_seed(chunk_size * 7 + rows_per_chunk)
    rows, length, hidden_size, vocab = 5, 6, 7, 41
    hidden = torch.randn(rows, length, hidden_size, generator=generator) * 2
    weight = torch.randn(vocab, hidden_size, generator=generator)
    bias = torch.randn(vocab, generator=generator) if with_bias else None
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    ids[0, :] = vocab - 1  # the last vocabulary slice (possibly narrower than the others)
    ids[1, :] = 0
    got = logps_from_hidden_states(hidden, ids, weight, bias, temperature, rows_per_chunk, chunk_size=chunk_size)
    assert got.dtype == torch.float32 and got.shape == (rows, length)
    torch.testing.assert_close(got.double(), reference(hidden, ids, weight, bias, temperature), atol=2e-5, rtol=1e-5)


def test_bf16_head_matches_reference_within_bf16_rounding():
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 4, 16, generator=generator)
    weight = torch.randn(50, 16, generator=generator) / 4
    ids = torch.randint(0, 50, (3, 4), generator=generator)
    got = logps_from_hidden_states(hidden, ids, weight.bfloat16(), None, 1.0, chunk_size=2)
    expected = reference(hidden.bfloat16().float(), ids, weight.bfloat16().float(), None, 1.0)
    torch.testing.assert_close(got.double(), expected, atol=5e-2, rtol=0)


def test_no_temporary_beyond_the_chunk_budget():
    """Every tensor made inside the call (logits slices, their exponentials) holds at most chunk_size x V elements,
    far below the rows x L x V logits of an unchunked computation."""
    rows, length, hidden_size, vocab, chunk_size = 4, 64, 8, 3000, 16
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, length, hidden_size, generator=generator)
    weight = torch.randn(vocab, hidden_size, generator=generator)
    ids = torch.randint(0, vocab, (rows, length), generator=generator)
    with LargestTensor() as spy:
        got = logps_from_hidden_states(hidden, ids, weight, None, 1.0, rows_per_chunk=rows, chunk_size=chunk_size)
    assert spy.largest <= chunk_size * vocab < rows * length * vocab // 10
    unchunked = torch.log_softmax(hidden @ weight.T, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, unchunked, atol=1e-5, rtol=1e-5)
