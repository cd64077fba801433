"""THR's vocabulary-slice primitives and cost model, shared by the score computation (``thr.py``) and its fused
kernels (``thr_kernels.py``).

Every function works on one vocabulary slice at a time, so no (tokens x V) tensor larger than ``chunk_size * V``
elements is ever held: temperature-scaled logits, an online log-normaliser over the full vocabulary, the prediction
errors d = e_y - q of a slice, the per-sequence S matrices S_i = sum_{k in i} d_(i,k) h_(i,k)^T, and the flop counts
that choose between the factored, pairwise and fused methods (docs/methods.md §3).
"""

from __future__ import annotations

import math

import torch


def matmul_fp32(a: torch.Tensor, b: torch.Tensor, matmul_dtype: torch.dtype | None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 result of ``a @ b`` (written into the fp32 ``out`` when given). ``matmul_dtype=None``: fp32 inputs (TF32
    on CUDA when the user enabled it with ``torch.backends.cuda.matmul.allow_tf32``); ``torch.bfloat16``: bf16
    inputs, fp32 accumulation and, on CUDA, fp32 output (``out_dtype``) where the installed torch supports it."""
    if matmul_dtype is None or matmul_dtype == torch.float32:
        return torch.mm(a.float(), b.float(), out=out) if out is not None else a.float() @ b.float()
    a, b = a.to(matmul_dtype), b.to(matmul_dtype)
    result = None
    if a.is_cuda:
        try:
            result = torch.mm(a, b, out_dtype=torch.float32)
        except (TypeError, RuntimeError):
            result = None
    if result is None:
        result = (a @ b).float()
    return out.copy_(result) if out is not None else result


def rowdot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(N, C), (N, C) -> (N,) row-wise dot products without an (N, C) temporary."""
    return torch.bmm(x.unsqueeze(1), y.unsqueeze(2)).view(-1)


def scaled_logits(h, weight, bias, temperature, matmul_dtype):
    """Temperature-scaled logits (N, Vc) fp32 of hidden states h (N, H) against unembedding rows weight (Vc, H)."""
    z = matmul_fp32(h, weight.T, matmul_dtype)
    if bias is not None:
        z += bias.float()
    if temperature != 1.0:
        z *= 1.0 / temperature
    return z


def slice_width(chunk_size: int, vocab_size: int, num_tokens: int) -> int:
    """Vocabulary slice width so that an (N, width) temporary holds at most chunk_size * V elements."""
    width = max(1, min(vocab_size, (chunk_size * vocab_size) // max(num_tokens, 1)))
    if width >= 1024 and width < vocab_size:
        width -= width % 128  # matmul-friendly tile edge
    return width


def log_normalizer(h, weight, bias, temperature, width, ids, with_entropy, matmul_dtype):
    """One online pass over the full vocabulary. h (N, H), weight (V, H), ids (N,) ->
    lse (N,), 1 - q(y) (N,), entropy (N,) or None.

    ``1 - q(y)`` is accumulated as the mass of the other tokens (not as 1 - exp(z_y - lse), which loses every digit
    when q(y) is close to 1)."""
    num_tokens = h.shape[0]
    running_max = torch.full((num_tokens,), -math.inf, device=h.device)
    other_mass = torch.zeros(num_tokens, device=h.device)  # sum_{v != y} exp(z_v - running_max)
    own_mass = torch.zeros(num_tokens, device=h.device)  # exp(z_y - running_max)
    weighted = torch.zeros(num_tokens, device=h.device) if with_entropy else None  # sum_v exp(z_v - max) z_v
    for start in range(0, weight.shape[0], width):
        stop = min(start + width, weight.shape[0])
        z = scaled_logits(h, weight[start:stop], None if bias is None else bias[start:stop], temperature, matmul_dtype)
        new_max = torch.maximum(running_max, z.amax(dim=1))
        rescale = torch.exp(running_max - new_max)
        e = torch.exp(z - new_max[:, None])
        hit = ((ids >= start) & (ids < stop)).nonzero().flatten()
        own_slice = torch.zeros(num_tokens, device=h.device)
        own_logit = torch.zeros(num_tokens, device=h.device)
        if hit.numel():
            columns = ids[hit] - start
            own_slice[hit] = e[hit, columns]
            own_logit[hit] = z[hit, columns]
            e[hit, columns] = 0.0
        other_mass = other_mass * rescale + e.sum(dim=1)
        own_mass = own_mass * rescale + own_slice
        if with_entropy:
            weighted = weighted * rescale + rowdot(e, z) + own_slice * own_logit
        running_max = new_max
    total = other_mass + own_mass
    lse = running_max + torch.log(total)
    entropy = lse - weighted / total if with_entropy else None
    return lse, other_mass / total, entropy


def prediction_errors(h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, start, stop, matmul_dtype):
    """Slice [start, stop) of d_b = e_{y_b} - q_b for all tokens: (N, stop - start) fp32.

    ``sub_ids`` (N,) are the tokens' ids in the (possibly restricted) vocabulary; their one-hot entries are set to
    ``1 - q_b(y_b)`` from :func:`log_normalizer` (accurate when q_b(y_b) is close to 1)."""
    d = scaled_logits(h, weight[start:stop], None if bias is None else bias[start:stop], temperature, matmul_dtype)
    d.sub_(lse[:, None]).exp_().neg_()
    hit = ((sub_ids >= start) & (sub_ids < stop)).nonzero().flatten()
    if hit.numel():
        d[hit, sub_ids[hit] - start] = one_minus_q_y[hit]
    return d


def sequence_s_matrices(d_pos, h, bounds, seq_weights, weighted_differs, matmul_dtype):
    """One vocabulary slice of the per-sequence matrices S_i = sum_{k in i} d_(i,k) h_(i,k)^T of the positive
    sequences, whose tokens are the leading rows of ``d_pos`` (nP, Vc) and ``h`` (N, H), sequence i spanning rows
    ``bounds[i]:bounds[i+1]``. Returns S_w = sum_i w_i S_i (Vc, H) (S_1 = sum_i S_i when not ``weighted_differs``)
    and (|P|,) <S_1, S_i'>_F on this slice (the threshold's unweighted per-sequence sums)."""
    num_seqs = len(bounds) - 1
    s_all = torch.empty(num_seqs, d_pos.shape[1], h.shape[1], device=h.device)  # (|P|, Vc, H)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        matmul_fp32(d_pos[lo:hi].T, h[lo:hi], matmul_dtype, out=s_all[i])
    s_one = s_all.sum(dim=0)
    if weighted_differs:
        s_w = torch.zeros_like(s_one)
        for i, w in enumerate(seq_weights):
            s_w.add_(s_all[i], alpha=w)
    else:
        s_w = s_one
    return s_w, s_all.view(num_seqs, -1) @ s_one.view(-1)


def factored_flops(vocab_size: int, hidden_size: int, num_tokens: int, num_pos: int) -> int:
    """Multiply-adds x 2 of the factored method: D over N tokens, S_i over the nP positive tokens, S_w h over N."""
    return 2 * vocab_size * hidden_size * (2 * num_tokens + num_pos)


def fused_flops(vocab_size: int, hidden_size: int, num_tokens: int, num_pos: int) -> int:
    """The fused method's: the factored ones plus the positive tokens' logits computed a second time (pass 1)."""
    return 2 * vocab_size * hidden_size * (2 * num_tokens + 2 * num_pos)


def pairwise_is_cheaper(other_flops: int, vocab_size: int, hidden_size: int, num_tokens: int, num_pos: int,
                        chunk_size: int, full_vocab_size: int) -> bool:
    """Whether the pairwise product alpha = D_P D^T (nP x N, accumulated over slices) needs fewer flops than
    ``other_flops`` and fits the ``chunk_size * full_vocab_size`` memory budget."""
    pairwise = 2 * vocab_size * num_tokens * (hidden_size + num_pos) + 2 * num_pos * num_tokens * hidden_size
    return num_pos * num_tokens <= chunk_size * full_vocab_size and pairwise < other_flops
