"""Token Hidden Reward (THR) and Negative Token Hidden Reward (NTHR) token advantages (docs/methods.md §3).

THR (Deng et al., "Token Hidden Reward", Corollary 4.2 and Eq. 5) scores every completion token of a group by its
contribution to the likelihood change of the group's correct completions, from the last-layer hidden states ``h``
(the input of the unembedding), the temperature-scaled next-token distributions ``q`` and the sampled tokens ``y``:

    alpha((i,k),(j,m)) = < e_y[i,k] - q[i,k] , e_y[j,m] - q[j,m] >
    THR[j,m] = s_j * sum_{i in P} (1/|y_i|) * sum_k alpha((i,k),(j,m)) * < h[i,k], h[j,m] >
    s_j = +1 if j in P else -1

Threshold (docs/methods.md §3): ``thr`` compares |THR| with tau = beta * min over correct responses of the mean
THR score of that response's tokens (:func:`thr_threshold`, THR's own scale); ``nthr`` keeps Deng et al.'s
unnormalised score and threshold (``ThrScores.tau``). The positive set P is the group's correct completions
(``sharpgrpo.strategies.correctness``).

Notation of this module: a group has ``N`` completion tokens (mask 1), ``nP`` of them in positive completions
("P-tokens"); ``V`` is the vocabulary size and ``H`` the hidden size. Pure torch: no trainer, accelerate or
transformers imports.

How the scores are computed (never a tokens x tokens x V tensor). Write ``d_a = e_{y_a} - q_a`` (a V-vector), so
``alpha(a, b) = <d_a, d_b>``. Two exact organisations of the same sum are implemented:

* ``pairwise``: the (nP, N) matrix ``alpha = D_P @ D^T`` is accumulated over vocabulary slices (one matmul per
  slice, fp32 accumulator), then multiplied elementwise with the hidden Gram matrix ``H_P @ H^T`` in row tiles and
  reduced with the weights ``1/|y_i|``. Cost ~ 2 nP N V (the pairwise product) + 2 N V H (logits), memory nP x N.
* ``factored``: ``sum_a w_a <d_a, d_b> <h_a, h_b> = d_b^T S h_b`` with ``S = sum_{a in P} w_a d_a h_a^T`` (V, H),
  built and consumed one vocabulary slice at a time: per positive completion ``S_i,v = D_i,v^T @ H_i``,
  ``S_v = sum_i w_i S_i,v``, then ``THR_b += sum_{v in slice} d_b[v] * (H @ S_v^T)[b, v]``; the threshold's
  per-completion sums are the Frobenius products ``<sum_i S_i,v , S_i',v>``. Cost ~ 2 V H (2 N + nP) and no
  tokens x tokens matrix at all: cheaper than the pairwise product as soon as nP N > H (N + nP) (long completions).
``method="auto"`` picks the one with fewer flops (pairwise only while its (nP, N) accumulator fits the memory
budget of ``chunk_size``). Both need the log-normaliser of every token first: one pass over the vocabulary
(online logsumexp in fp32, and the entropy in the same pass when asked).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from sharpgrpo.strategies import thr_kernels
from sharpgrpo.strategies.base import (
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    group_slices,
    register_strategy,
)
from sharpgrpo.strategies.correctness import batch_correct
from sharpgrpo.strategies.thr_vocab import (
    factored_flops,
    log_normalizer,
    matmul_fp32,
    pairwise_is_cheaper,
    prediction_errors,
    rowdot,
    sequence_s_matrices,
    slice_width,
)
from sharpgrpo.strategy_params import VOCAB_MODES

SCORE_METHODS = ("auto", "fused", "factored", "pairwise")


class ThrScores(NamedTuple):
    """Result of :func:`token_hidden_reward_scores` for one group.

    Attributes:
        scores: (G, T) float32, THR[j, m] (Corollary 4.2, signed by s_j); 0 on masked positions and everywhere when
            P is empty.
        tau: the unnormalised threshold ``beta * min_{i' in P} sequence_influence[i']`` (Deng et al. 2025, Eq. 8),
            used by ``nthr`` with its unnormalised score; NaN when no positive completion has a token. ``thr`` uses
            :func:`thr_threshold` instead, on THR's own scale (docs/methods.md §3).
        sequence_influence: (G,) float32, for i' in P the mean over its tokens m of
            ``sum_{i in P} sum_k alpha((i,k),(i',m)) <h[i,k], h[i',m]>`` (no 1/|y_i|, self-pairs included); NaN for
            completions outside P or without tokens.
        entropies: (G, T) float32 entropy of the full temperature-scaled distribution q at every token (0 on masked
            positions), or None unless ``compute_entropy``.
    """

    scores: torch.Tensor
    tau: float
    sequence_influence: torch.Tensor
    entropies: torch.Tensor | None


@torch.no_grad()
def token_hidden_reward_scores(
    hidden: torch.Tensor,
    completion_ids: torch.Tensor,
    mask: torch.Tensor,
    positive: torch.Tensor,
    unembedding_weight: torch.Tensor,
    unembedding_bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    vocab: str = "full",
    chunk_size: int = 1024,
    *,
    beta: float = 1.0,
    length_normalized: bool = True,
    compute_entropy: bool = False,
    method: str = "auto",
    matmul_dtype: torch.dtype | None = None,
) -> ThrScores:
    """THR scores of one group (THR Corollary 4.2; threshold Deng et al. 2025 Eq. 8; docs/methods.md §3). No gradient.

    Shapes: hidden (G, T, H) any float dtype; completion_ids (G, T) long; mask (G, T) {0,1}; positive (G,) bool;
    unembedding_weight (V, H); unembedding_bias (V,) or None -> :class:`ThrScores` (scores (G, T) float32, tau,
    sequence_influence (G,), entropies (G, T) or None). The ``tau`` returned is NTHR's unnormalised threshold; THR's
    threshold is :func:`thr_threshold` of the returned scores.

    Args:
        temperature: q = softmax((h W^T + b) / temperature), the sampling temperature (as TRL scales logits).
        vocab: ``"full"`` (exact) or ``"sampled"``: every q is restricted to the ids that occur among the group's
            completion tokens (union over its completions, mask 1), without renormalising (NTHR App. 7.4). The
            normaliser is still the full-vocabulary logsumexp; [y == y'] and q(y) terms are unchanged since those ids
            are in the set.
        chunk_size: memory knob, in tokens: every vocabulary-sized temporary holds at most about ``chunk_size * V``
            elements (the full distributions of ``chunk_size`` tokens). The vocabulary is processed in slices of
            width ``chunk_size * V // N`` for a group of N tokens (factored: also at most
            ``chunk_size * V // (|P| H)``, for its |P| per-completion (slice, H) matrices); pairwise token x token
            tiles have at most ``chunk_size`` rows, and ``auto`` uses the (nP, N) pairwise accumulator only while
            nP * N <= chunk_size * V. Peak extra memory is therefore a few times ``chunk_size * V * 4`` bytes, plus
            nP * N * 4 bytes for ``pairwise``. Results do not depend on it beyond fp32 rounding.
        beta: threshold scale, tau = beta * min_{i' in P} sequence_influence[i'] (default beta = 1, docs/methods.md §3.3).
        length_normalized: True (THR Corollary 4.2): weight 1/|y_i| for the positive completion i; False: weight 1
            (the unnormalised influence sum of Deng et al. 2025, on the threshold's scale). The threshold itself is
            always unnormalised (Deng et al.'s NTHR threshold, docs/methods.md §3.5).
        compute_entropy: also return the entropy of the full distribution q at every token (same first pass).
        method: ``"fused"`` (thr_kernels.py: softmax fused into the vocabulary products; full vocabulary only),
            ``"factored"``, ``"pairwise"`` or ``"auto"`` (see the module docstring); all are exact.
        matmul_dtype: None (fp32 products; TF32 on CUDA if enabled globally) or ``torch.bfloat16`` (bf16 inputs to
            every product, fp32 accumulation, fp32 results accumulated across slices).
    """
    if vocab not in VOCAB_MODES:
        raise ValueError(f"vocab must be one of {VOCAB_MODES}, got {vocab!r}")
    if method not in SCORE_METHODS:
        raise ValueError(f"method must be one of {SCORE_METHODS}, got {method!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    num_rows, length, hidden_size = hidden.shape
    device = hidden.device
    valid = mask.bool()
    positive = positive.to(device=device, dtype=torch.bool)

    # Flatten the group's valid tokens with the P-tokens first, so the P block of every matrix is a leading view.
    order = torch.cat([positive.nonzero().flatten(), (~positive).nonzero().flatten()])
    valid_ordered = valid[order]
    flat_index = (order[:, None] * length + torch.arange(length, device=device)[None, :])[valid_ordered]
    token_row = order[:, None].expand(num_rows, length)[valid_ordered]
    num_tokens = flat_index.numel()
    num_pos = int(valid[positive].sum())

    vocab_size = unembedding_weight.shape[0]
    width = slice_width(chunk_size, vocab_size, num_tokens)
    hidden_dtype = torch.float32 if matmul_dtype is None else matmul_dtype
    h = hidden.reshape(num_rows * length, hidden_size)[flat_index].to(hidden_dtype)
    ids = completion_ids.reshape(-1)[flat_index].long()

    scores_flat = torch.zeros(num_tokens, device=device)
    fused = num_pos > 0 and thr_kernels.use_fused(method, vocab, num_tokens, num_pos, hidden_size, vocab_size,
                                                  chunk_size)
    need_lse = (num_pos > 0 or compute_entropy) and not fused
    lse = entropy = one_minus_q_y = None
    if num_tokens and need_lse:
        lse, one_minus_q_y, entropy = log_normalizer(h, unembedding_weight, unembedding_bias, temperature, width,
                                                      ids, compute_entropy, matmul_dtype)

    if num_pos > 0:
        if vocab == "sampled":
            vocab_ids, sub_ids = torch.unique(ids, sorted=True, return_inverse=True)
            weight = unembedding_weight[vocab_ids]
            bias = None if unembedding_bias is None else unembedding_bias[vocab_ids]
        else:
            sub_ids, weight, bias = ids, unembedding_weight, unembedding_bias
        lengths = valid.sum(dim=1).to(torch.float32)
        pos_rows, pos_counts = torch.unique_consecutive(token_row[:num_pos], return_counts=True)
        seq_weight = (1.0 / lengths[pos_rows]) if length_normalized else torch.ones(len(pos_rows), device=device)

        chosen = "fused" if fused else method
        if chosen == "auto":
            factored = factored_flops(weight.shape[0], hidden_size, num_tokens, num_pos)
            cheaper = pairwise_is_cheaper(factored, weight.shape[0], hidden_size, num_tokens, num_pos, chunk_size,
                                          vocab_size)
            chosen = "pairwise" if cheaper else "factored"
        common = (h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, matmul_dtype)
        if chosen == "fused":  # sharpgrpo/strategies/thr_kernels.py
            scores_flat, seq_sums, entropy = thr_kernels.fused_factored_sums(
                h, weight, bias, temperature, ids, pos_counts.tolist(), seq_weight, length_normalized, chunk_size,
                compute_entropy, matmul_dtype)
        elif chosen == "pairwise":
            pos_weight = seq_weight.repeat_interleave(pos_counts)
            scores_flat, influence_tokens = _pairwise_sums(*common, width, pos_weight, chunk_size)
            seq_sums = torch.zeros(len(pos_rows), device=device).index_add_(
                0, torch.arange(len(pos_rows), device=device).repeat_interleave(pos_counts), influence_tokens)
        else:
            # the per-sequence (Vc, H) matrices of one slice stay within the chunk_size * V budget
            width = min(width, max(1, (chunk_size * vocab_size) // (len(pos_rows) * hidden_size)))
            scores_flat, seq_sums = _factored_sums(*common, width, pos_counts.tolist(), seq_weight,
                                                   length_normalized)
        scores_flat[num_pos:] *= -1.0  # s_j = -1 outside P

    scores = torch.zeros(num_rows * length, device=device)
    scores[flat_index] = scores_flat
    influence = torch.full((num_rows,), math.nan, device=device)
    tau = math.nan
    if num_pos > 0:
        influence[pos_rows] = seq_sums / lengths[pos_rows]
        tau = beta * float(influence[pos_rows].min())
    entropies = None
    if compute_entropy:
        entropies = torch.zeros(num_rows * length, device=device)
        if entropy is not None:
            entropies[flat_index] = entropy
        entropies = entropies.view(num_rows, length)
    return ThrScores(scores.view(num_rows, length), tau, influence, entropies)


def _factored_sums(h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, matmul_dtype, width, seq_lengths,
                   seq_weight, weighted_differs):
    """Exact sums via per-sequence ``S_i = sum_{k in i} d_(i,k) h_(i,k)^T``, one vocabulary slice at a time.

    The P-tokens are the leading ``sum(seq_lengths)`` rows of h, sequence after sequence. With
    ``S_w = sum_i w_i S_i`` and ``S_1 = sum_i S_i``, returns (N,) ``sum_{a in P} w_a alpha(a, b) <h_a, h_b>
    = d_b^T S_w h_b`` for every token b, and (|P|,) for each positive sequence i' the unweighted sum over its tokens
    ``sum_{m in i'} sum_{a in P} alpha(a, (i',m)) <h_a, h_(i',m)> = <S_1, S_i'>_F`` (threshold, Eq. 8)."""
    weighted = torch.zeros(h.shape[0], device=h.device)
    seq_sums = torch.zeros(len(seq_lengths), device=h.device)
    weights = seq_weight.tolist()
    bounds = [0]
    for n in seq_lengths:
        bounds.append(bounds[-1] + n)
    for start in range(0, weight.shape[0], width):
        stop = min(start + width, weight.shape[0])
        d = prediction_errors(h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, start, stop, matmul_dtype)
        s_w, seq_sums_tile = sequence_s_matrices(d, h, bounds, weights, weighted_differs, matmul_dtype)
        weighted += rowdot(matmul_fp32(h, s_w.T, matmul_dtype), d)
        seq_sums += seq_sums_tile
    return weighted, seq_sums


def _pairwise_sums(h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, matmul_dtype, width, pos_weight,
                   chunk_size):
    """Same sums via alpha = D_P D^T (nP, N), accumulated over vocabulary slices, times the hidden Gram matrix in
    row tiles of at most ``chunk_size`` rows. Returns (N,) weighted sums and (nP,) unweighted sums per P-token."""
    num_tokens, num_pos = h.shape[0], pos_weight.shape[0]
    alpha = torch.zeros(num_pos, num_tokens, device=h.device)
    for start in range(0, weight.shape[0], width):
        stop = min(start + width, weight.shape[0])
        d = prediction_errors(h, weight, bias, temperature, lse, sub_ids, one_minus_q_y, start, stop, matmul_dtype)
        alpha += matmul_fp32(d[:num_pos], d.T, matmul_dtype)
    weighted = torch.zeros(num_tokens, device=h.device)
    unweighted = torch.zeros(num_pos, device=h.device)
    for row in range(0, num_pos, chunk_size):
        rows = slice(row, min(row + chunk_size, num_pos))
        tile = alpha[rows].mul_(matmul_fp32(h[rows], h.T, matmul_dtype))  # alpha * <h_a, h_b>
        weighted += pos_weight[rows] @ tile
        unweighted += tile[:, :num_pos].sum(dim=0)
    return weighted, unweighted


def thr_threshold(scores: torch.Tensor, mask: torch.Tensor, positive: torch.Tensor, beta: float = 1.0) -> float:
    """THR's threshold on THR's own scale (docs/methods.md §3; THR App. E.5, Deng et al. 2025 §5.2 with THR's
    normalisation): tau = beta * min_{i' in P} (1/|y_i'|) sum_{m in i'} THR[i', m].

    Shapes: scores (G, T) THR scores of :func:`token_hidden_reward_scores` (length-normalised, self-pairs included;
    s_i' = +1 on P, so each term is the average influence of the correct responses' tokens on response i'); mask
    (G, T); positive (G,) bool -> float, NaN when no positive completion has a token. tau can be negative, in which
    case every token passes ``|THR| > tau``."""
    valid = mask.bool() & positive.to(mask.device).bool()[:, None]
    lengths = valid.sum(dim=1)
    rows = lengths > 0
    if not bool(rows.any()):
        return math.nan
    means = torch.where(valid, scores.double(), 0.0).sum(dim=1)[rows] / lengths[rows]
    return beta * float(means.min())


def top_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """Valid tokens among the top ``quantile`` fraction by entropy within the group. Shapes: (G, T), (G, T) -> (G, T).

    With n valid tokens and k = ceil(quantile * n), selects the valid tokens whose entropy is at least the k-th
    largest (ties at the k-th value are all selected)."""
    valid = mask.bool()
    values = entropies[valid]
    k = min(values.numel(), math.ceil(quantile * values.numel()))
    if k <= 0:
        return torch.zeros_like(valid)
    kth = torch.topk(values, k).values[-1]
    return valid & (entropies >= kth)


def _broadcast_advantages(advantages: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return advantages[:, None].expand(shape) if advantages.dim() == 1 else advantages


def thr_token_advantages(
    scores: torch.Tensor,
    tau: float,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    positive: torch.Tensor,
    p: float = 0.1,
    keep_below_threshold: bool = False,
    entropies: torch.Tensor | None = None,
    entropy_quantile: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """THR Eq. 5 for one group: A[j,m] = 1[|THR[j,m]| > tau] * (1 + sign(THR[j,m]) * p) * A[j,m] (docs/methods.md §3).

    Shapes: scores (G, T); advantages (G,) or (G, T); mask (G, T); positive (G,) bool; entropies (G, T) or None
    -> (A (G, T), metrics).

    Tokens with |THR| <= tau get advantage 0 (the paper's THR-only setting, Eq. 4), or keep A[j,m] when
    ``keep_below_threshold``. ``entropy_quantile`` q > 0 (THR App. B) gives the tokens among the top-q entropy tokens
    of the group (:func:`top_entropy_mask`) that are not above the threshold their unchanged advantage A[j,m].
    Only mixed groups (0 < |P| < G) are reweighted; other groups, and masked positions, are returned unchanged.

    Metrics (mixed groups only; empty dict otherwise), over the group's valid tokens:
        ``thr/frac_retained``: fraction with |THR| > tau (the paper's "ratio retained", App. E.5 Table 16);
        ``thr/frac_positive``: among those above the threshold, the fraction with THR > 0 (amplified when p > 0);
        ``thr/tau``: the threshold tau;
        ``thr/frac_groups_tau_negative``: 1 if tau < 0 (every token passes), else 0; averaged over the mixed
        groups by the strategy;
        ``thr/abs_mean``: mean |THR|;
        ``thr/frac_entropy_added`` (only when entropy_quantile > 0): fraction re-added by the entropy rule.
    """
    adv = _broadcast_advantages(advantages, scores.shape)
    num_pos = int(positive.sum())
    if not 0 < num_pos < scores.shape[0] or math.isnan(tau):
        return adv.clone(), {}
    if entropy_quantile > 0 and entropies is None:
        raise ValueError("entropy_quantile > 0 needs the entropies (compute_entropy=True)")
    valid = mask.bool()
    above = scores.abs() > tau
    below_factor = 1.0 if keep_below_threshold else 0.0
    factor = torch.where(above, 1.0 + torch.sign(scores) * p, torch.full_like(scores, below_factor))
    added = None
    if entropy_quantile > 0:
        added = top_entropy_mask(entropies, valid, entropy_quantile) & ~above
        factor = torch.where(added, torch.ones_like(factor), factor)
    new = torch.where(valid, factor.to(adv.dtype) * adv, adv)

    num_valid = max(int(valid.sum()), 1)
    kept = above & valid
    metrics = {
        "thr/frac_retained": int(kept.sum()) / num_valid,
        "thr/frac_positive": int((kept & (scores > 0)).sum()) / max(int(kept.sum()), 1),
        "thr/tau": float(tau),
        "thr/frac_groups_tau_negative": float(tau < 0),
        "thr/abs_mean": float(scores.abs()[valid].mean()) if valid.any() else 0.0,
    }
    if added is not None:
        metrics["thr/frac_entropy_added"] = int((added & valid).sum()) / num_valid
    return new, metrics


def nthr_token_advantages(
    scores: torch.Tensor,
    tau: float,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    positive: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """NTHR (Deng et al. 2025, docs/methods.md §3) for one group: tokens of incorrect completions whose negative token hidden
    reward exceeds tau are rescaled, A[j,m] := eta * A[j,m] with eta = 2 |0.5 - |P|/G|; all other tokens unchanged.

    Shapes: scores (G, T) THR scores as returned by :func:`token_hidden_reward_scores`; advantages (G,) or (G, T);
    mask (G, T); positive (G,) bool -> (A (G, T), metrics).

    The NTHR of a token of an incorrect completion j is its influence on the correct completions' likelihood,
    ``sum_{i in P} w_i sum_k alpha((i,k),(j,m)) <h[i,k], h[j,m]> = -THR[j,m]`` (THR carries s_j = -1): a large
    positive value means penalising the token also lowers the correct completions' likelihood, so its penalty is
    scaled down (eta < 1). Only mixed groups are changed. Metrics (mixed groups only): ``nthr/frac_selected``
    (fraction of the incorrect completions' valid tokens rescaled), ``nthr/eta``, ``nthr/tau``.
    """
    adv = _broadcast_advantages(advantages, scores.shape)
    num_rows = scores.shape[0]
    num_pos = int(positive.sum())
    if not 0 < num_pos < num_rows or math.isnan(tau):
        return adv.clone(), {}
    eta = 2.0 * abs(0.5 - num_pos / num_rows)
    negative_tokens = mask.bool() & ~positive.bool()[:, None]
    selected = negative_tokens & (-scores > tau)
    new = torch.where(selected, adv * eta, adv)
    metrics = {
        "nthr/frac_selected": int(selected.sum()) / max(int(negative_tokens.sum()), 1),
        "nthr/eta": eta,
        "nthr/tau": float(tau),
    }
    return new, metrics


THR_PAPER = StrategyPaper(
    "Token Hidden Reward: Steering Exploration-Exploitation in Group Relative Deep Reinforcement Learning",
    "Token Hidden Reward: Steering Exploration-Exploitation in Group Relative Deep Reinforcement Learning (THR).",
)


class _HiddenRewardStrategy(AdvantageStrategy):
    """Shared adapter: reads ``thr_*`` parameters from the config, loops over the groups of a batch."""

    paper = THR_PAPER

    needs_hidden_states = True
    needs_old_logps = False
    needs_correctness = True
    metric_prefix = "thr"
    length_normalized = True

    def __init__(self, args: Any):
        super().__init__(args)
        self.beta = float(args.thr_beta)
        self.vocab = args.thr_vocab
        self.chunk_size = int(args.thr_chunk_size)
        self.last_scores: torch.Tensor | None = None
        self.last_tau: list[float] = []

    def token_scores(self) -> torch.Tensor | None:
        return self.last_scores

    def _need_entropy(self) -> bool:
        return False

    def _threshold(self, result: ThrScores, mask, positive) -> float:
        raise NotImplementedError

    def _reweight(self, result: ThrScores, tau, advantages, mask, positive) -> tuple[torch.Tensor, dict[str, float]]:
        raise NotImplementedError

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Whole groups -> ((B, T) token advantages, metrics averaged over the mixed groups).

        Keeps the (B, T) float32 scores in ``self.last_scores`` (0 outside mixed groups and on padding) and the
        per-group thresholds in ``self.last_tau`` (NaN for groups that were not reweighted), for debugging dumps."""
        if batch.hidden_states is None or batch.unembedding_weight is None:
            raise ValueError(f"{type(self).__name__} needs batch.hidden_states and batch.unembedding_weight")
        out = batch.advantages.clone()
        self.last_scores = torch.zeros(batch.completion_mask.shape, device=batch.hidden_states.device)
        self.last_tau = []
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        num_groups = num_mixed = 0
        correct = batch_correct(batch)
        for rows in group_slices(batch.group_ids):
            num_groups += 1
            mask = batch.completion_mask[rows]
            advantages = batch.advantages[rows]
            positive = correct[rows].to(batch.hidden_states.device)
            if not 0 < int(positive.sum()) < positive.numel():
                self.last_tau.append(math.nan)
                continue
            num_mixed += 1
            result = token_hidden_reward_scores(
                batch.hidden_states[rows], batch.completion_ids[rows], mask, positive, batch.unembedding_weight,
                batch.unembedding_bias, batch.temperature, self.vocab, self.chunk_size, beta=self.beta,
                length_normalized=self.length_normalized, compute_entropy=self._need_entropy(),
            )
            device = result.scores.device
            tau = self._threshold(result, mask.to(device), positive)
            self.last_scores[rows] = result.scores
            self.last_tau.append(tau)
            new, metrics = self._reweight(result, tau, advantages.to(device), mask.to(device), positive)
            out[rows] = new.to(out.device, out.dtype)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
                counts[key] = counts.get(key, 0) + 1
        averaged = {key: sums[key] / counts[key] for key in sums}
        averaged[f"{self.metric_prefix}/frac_mixed_groups"] = num_mixed / max(num_groups, 1)
        return out, averaged


@register_strategy("thr")
class TokenHiddenRewardStrategy(_HiddenRewardStrategy):
    """THR-guided token advantages (THR Eq. 5, docs/methods.md §3), from the config fields in ``params``
    (``thr_chunk_size`` is the memory knob of :func:`token_hidden_reward_scores`)."""

    metrics = (
        "thr/frac_retained", "thr/frac_positive", "thr/tau", "thr/frac_groups_tau_negative", "thr/abs_mean",
        "thr/frac_entropy_added", "thr/frac_mixed_groups",
    )
    params = ("thr_p", "thr_beta", "thr_keep_below_threshold", "thr_entropy_quantile", "thr_vocab", "thr_chunk_size")

    def __init__(self, args: Any):
        super().__init__(args)
        self.p = float(args.thr_p)
        self.keep_below_threshold = bool(args.thr_keep_below_threshold)
        self.entropy_quantile = float(args.thr_entropy_quantile)

    def _need_entropy(self) -> bool:
        return self.entropy_quantile > 0

    def _threshold(self, result, mask, positive):
        return thr_threshold(result.scores, mask, positive, self.beta)  # on THR's scale (docs/methods.md §3)

    def _reweight(self, result, tau, advantages, mask, positive):
        return thr_token_advantages(result.scores, tau, advantages, mask, positive, self.p,
                                    self.keep_below_threshold, result.entropies, self.entropy_quantile)


@register_strategy("nthr")
class NegativeTokenHiddenRewardStrategy(_HiddenRewardStrategy):
    """NTHR (Deng et al. 2025, docs/methods.md §3): incorrect-completion tokens with NTHR > tau get A := eta * A.

    Config fields: ``thr_beta``, ``thr_vocab``, ``thr_chunk_size`` as for ``thr``, and
    ``nthr_length_normalized``: False (its default) scores a token by its unnormalised influence
    ``sum_{i in P} sum_k alpha <h, h>``, the same scale as the threshold tau (Deng et al.'s NTHR); True uses THR's
    1/|y_i| weights (Corollary 4.2)."""

    metrics = ("nthr/frac_selected", "nthr/eta", "nthr/tau", "nthr/frac_mixed_groups")
    metric_prefix = "nthr"
    params = ("thr_beta", "thr_vocab", "thr_chunk_size", "nthr_length_normalized")

    def __init__(self, args: Any):
        super().__init__(args)
        self.length_normalized = bool(args.nthr_length_normalized)

    def _threshold(self, result, mask, positive):
        return result.tau  # Deng et al.'s unnormalised threshold (Eq. 8), on the unnormalised score's scale

    def _reweight(self, result, tau, advantages, mask, positive):
        return nthr_token_advantages(result.scores, tau, advantages, mask, positive)
