"""THR score kernel with the softmax fused into the vocabulary products (docs/methods.md §3 "Cost").

Same sums as the ``factored`` method of :mod:`sharpgrpo.strategies.thr` (notation there: ``d_a = e_{y_a} - q_a``,
``S_w = sum_{a in P} w_a d_a h_a^T`` (V, H), ``THR_b = d_b^T S_w h_b``), organised so that the normaliser of the
N tokens' distributions is never computed in a pass of its own and no fp32 N x V probability matrix is written at
full size:

* pass 1, over the vocabulary, for the nP P-tokens only: their log-normaliser and ``1 - q(y)`` (the rows of S
  need normalised probabilities before any token is scored);
* pass 2, one vocabulary tile ``v`` at a time: the logits ``Z_v = H W_v^T / T`` of all N tokens; the tile of every
  positive completion's ``S_i,v = D_i,v^T H_i`` (from the P rows of ``Z_v`` and the pass-1 normalisers);
  ``U_v = H S_w,v^T`` (N, Vc); then, per token b, an online softmax accumulation over the tiles (flash-attention
  style: running max ``m_b``, masses rescaled by ``exp(m_old - m_new)``):

      other_b += sum_{v != y_b} exp(z_bv - m_b)          own_b += exp(z_b,y_b - m_b)
      num_b   += sum_{v != y_b} exp(z_bv - m_b) U_bv      u_b    = U_b,y_b (the tile that holds y_b)

  and finally ``THR_b = u_b * other_b / (other_b + own_b) - num_b / (other_b + own_b)`` =
  ``(1 - q_b(y_b)) u_b - sum_{v != y_b} q_bv U_bv = d_b^T S_w h_b``. Both terms are formed without the
  cancellation of ``u_b - sum_v q_bv U_bv`` when ``q_b(y_b)`` is close to 1. The entropy of every token comes out
  of the same accumulation (``sum exp(z - m) z``).

Flops: ``2 V H (2 N + 2 nP)`` (pass 1: nP V H; pass 2: logits N V H, ``S_i`` nP V H, ``U`` N V H), against
``2 V H (3 N + nP)`` for ``factored``; and one fp32 pass fewer over the N x V logits (the all-token logsumexp).
Peak extra memory: a few (N, Vc) fp32 tiles plus the (|P|, Vc, H) per-completion tiles, Vc chosen so each holds at
most ``chunk_size * V`` elements (as ``factored``).

Three implementations of the same loop (``SHARPGRPO_THR_KERNEL`` or ``kernel=`` chooses, :data:`KERNELS`):

* ``torch``: pure torch, the CPU path and the fallback;
* ``triton-tokens`` (the first Triton kernel, ``_thr_triton.online_tile_kernel``): pass 1 and the token side of
  pass 2 (per block of tokens and vocabulary columns ``Z`` and ``U`` in on-chip memory, only the online statistics
  kept, so neither (N, Vc) tile is written); the P rows' D tile and the S products stay in torch, so the P rows'
  logits are formed twice per tile. Checked on an H100 (benchmarks/RESULTS.md);
* ``triton`` (both kernels, :func:`_fused_sums_two_kernels`): the second kernel (``error_tile_kernel``) forms the P
  rows' logits on chip and writes only D in h's dtype (bf16 on a GPU) from its epilogue, the S products read that
  D, and the P rows' token side comes from D (``error_u_kernel``: ``U`` only, no logits); the other rows as in
  ``triton-tokens``. ``2 V H (2N + 2nP)`` flops instead of ``2 V H (2N + 3nP)``, and no fp32 (nP, Vc) tile.
  Checked in Triton's CPU interpreter against the float64 reference, not yet on a GPU;
* ``auto`` (the default): ``AUTO_TRITON_PATH`` (``triton-tokens``, the GPU-checked one) on CUDA with triton
  installed, torch elsewhere; a Triton path taken by ``auto`` that fails to build falls back to torch with a
  warning, one named explicitly raises.

All are tested in Triton's CPU interpreter (tests/strategies/test_thr_triton.py); benchmarks/gpu_suite.py times
each path on a GPU against its flop floor.
"""

