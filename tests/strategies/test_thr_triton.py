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
    monkeypatch.setattr(thr_kernels, "fused_factored_sums", lambda *a: original(*a, kernel="triton-tokens"))
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


# ---- the second kernel (the P rows' D tile from the logits' epilogue) and the "triton" path built on it ----------
def _errors_float64(h, w, b, ids, temperature):
    """Float64 D = e_y - q of every row over the columns of w (q normalised over exactly these columns), lse and
    1 - q(y) (1 where y is not among the columns)."""
    z = (h.double() @ w.double().T + (0 if b is None else b.double())) / temperature
    lse = torch.logsumexp(z, 1)
    q = torch.softmax(z, 1)
    inside = (ids >= 0) & (ids < w.shape[0])
    d = -q
    rows = inside.nonzero().flatten()
    d[rows, ids.long()[rows]] += 1.0
    one_minus_q = torch.ones(h.shape[0], dtype=torch.float64)
    one_minus_q[rows] = 1.0 - q[rows, ids.long()[rows]]
    return d, lse, one_minus_q


@pytest.mark.parametrize("seed,bias,temperature", [(0, True, 0.8), (1, False, 1.0), (2, True, 1.3)])
def test_error_tile_matches_float64(seed, bias, temperature):
    gen = torch.Generator().manual_seed(seed)
    n, cols, hidden = 37, 45, 20  # ragged against the 16-wide blocks
    h, w = torch.randn(n, hidden, generator=gen), torch.randn(cols, hidden, generator=gen) * 0.6
    b = torch.randn(cols, generator=gen) if bias else None
    ids = torch.randint(-5, cols + 5, (n,), generator=gen).to(torch.int32)  # some ids outside this tile
    expected, lse, one_minus_q = _errors_float64(h, w, b, ids, temperature)
    d = thr_kernels.triton_error_tile(h, w, b, ids, lse.float(), one_minus_q.float(), temperature, block_m=16,
                                      block_n=16, block_k=16)
    assert d.dtype == torch.float32 and d.shape == (n, cols)
    torch.testing.assert_close(d.double(), expected, rtol=1e-5, atol=1e-6)


