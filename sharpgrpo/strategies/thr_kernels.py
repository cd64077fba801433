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

Two implementations of the same loop: pure torch (the CPU tests and the default without triton), and, with triton
installed, on CUDA, a Triton kernel (``_thr_triton.py``) for pass 1 and for the token side of pass 2: per block of
tokens and vocabulary columns it computes ``Z`` and ``U`` in on-chip memory and keeps only the online statistics, so
neither (N, Vc) tile is written. It is tested in Triton's CPU interpreter (tests/strategies/test_thr_triton.py) and
was checked on an H100 (benchmarks/thr_triton_tune.py); ``SHARPGRPO_THR_KERNEL`` (or ``kernel=``) chooses (default
``auto``: Triton on CUDA where installed), and a kernel that fails to build falls back to torch with a warning.
"""

from __future__ import annotations

import math
import os
import warnings

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


# "auto" by default: Triton on CUDA where it is installed (checked on an H100: agreement with the torch path and the
# float64 reference, faster and a third of the memory; benchmarks/RESULTS.md), torch elsewhere.
DEFAULT_KERNEL = os.environ.get("SHARPGRPO_THR_KERNEL", "auto")  # "torch" | "auto" | "triton"


def fused_factored_sums(*args, kernel: str | None = None):
    """Fused factored THR sums of one group (full vocabulary); arguments of :func:`_fused_factored_sums`.

    ``kernel``: ``"torch"``; ``"triton"`` (the token side of pass 2 in one Triton kernel per vocabulary tile, so the
    (N, Vc) logits and ``U`` tiles never reach memory); ``"auto"``: Triton on CUDA when it is installed, falling back
    to torch (with a warning) if the kernel fails to build. Default: ``$SHARPGRPO_THR_KERNEL`` or ``"auto"``."""
    kernel = kernel or DEFAULT_KERNEL
    if kernel not in ("auto", "torch", "triton"):
        raise ValueError(f"kernel must be 'auto', 'torch' or 'triton', got {kernel!r}")
    use_triton = kernel == "triton" or (kernel == "auto" and args[0].is_cuda and triton_available())
    if not use_triton:
        return _fused_factored_sums(*args, use_triton=False)
    try:
        return _fused_factored_sums(*args, use_triton=True)
    except Exception as error:  # noqa: BLE001 - a kernel that does not build must not stop training
        if kernel == "triton":
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


def merge_statistics(parts: torch.Tensor) -> torch.Tensor:
    """Merge (S, 6, N) online statistics (each relative to its own max) into (6, N) relative to the common max."""
    top = parts[:, 0].amax(dim=0)
    scale = torch.exp(parts[:, 0] - top)  # (S, N)
    return torch.stack([top, (parts[:, 1] * scale).sum(0), (parts[:, 2] * scale).sum(0),
                        (parts[:, 3] * scale).sum(0), parts[:, 4].sum(0), (parts[:, 5] * scale).sum(0)])