from __future__ import annotations

import math
import os
import warnings
from functools import partial

import torch

from sharpgrpo.strategies.thr_vocab import (
    fused_flops,
    log_normalizer,
    matmul_fp32,
    pairwise_is_cheaper,
    rowdot,
    scaled_logits,
    sequence_s_matrices,
    slice_width,
)


def use_fused(method: str, vocab: str, num_tokens: int, num_pos: int, hidden_size: int, vocab_size: int,
              chunk_size: int) -> bool:
    """Whether :func:`fused_factored_sums` computes the scores: ``method="fused"``, or ``"auto"`` with the full
    vocabulary when the pairwise product (see thr.py) does not need fewer flops or does not fit its budget."""
    if method == "fused":
        if vocab != "full":
            raise ValueError("method='fused' needs vocab='full' (the sampled vocabulary keeps the full-vocabulary "
                             "normaliser, which the fused pass does not compute); use 'factored'")
        return True
    if method != "auto" or vocab != "full" or num_pos == 0:
        return False
    fused = fused_flops(vocab_size, hidden_size, num_tokens, num_pos)
    return not pairwise_is_cheaper(fused, vocab_size, hidden_size, num_tokens, num_pos, chunk_size, vocab_size)


# Kernel paths of the fused score (one result, up to rounding): "torch"; "triton-tokens": the token side of pass 2 and
# the normaliser pass in the first Triton kernel, the P rows' D tile and S products in torch (checked on an H100:
# benchmarks/RESULTS.md); "triton": both Triton kernels (the D tile written by the second kernel from the logits'
# epilogue, the P rows' token side from that D, no logits computed twice; checked in Triton's CPU interpreter, not
# yet on a GPU); "auto": AUTO_TRITON_PATH on CUDA where triton is installed, torch elsewhere.
KERNELS = ("auto", "torch", "triton-tokens", "triton")
# The path "auto" takes on CUDA: the one checked on a GPU. benchmarks/gpu_suite.py times both Triton paths and
# checks them against the float64 reference on the GPU; "triton" becomes the default once it has shown both there.
AUTO_TRITON_PATH = "triton-tokens"
DEFAULT_KERNEL = os.environ.get("SHARPGRPO_THR_KERNEL", "auto")