def test_error_tile_stored_in_bfloat16_is_d_rounded():
    """On a GPU D leaves the kernel in bf16: the stored values are the float64 D to one bf16 step (the interpreter
    truncates where the GPU rounds to nearest, so one step, 2^-7 relative, rather than half of one)."""
    import triton

    from sharpgrpo.strategies._thr_triton import error_tile_kernel

    gen = torch.Generator().manual_seed(3)
    h, w = torch.randn(20, 24, generator=gen), torch.randn(30, 24, generator=gen) * 0.5
    ids = torch.randint(0, 30, (20,), generator=gen).to(torch.int32)
    expected, lse, one_minus_q = _errors_float64(h, w, None, ids, 1.0)
    d = torch.empty(20, 30, dtype=torch.bfloat16)
    error_tile_kernel[(triton.cdiv(20, 16), triton.cdiv(30, 16))](
        h, w, h, ids, lse.float(), one_minus_q.float(), d, 20, 30, 24, 1.0, h.stride(0), w.stride(0), d.stride(0),
        HAS_BIAS=False, IEEE=True, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    assert bool(((d.double() - expected).abs() <= 2.0**-7 * expected.abs() + 1e-30).all())


def test_error_u_matches_float64():
    gen = torch.Generator().manual_seed(4)
    n, cols, hidden = 29, 53, 18
    h, w, s = (torch.randn(n, hidden, generator=gen), torch.randn(cols, hidden, generator=gen) * 0.5,
               torch.randn(cols, hidden, generator=gen))
    ids = torch.randint(-3, cols + 3, (n,), generator=gen).to(torch.int32)
    d, _, _ = _errors_float64(h, w, None, ids, 1.0)
    stats = thr_kernels.triton_error_u(h, s, d.float(), ids, splits=2, block_m=16, block_n=16, block_k=16)
    u = h.double() @ s.double().T
    own = torch.arange(cols)[None, :] == ids.long()[:, None]
    expected = torch.stack([(-d * u * ~own).sum(1), (u * own).sum(1)])
    torch.testing.assert_close(stats.double(), expected, rtol=1e-5, atol=1e-5)


def _random_group(seed, G, T, V, H, empty_positive=False):
    """A group with ragged lengths (1..T; with ``empty_positive`` a positive completion of length 0)."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(G, T, H, generator=gen)
    weight = torch.randn(V, H, generator=gen) * 1.5 / H**0.5
    bias = torch.randn(V, generator=gen) * 0.5
    ids = torch.randint(0, V, (G, T), generator=gen)
    ids[:, 0] = ids[0, 0]  # repeated ids: [y == y'] terms
    lengths = torch.randint(1, T + 1, (G,), generator=gen)
    positive = torch.zeros(G, dtype=torch.bool)
    positive[torch.randperm(G, generator=gen)[: max(1, G // 2)]] = True
    if empty_positive:
        lengths[positive.nonzero()[0]] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return hidden, ids, mask, positive, weight, bias


@pytest.mark.parametrize("kernel", ["triton", "triton-tokens"])
@pytest.mark.parametrize("seed,G,T,V,H,chunk_size,temperature,length_normalized", [
    (0, 4, 9, 50, 16, 8, 0.9, True),  # several vocabulary tiles
    (1, 3, 6, 37, 20, 10**6, 1.0, False),  # one tile, unnormalised (S_w = S_1)
])
def test_fused_scores_with_both_kernels_match_float64_reference(monkeypatch, kernel, seed, G, T, V, H, chunk_size,
                                                                 temperature, length_normalized):
    hidden, ids, mask, positive, weight, bias = _random_group(seed, G, T, V, H)
    monkeypatch.setattr(thr_kernels, "DEFAULT_KERNEL", kernel)
    calls = []
    for name in ("triton_error_tile", "triton_tile_statistics"):  # which kernels ran
        monkeypatch.setattr(thr_kernels, name, lambda *a, _f=getattr(thr_kernels, name), _n=name, **k:
                            calls.append(_n) or _f(*a, **k))
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, temperature, "full", chunk_size,
                                        compute_entropy=True, method="fused", beta=1.2,
                                        length_normalized=length_normalized)
    assert ("triton_error_tile" in calls) == (kernel == "triton") and "triton_tile_statistics" in calls
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, temperature, beta=1.2,
                                 length_normalized=length_normalized)
    assert_scores_close(result, reference, mask)


@pytest.mark.slow
@pytest.mark.parametrize("seed,G,T,V,H,chunk_size,empty_positive,all_positive", [
    (5, 8, 24, 300, 40, 16, False, False),  # 9+ tiles, longer ragged completions
    (6, 6, 17, 131, 33, 40, True, False),  # a positive completion without tokens
    (7, 4, 11, 90, 24, 5, False, True),  # every completion positive: no non-P rows
])
def test_two_kernel_path_larger_shapes_match_float64_reference(monkeypatch, seed, G, T, V, H, chunk_size,
                                                               empty_positive, all_positive):
    hidden, ids, mask, positive, weight, bias = _random_group(seed, G, T, V, H, empty_positive)
    if all_positive:
        positive[:] = True
    monkeypatch.setattr(thr_kernels, "DEFAULT_KERNEL", "triton")
    result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 0.7, "full", chunk_size,
                                        compute_entropy=True, method="fused", beta=0.9)
    reference = reference_scores(hidden, ids, mask, positive, weight, bias, 0.7, beta=0.9)
    assert_scores_close(result, reference, mask)


def test_kernel_selection_and_fallback(monkeypatch):
    cpu = torch.device("cpu")
    assert thr_kernels.resolve_kernel("auto", cpu) == "torch"  # auto: Triton only on CUDA
    assert thr_kernels.resolve_kernel("triton", cpu) == "triton"
    with pytest.raises(ValueError, match="SHARPGRPO_THR_KERNEL"):
        thr_kernels.resolve_kernel("cuda", cpu)
    # "auto" on a device where the Triton path fails to build: the torch path's result, with a warning
    hidden, ids, mask, positive, weight, bias = _random_group(8, 4, 7, 40, 12)
    monkeypatch.setattr(thr_kernels, "resolve_kernel", lambda kernel, device: "triton")

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(thr_kernels, "triton_error_tile", broken)
    monkeypatch.setattr(thr_kernels, "DEFAULT_KERNEL", "auto")
    with pytest.warns(UserWarning, match="using the torch path"):
        result = token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 1.0, "full", 4,
                                            method="fused")
    assert_scores_close(result, reference_scores(hidden, ids, mask, positive, weight, bias, 1.0), mask)
    monkeypatch.setattr(thr_kernels, "DEFAULT_KERNEL", "triton")  # named explicitly: the failure is raised
    with pytest.raises(RuntimeError, match="no kernel"):
        token_hidden_reward_scores(hidden, ids, mask, positive, weight, bias, 1.0, "full", 4, method="fused")
