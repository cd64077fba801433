"""The Triton kernel of the fused THR score (thr_kernels.py), run by Triton's CPU interpreter (TRITON_INTERPRET=1):
its per-tile online statistics against a direct torch computation, and the whole fused computation with the
kernel against the float64 reference. Skipped when triton is not installed. tests/conftest.py turns the interpreter
on before anything imports triton (its own @jit library functions are bound at import)."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if not triton.knobs.runtime.interpret or os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("TRITON_INTERPRET=1 must be set before triton is imported (tests/conftest.py sets it)",
                allow_module_level=True)

from test_thr import assert_scores_close, make_group, reference_scores  # noqa: E402

from sharpgrpo.strategies import thr_kernels  # noqa: E402
from sharpgrpo.strategies.thr import token_hidden_reward_scores  # noqa: E402


@pytest.mark.parametrize("bias", [True, False])
def test_tile_statistics_match_torch(bias):
    gen = torch.Generator().manual_seed(0)
    n, cols, hidden, temperature = 37, 45, 20, 0.8  # ragged against the 16-wide blocks; several splits
    h, w, s = torch.randn(n, hidden, generator=gen), torch.randn(cols, hidden, generator=gen), torch.randn(
        cols, hidden, generator=gen)
    b = torch.randn(cols, generator=gen) if bias else None
    ids = torch.randint(-5, cols + 5, (n,), generator=gen).to(torch.int32)  # some ids outside this tile
    stats = thr_kernels.triton_tile_statistics(h, w, s, b, ids, temperature, splits=3, block_m=16, block_n=16,
                                               block_k=16)
    z = (h.double() @ w.double().T + (0 if b is None else b.double())) / temperature
    u = h.double() @ s.double().T
    top = z.max(dim=1).values
    e = torch.exp(z - top[:, None])
    own = torch.arange(cols)[None, :] == ids.long()[:, None]
    expected = torch.stack([top, (e * ~own).sum(1), (e * own).sum(1), (e * u * ~own).sum(1), (u * own).sum(1),
                            (e * z).sum(1)])
    torch.testing.assert_close(stats.double(), expected, rtol=1e-5, atol=1e-5)


def test_fused_scores_with_triton_kernel_match_float64_reference(monkeypatch):
    hidden, ids, mask, positive, weight, bias = make_group(40, G=4, T=9)
    original = thr_kernels.fused_factored_sums
    monkeypatch.setattr(thr_kernels, "fused_factored_sums", lambda *a: original(*a, kernel="triton"))
    calls = []
    monkeypatch.setattr(thr_kernels, "merge_statistics",
                        lambda parts, _m=thr_kernels.merge_statistics: calls.append(1) or _m(parts))
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 0.9, "full", 8,
                                        compute_entropy=True, method="fused", beta=1.1)
    assert calls, "the Triton kernel did not run"
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 0.9, beta=1.1)
    assert_scores_close(result, reference, mask)


def test_normaliser_statistics_without_u():
    gen = torch.Generator().manual_seed(1)
    h, w = torch.randn(20, 24, generator=gen), torch.randn(70, 24, generator=gen)
    ids = torch.randint(0, 70, (20,), generator=gen).to(torch.int32)
    stats = thr_kernels.triton_tile_statistics(h, w, None, None, ids, 1.0, block_m=16, block_n=16, block_k=16)
    z = h.double() @ w.double().T
    total = stats[1].double() + stats[2].double()
    torch.testing.assert_close(stats[0].double() + total.log(), torch.logsumexp(z, 1), rtol=1e-6, atol=1e-6)
    q_y = torch.softmax(z, 1).gather(1, ids.long()[:, None]).squeeze(1)
    torch.testing.assert_close(stats[1].double() / total, 1 - q_y, rtol=1e-5, atol=1e-7)
    assert not stats[3].any() and not stats[4].any()  # u = 0