def resolve_kernel(kernel: str | None, device: torch.device) -> str:
    """The path a call takes: ``kernel`` (default ``$SHARPGRPO_THR_KERNEL`` or ``"auto"``) with ``"auto"`` resolved
    for ``device`` (``AUTO_TRITON_PATH`` on CUDA with triton installed, ``"torch"`` otherwise)."""
    kernel = kernel or DEFAULT_KERNEL
    if kernel not in KERNELS:
        raise ValueError(f"SHARPGRPO_THR_KERNEL (kernel) must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return AUTO_TRITON_PATH if device.type == "cuda" and triton_available() else "torch"
    return kernel


def path_flops(path: str, num_tokens: int, num_pos: int, hidden_size: int, vocab_size: int) -> int:
    """Multiply-adds x 2 of the fused score by kernel path (full vocabulary): ``2 V H (2N + 2nP)`` for ``torch`` and
    ``triton``; ``2 V H (2N + 3nP)`` for ``triton-tokens``, which forms the P rows' logits twice per tile."""
    flops = fused_flops(vocab_size, hidden_size, num_tokens, num_pos)
    return flops + 2 * vocab_size * hidden_size * num_pos if path == "triton-tokens" else flops


def fused_factored_sums(*args, kernel: str | None = None):
    """Fused factored THR sums of one group (full vocabulary); arguments of :func:`_fused_factored_sums`.

    ``kernel``: one of :data:`KERNELS` (see there), default ``$SHARPGRPO_THR_KERNEL`` or ``"auto"``. A Triton path
    chosen by ``"auto"`` that fails to build falls back to torch with a warning; one named explicitly raises."""
    path = resolve_kernel(kernel, args[0].device)
    if path == "torch":
        return _fused_factored_sums(*args, use_triton=False)
    run = _fused_sums_two_kernels if path == "triton" else partial(_fused_factored_sums, use_triton=True)
    try:
        return run(*args)
    except Exception as error:  # noqa: BLE001 - a kernel that does not build must not stop training
        if (kernel or DEFAULT_KERNEL) != "auto":
            raise
        warnings.warn(f"THR Triton kernel failed ({type(error).__name__}: {error}); using the torch path",
                      stacklevel=2)
        return _fused_factored_sums(*args, use_triton=False)


def _fused_factored_sums(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    ids: torch.Tensor,
    seq_lengths: list[int],
    seq_weight: torch.Tensor,
    weighted_differs: bool,
    chunk_size: int,
    compute_entropy: bool,
    matmul_dtype: torch.dtype | None,
    *,
    use_triton: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Fused factored THR sums of one group (full vocabulary).

    Shapes: h (N, H), the P-tokens first, sequence after sequence (``seq_lengths``, |P| entries summing to nP);
    weight (V, H); bias (V,) or None; ids (N,) long; seq_weight (|P|,) -> (weighted (N,), seq_sums (|P|,),
    entropy (N,) or None), all float32: ``weighted_b = sum_{a in P} w_a alpha(a, b) <h_a, h_b>`` (unsigned),
    ``seq_sums_i' = <S_1, S_i'>_F`` (the threshold's unweighted per-completion sums) and the entropy of q_b.
    """
    num_tokens, device = h.shape[0], h.device
    num_pos = sum(seq_lengths)
    vocab_size = weight.shape[0]
    width = slice_width(chunk_size, vocab_size, num_tokens)
    width = min(width, max(1, (chunk_size * vocab_size) // (len(seq_lengths) * h.shape[1])))

    # pass 1: P-tokens' normalisers (their rows of S need q before any token is scored)
    if use_triton:  # the whole vocabulary in one kernel call: (max, other mass, own mass) per P-token
        stats = triton_tile_statistics(h[:num_pos], weight.to(h.dtype), None, bias, ids[:num_pos].to(torch.int32),
                                       temperature)
        total_pos = stats[1] + stats[2]
        lse_pos, one_minus_q_pos = stats[0] + torch.log(total_pos), stats[1] / total_pos
    else:
        lse_pos, one_minus_q_pos, _ = log_normalizer(h[:num_pos], weight, bias, temperature,
                                                      slice_width(chunk_size, vocab_size, num_pos), ids[:num_pos],
                                                      False, matmul_dtype)
    bounds = [0]
    for n in seq_lengths:
        bounds.append(bounds[-1] + n)
    weights = seq_weight.tolist()
    seq_sums = torch.zeros(len(seq_lengths), device=device)

    running_max = torch.full((num_tokens,), -math.inf, device=device)
    other_mass = torch.zeros(num_tokens, device=device)
    own_mass = torch.zeros(num_tokens, device=device)
    numerator = torch.zeros(num_tokens, device=device)
    own_u = torch.zeros(num_tokens, device=device)
    weighted_logit = torch.zeros(num_tokens, device=device) if compute_entropy else None  # sum exp(z - m) z
    for start in range(0, vocab_size, width):
        stop = min(start + width, vocab_size)
        bias_tile = None if bias is None else bias[start:stop]
        z = scaled_logits(h[:num_pos] if use_triton else h, weight[start:stop], bias_tile, temperature, matmul_dtype)
        hit = ((ids >= start) & (ids < stop)).nonzero().flatten()
        columns = ids[hit] - start

        # this tile of S: D_P,v = e_y - q over the P rows, from the pass-1 normalisers
        # (in place where z holds the P rows alone: the Triton path computes the token side from h in its kernel)
        d_pos = z.sub_(lse_pos[:, None]) if use_triton else z[:num_pos] - lse_pos[:, None]
        d_pos.exp_().neg_()
        pos_hit = hit[hit < num_pos]
        d_pos[pos_hit, ids[pos_hit] - start] = one_minus_q_pos[pos_hit]
        s_w, seq_sums_tile = sequence_s_matrices(d_pos, h, bounds, weights, weighted_differs, matmul_dtype)
        del d_pos
        seq_sums += seq_sums_tile
        if use_triton:  # the token side of this tile in one kernel: (6, N) statistics, merged online
            stats = triton_tile_statistics(h, weight[start:stop].to(h.dtype), s_w.to(h.dtype), bias_tile,
                                           (ids - start).to(torch.int32), temperature)
            new_max = torch.maximum(running_max, stats[0])
            old_scale, tile_scale = torch.exp(running_max - new_max), torch.exp(stats[0] - new_max)
            other_mass = other_mass * old_scale + stats[1] * tile_scale
            own_mass = own_mass * old_scale + stats[2] * tile_scale
            numerator = numerator * old_scale + stats[3] * tile_scale
            own_u += stats[4]
            if compute_entropy:
                weighted_logit = weighted_logit * old_scale + stats[5] * tile_scale
            running_max = new_max
            continue
        u = matmul_fp32(h, s_w.T, matmul_dtype)  # (N, Vc) = (S_w h_b) on this tile
        del s_w

        # online softmax over the tiles, the own token kept apart
        new_max = torch.maximum(running_max, z.amax(dim=1))
        rescale = torch.exp(running_max - new_max)
        own_z = z[hit, columns] if compute_entropy else None
        e = torch.exp(z - new_max[:, None]) if compute_entropy else z.sub_(new_max[:, None]).exp_()
        own_e = torch.zeros(num_tokens, device=device)
        own_e[hit] = e[hit, columns]
        e[hit, columns] = 0.0
        own_u[hit] = u[hit, columns]
        other_mass = other_mass * rescale + e.sum(dim=1)
        own_mass = own_mass * rescale + own_e
        numerator = numerator * rescale + rowdot(e, u)
        if compute_entropy:
            weighted_logit = weighted_logit * rescale + rowdot(e, z)
            weighted_logit[hit] += own_e[hit] * own_z
        running_max = new_max
        del z, e, u
    total = other_mass + own_mass
    weighted = own_u * (other_mass / total) - numerator / total
    entropy = None
    if compute_entropy:
        entropy = running_max + torch.log(total) - weighted_logit / total
    return weighted, seq_sums, entropy


def _fused_sums_two_kernels(h, weight, bias, temperature, ids, seq_lengths, seq_weight, weighted_differs, chunk_size,
                            compute_entropy, matmul_dtype):
    """The ``"triton"`` path of :func:`fused_factored_sums` (same arguments and results): the sums of
    :func:`_fused_factored_sums` with the P rows' logits computed once per pass and never stored in fp32.

    * pass 1 (first kernel, no ``U``) over the whole vocabulary for the nP P-tokens: lse, ``1 - q(y)`` and their
      entropy (a P-token's q is final after this pass, so pass 2 never needs their logits' masses again);
    * per vocabulary tile ``v``: the second kernel (:func:`triton_error_tile`) forms ``Z_P,v`` on chip and writes
      only ``D_P,v = e_y - q`` in h's dtype (bf16 on a GPU); the S products ``S_i,v = D_i,v^T H_i`` read it
      (cuBLAS, fp32 accumulation: :func:`~sharpgrpo.strategies.thr_vocab.sequence_s_matrices`); then the token side:
      the P rows from D (:func:`triton_error_u`: ``u = H_P S_w,v^T`` and ``sum_{v != y} q u = -sum d u``, no
      logits), the other ``N - nP`` rows from the first kernel (logits, ``U`` and the online softmax).

    Flops ``2 V H (2N + 2nP)`` (pass 1 nP, D nP, S nP, P-token U nP, other tokens 2 (N - nP)), the torch path's count,
    where ``"triton-tokens"`` does ``2 V H (2N + 3nP)`` (it forms the P rows' logits in torch and again in its
    kernel). The P rows' scores ``(1 - q(y)) u - sum_{v != y} q_v u_v`` are formed as on the other rows, without
    the cancellation of ``u - sum_v q_v u_v``."""
    num_tokens, device = h.shape[0], h.device
    num_pos = sum(seq_lengths)
    num_other = num_tokens - num_pos
    vocab_size = weight.shape[0]
    width = slice_width(chunk_size, vocab_size, num_tokens)
    width = min(width, max(1, (chunk_size * vocab_size) // (len(seq_lengths) * h.shape[1])))
    weight = weight.to(h.dtype)
    ids32 = ids.to(torch.int32)
    h_pos, h_other, ids_pos, ids_other = h[:num_pos], h[num_pos:], ids32[:num_pos], ids32[num_pos:]

    stats = triton_tile_statistics(h_pos, weight, None, bias, ids_pos, temperature)  # pass 1
    total_pos = stats[1] + stats[2]
    lse_pos, one_minus_q_pos = stats[0] + torch.log(total_pos), stats[1] / total_pos
    entropy_pos = lse_pos - stats[5] / total_pos if compute_entropy else None

    bounds = [0]
    for n in seq_lengths:
        bounds.append(bounds[-1] + n)
    weights = seq_weight.tolist()
    seq_sums = torch.zeros(len(seq_lengths), device=device)
    numer_pos = torch.zeros(num_pos, device=device)  # sum_{v != y} q_v u_v of the P rows
    own_u_pos = torch.zeros(num_pos, device=device)
    # the other rows' online statistics (triton_tile_statistics' six, relative to the running max), merged per tile
    state = torch.zeros(6, num_other, device=device)
    state[0] = -math.inf
    for start in range(0, vocab_size, width):
        stop = min(start + width, vocab_size)
        bias_tile = None if bias is None else bias[start:stop]
        d_pos = triton_error_tile(h_pos, weight[start:stop], bias_tile, ids_pos - start, lse_pos, one_minus_q_pos,
                                  temperature)
        s_w, seq_sums_tile = sequence_s_matrices(d_pos, h, bounds, weights, weighted_differs, matmul_dtype)
        seq_sums += seq_sums_tile
        s_w = s_w.to(h.dtype)
        pos_stats = triton_error_u(h_pos, s_w, d_pos, ids_pos - start)
        del d_pos
        numer_pos += pos_stats[0]
        own_u_pos += pos_stats[1]
        if num_other:
            tile = triton_tile_statistics(h_other, weight[start:stop], s_w, bias_tile, ids_other - start, temperature)
            state = merge_statistics(torch.stack([state, tile]))
    running_max, other_mass, own_mass, numerator, own_u, weighted_logit = state
    total = other_mass + own_mass
    weighted = torch.cat([own_u_pos * one_minus_q_pos - numer_pos, own_u * (other_mass / total) - numerator / total])
    entropy = None
    if compute_entropy:
        entropy = torch.cat([entropy_pos, running_max + torch.log(total) - weighted_logit / total])
    return weighted, seq_sums, entropy


# ------------------------------------------------------------------------------------------------------------------
# Triton version of pass 2's token side (optional; CUDA, or the CPU interpreter with TRITON_INTERPRET=1)
# ------------------------------------------------------------------------------------------------------------------
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _triton_kernel():
    """The jitted kernel (``_thr_triton`` is imported on first use: ``triton.jit`` reads TRITON_INTERPRET then)."""
    from sharpgrpo.strategies._thr_triton import online_tile_kernel

    return online_tile_kernel


# Launch configurations of the Triton kernel on a GPU (block sizes, warps, pipeline stages), with U (the token side of
# pass 2) and without (the normaliser pass): the fastest of benchmarks/thr_triton_tune.py's candidates on an H100
# at the shapes (benchmarks/RESULTS.md). The interpreter tests pass their own small blocks.
TRITON_TILE_CONFIG = {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
TRITON_NORMALISER_CONFIG = {"block_m": 64, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3}


def triton_tile_statistics(h: torch.Tensor, weight_tile: torch.Tensor, s_tile: torch.Tensor | None,
                           bias_tile: torch.Tensor | None, tile_ids: torch.Tensor, temperature: float,
                           splits: int | None = None, block_m: int | None = None, block_n: int | None = None,
                           block_k: int | None = None, num_warps: int | None = None,
                           num_stages: int | None = None) -> torch.Tensor:
    """(6, N) statistics of one vocabulary tile, relative to the tile's own per-row max: max, other mass, own mass,
    sum over other ids of e * u, own u, sum e * z (e = exp(z - max), z = (h W^T + b) / T, u = h S^T). ``tile_ids``
    (N,) are the tokens' ids relative to the tile (out of range: not in this tile). The columns are split over
    ``splits`` programs per row block, merged here. ``s_tile=None``: u = 0 (the normaliser alone)."""
    import triton

    config = TRITON_TILE_CONFIG if s_tile is not None else TRITON_NORMALISER_CONFIG
    block_m, block_n, block_k = (block_m or config["block_m"], block_n or config["block_n"],
                                 block_k or config["block_k"])
    launch = {"num_warps": num_warps or config["num_warps"], "num_stages": num_stages or config["num_stages"]}
    num_rows, hidden = h.shape
    num_cols = weight_tile.shape[0]
    if splits is None:
        splits = max(1, min(triton.cdiv(num_cols, block_n), 4 * 132 // max(1, triton.cdiv(num_rows, block_m))))
    split_cols = triton.cdiv(triton.cdiv(num_cols, splits), block_n) * block_n
    splits = triton.cdiv(num_cols, split_cols)
    out = torch.empty(splits, 6, num_rows, device=h.device, dtype=torch.float32)
    h, weight_tile = h.contiguous(), weight_tile.contiguous()
    with_u = s_tile is not None
    s_tile = s_tile.contiguous() if with_u else weight_tile
    kernel = _triton_kernel()
    kernel[(triton.cdiv(num_rows, block_m), splits)](
        h, weight_tile, s_tile, bias_tile if bias_tile is not None else h, tile_ids.contiguous(), out, num_rows,
        num_cols, hidden, 1.0 / temperature, split_cols, h.stride(0), weight_tile.stride(0), s_tile.stride(0),
        out.stride(0), out.stride(1), HAS_BIAS=bias_tile is not None, WITH_U=with_u, IEEE=h.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **launch)
    return merge_statistics(out)


# Launch configurations of the second kernel and of the P rows' token side from D: not tuned on a GPU yet (the
# first kernel's fastest shapes; benchmarks/thr_triton_tune.py --kernels triton sweeps them).
TRITON_ERROR_CONFIG = {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
TRITON_ERROR_U_CONFIG = {"block_m": 128, "block_n": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}


def _launch(config: dict, block_m, block_n, block_k, num_warps, num_stages) -> tuple[int, int, int, dict]:
    return (block_m or config["block_m"], block_n or config["block_n"], block_k or config["block_k"],
            {"num_warps": num_warps or config["num_warps"], "num_stages": num_stages or config["num_stages"]})


def triton_error_tile(h: torch.Tensor, weight_tile: torch.Tensor, bias_tile: torch.Tensor | None,
                      tile_ids: torch.Tensor, lse: torch.Tensor, one_minus_q: torch.Tensor, temperature: float,
                      block_m: int | None = None, block_n: int | None = None, block_k: int | None = None,
                      num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """(n, Vc) prediction errors ``D = e_y - q`` of n tokens on one vocabulary tile, in h's dtype, by the second
    kernel: ``q = exp((h W^T + b) / T - lse)``, the own column (``tile_ids``, relative to the tile; out of range:
    not in this tile) set to ``one_minus_q``. lse and one_minus_q (n,) fp32 come from the normaliser pass."""
    import triton

    from sharpgrpo.strategies._thr_triton import error_tile_kernel

    block_m, block_n, block_k, launch = _launch(TRITON_ERROR_CONFIG, block_m, block_n, block_k, num_warps,
                                                num_stages)
    num_rows, hidden = h.shape
    num_cols = weight_tile.shape[0]
    h, weight_tile = h.contiguous(), weight_tile.contiguous()
    d = torch.empty(num_rows, num_cols, device=h.device, dtype=h.dtype)
    if num_rows == 0:
        return d
    error_tile_kernel[(triton.cdiv(num_rows, block_m), triton.cdiv(num_cols, block_n))](
        h, weight_tile, bias_tile if bias_tile is not None else h, tile_ids.contiguous(), lse.float().contiguous(),
        one_minus_q.float().contiguous(), d, num_rows, num_cols, hidden, 1.0 / temperature, h.stride(0),
        weight_tile.stride(0), d.stride(0), HAS_BIAS=bias_tile is not None, IEEE=h.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **launch)
    return d


def triton_error_u(h: torch.Tensor, s_tile: torch.Tensor, d_tile: torch.Tensor, tile_ids: torch.Tensor,
                   splits: int | None = None, block_m: int | None = None, block_n: int | None = None,
                   block_k: int | None = None, num_warps: int | None = None,
                   num_stages: int | None = None) -> torch.Tensor:
    """(2, n) token side of n tokens whose errors ``d_tile`` (n, Vc) on this tile are known: ``sum_{v != y} q_v u_v``
    (q = -d off the own column) and the own ``u_y``, with ``u = h S^T`` (s_tile (Vc, H)) formed on chip. The
    columns are split over ``splits`` programs per row block, summed here."""
    import triton

    from sharpgrpo.strategies._thr_triton import error_u_kernel

    block_m, block_n, block_k, launch = _launch(TRITON_ERROR_U_CONFIG, block_m, block_n, block_k, num_warps,
                                                num_stages)
    num_rows, hidden = h.shape
    num_cols = s_tile.shape[0]
    if num_rows == 0:
        return torch.zeros(2, 0, device=h.device)
    if splits is None:
        splits = max(1, min(triton.cdiv(num_cols, block_n), 4 * 132 // max(1, triton.cdiv(num_rows, block_m))))
    split_cols = triton.cdiv(triton.cdiv(num_cols, splits), block_n) * block_n
    splits = triton.cdiv(num_cols, split_cols)
    out = torch.empty(splits, 2, num_rows, device=h.device, dtype=torch.float32)
    h, s_tile, d_tile = h.contiguous(), s_tile.to(h.dtype).contiguous(), d_tile.contiguous()
    error_u_kernel[(triton.cdiv(num_rows, block_m), splits)](
        h, s_tile, d_tile, tile_ids.contiguous(), out, num_rows, num_cols, hidden, split_cols, h.stride(0),
        s_tile.stride(0), d_tile.stride(0), out.stride(0), out.stride(1), IEEE=h.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **launch)
    return out.sum(dim=0)


def merge_statistics(parts: torch.Tensor) -> torch.Tensor:
    """Merge (S, 6, N) online statistics (each relative to its own max) into (6, N) relative to the common max."""
    top = parts[:, 0].amax(dim=0)
    scale = torch.exp(parts[:, 0] - top)  # (S, N)
    return torch.stack([top, (parts[:, 1] * scale).sum(0), (parts[:, 2] * scale).sum(0),
                        (parts[:, 3] * scale).sum(0), parts[:, 4].sum(0), (parts[:, 5] * scale).sum(0)])
