"""Triton kernel of the fused THR score's token side (see sharpgrpo/strategies/thr_kernels.py, which imports this
module lazily: ``triton.jit`` reads ``TRITON_INTERPRET`` when this module is first imported)."""

import triton
import triton.language as tl


@triton.jit
def online_tile_kernel(h_ptr, w_ptr, s_ptr, bias_ptr, ids_ptr, out_ptr, n_rows, n_cols, hidden, inv_t,
                       split_cols, stride_h, stride_w, stride_s, stride_out_split, stride_out_stat,
                       HAS_BIAS: tl.constexpr, WITH_U: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows [pid_m*BM, +BM) against vocabulary columns [pid_v*split, +split) of one tile: z = h W^T / T (+b/T),
    u = h S^T, and the online statistics (max, other mass, own mass, sum e*u over other ids, own u, sum e*z)
    written to out[pid_v, stat, row]. Without ``WITH_U`` (the normaliser pass) u = 0 and S is not read."""
    pid_m = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=-1)
    running = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    other = tl.zeros((BLOCK_M,), tl.float32)
    own = tl.zeros((BLOCK_M,), tl.float32)
    numer = tl.zeros((BLOCK_M,), tl.float32)
    own_u = tl.zeros((BLOCK_M,), tl.float32)
    ez = tl.zeros((BLOCK_M,), tl.float32)
    col_start = pid_v * split_cols
    col_stop = tl.minimum(col_start + split_cols, n_cols)
    for c0 in range(col_start, col_stop, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < col_stop
        z = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for k0 in range(0, hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < hidden
            h = tl.load(h_ptr + rows[:, None] * stride_h + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            w = tl.load(w_ptr + cols[:, None] * stride_w + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if IEEE:
                z += tl.dot(h, tl.trans(w), input_precision="ieee")
            else:
                z += tl.dot(h, tl.trans(w))
            if WITH_U:
                s = tl.load(s_ptr + cols[:, None] * stride_s + ks[None, :], mask=col_ok[:, None] & k_ok[None, :],
                            other=0.0)
                if IEEE:
                    u += tl.dot(h, tl.trans(s.to(h.dtype)), input_precision="ieee")
                else:
                    u += tl.dot(h, tl.trans(s.to(h.dtype)))
        if HAS_BIAS:
            z += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        z_finite = z * inv_t  # 0 on columns past the tile
        z = tl.where(col_ok[None, :], z_finite, float("-inf"))
        new = tl.maximum(running, tl.max(z, axis=1))
        scale = tl.exp(running - new)
        e = tl.exp(z - new[:, None])
        e = tl.where(col_ok[None, :], e, 0.0)
        is_own = cols[None, :] == ids[:, None]
        e_other = tl.where(is_own, 0.0, e)
        other = other * scale + tl.sum(e_other, axis=1)
        own = own * scale + tl.sum(tl.where(is_own, e, 0.0), axis=1)
        numer = numer * scale + tl.sum(e_other * u, axis=1)
        own_u += tl.sum(tl.where(is_own, u, 0.0), axis=1)
        ez = ez * scale + tl.sum(e * z_finite, axis=1)
        running = new
    base = out_ptr + pid_v * stride_out_split + rows
    tl.store(base, running, mask=row_ok)
    tl.store(base + stride_out_stat, other, mask=row_ok)
    tl.store(base + 2 * stride_out_stat, own, mask=row_ok)
    tl.store(base + 3 * stride_out_stat, numer, mask=row_ok)
    tl.store(base + 4 * stride_out_stat, own_u, mask=row_ok)
    tl.store(base + 5 * stride_out_stat, ez, mask=row_ok)



@triton.jit
def _rows_times_columns(a_ptr, b_ptr, rows, cols, row_ok, col_ok, hidden, stride_a, stride_b, IEEE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(BM, BN) fp32 block of ``A B^T`` (rows of A (., H) against rows of B (., H)), accumulated over H in steps
    of BLOCK_K; masked rows and columns give 0."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        a = tl.load(a_ptr + rows[:, None] * stride_a + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptr + cols[:, None] * stride_b + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if IEEE:
            acc += tl.dot(a, tl.trans(b.to(a.dtype)), input_precision="ieee")
        else:
            acc += tl.dot(a, tl.trans(b.to(a.dtype)))
    return acc


@triton.jit
def error_tile_kernel(h_ptr, w_ptr, bias_ptr, ids_ptr, lse_ptr, omq_ptr, d_ptr, n_rows, n_cols, hidden, inv_t,
                      stride_h, stride_w, stride_d, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The P rows' prediction errors of one vocabulary tile, D = e_y - q, formed in the logits' epilogue: block
    [pid_m*BM, +BM) x [pid_n*BN, +BN) of z = h W^T / T (+b/T), then d = -exp(z - lse_row), the own column set to
    ``1 - q(y)`` (from the normaliser pass, accurate when q(y) is close to 1), stored in d's dtype (bf16 on a GPU):
    the (nP, Vc) fp32 logits never reach memory."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_rows
    col_ok = cols < n_cols
    z = _rows_times_columns(h_ptr, w_ptr, rows, cols, row_ok, col_ok, hidden, stride_h, stride_w, IEEE, BLOCK_M,
                            BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        z += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    one_minus_q = tl.load(omq_ptr + rows, mask=row_ok, other=0.0)
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=-1)
    d = -tl.exp(z * inv_t - lse[:, None])
    d = tl.where(cols[None, :] == ids[:, None], one_minus_q[:, None], d)
    tl.store(d_ptr + rows[:, None] * stride_d + cols[None, :], d.to(d_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def error_u_kernel(h_ptr, s_ptr, d_ptr, ids_ptr, out_ptr, n_rows, n_cols, hidden, split_cols, stride_h, stride_s,
                   stride_d, stride_out_split, stride_out_stat, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The P rows' token side of one vocabulary tile from their stored errors D (no logits): u = h S^T in on-chip
    memory, then per row the sum over other ids of q u = -d u and the own u, written to out[pid_v, stat, row]. The
    P rows' q is already normalised (pass 1), so no online rescaling."""
    pid_m = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    ids = tl.load(ids_ptr + rows, mask=row_ok, other=-1)
    numer = tl.zeros((BLOCK_M,), tl.float32)
    own_u = tl.zeros((BLOCK_M,), tl.float32)
    col_start = pid_v * split_cols
    col_stop = tl.minimum(col_start + split_cols, n_cols)
    for c0 in range(col_start, col_stop, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < col_stop
        u = _rows_times_columns(h_ptr, s_ptr, rows, cols, row_ok, col_ok, hidden, stride_h, stride_s, IEEE,
                                BLOCK_M, BLOCK_N, BLOCK_K)
        d = tl.load(d_ptr + rows[:, None] * stride_d + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        is_own = cols[None, :] == ids[:, None]
        numer += tl.sum(tl.where(is_own, 0.0, -d * u), axis=1)
        own_u += tl.sum(tl.where(is_own, u, 0.0), axis=1)
    base = out_ptr + pid_v * stride_out_split + rows
    tl.store(base, numer, mask=row_ok)
    tl.store(base + stride_out_stat, own_u, mask=row_ok)
