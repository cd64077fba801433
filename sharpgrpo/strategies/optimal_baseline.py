"""Optimal token baseline (OTB) and its tool-integrated variant (TIR-OTB) as advantage strategies
(docs/methods.md §14).

verl ships both as advantage estimators (``compute_optimal_token_baseline_advantage`` and
``compute_multi_turn_optimal_token_baseline_advantage``, ``AdvantageEstimator.OPTIMAL_TOKEN_BASELINE`` /
``TIR_OPTIMAL_TOKEN_BASELINE`` in verl-project/verl@1dda039 ``verl/trainer/ppo/core_algos.py`` L871-987 and
L990-1121). For a group of completions i of one prompt, with the outcome reward R_i as the return of every one of
its tokens (G[i, t] = R_i, verl's reward-to-go of an outcome reward placed on the last token):

    w[i, t] = 1 - 2 p_old(y[i, t]) + sum_v p_old(v)^2  = || e_y - p ||^2   (the squared norm of the score of
                                                                         log p(y) w.r.t. the logits)
    W[i, t] = sum_{s <= t} m[i, s] w[i, s]                                (cumulative path-variance proxy)
    B[t]    = sum_i m[i, t] W[i, t] R_i / (sum_i m[i, t] W[i, t] + eps)   (per position, over the group)
    A[i, t] = (R_i - B[t]) m[i, t]

A group of one completion gets B = 0. With ``handle_zero_tail`` (verl's default) the one completion strictly longer
than every other in its group gets B = 0 from the second-longest length on (where B would be its own reward). OTB
aligns positions by their index in the completion; TIR-OTB aligns them by their rank among the completion's
*masked-in* tokens (tool results and retrieved text, masked out, are skipped) and leaves empty completions out of
their group. Without masked-out holes the two are equal.

p_old is the temperature-scaled distribution of the sampling policy. The strategy computes w as
(1 - p(y))^2 + sum_{v != y} p(v)^2 (:func:`path_variance_proxy_from_others`): the same number without verl's
cancellation where p(y) is near 1. ``sum_v p(v)^2`` is the statistic TRL 1.16's
fused LM head returns as ``log_sum_sq_probs`` (``trl/kernels/chunked_logprob.py``): :func:`sum_p_squared` computes it
from the last hidden states and the LM head in tiles of ``rows_per_chunk`` completions x ``vocab_chunk`` vocabulary
entries (an online log-sum-exp of z and of 2z), so no (B, T, V) tensor is built: the peak is that of the fused head.

The advantages are *not* normalised by the group's standard deviation (verl's OTB is not); OTB replaces the outcome
advantage, so it must be the first advantage strategy of the list (checked at config time).

:func:`variance_proxy_metrics` is verl's ``compute_variance_proxy_metrics`` (``verl/trainer/ppo/metric_utils.py``
L691-802, the on-policy branch): with a[i] the masked mean of A[i, :] and W_i = sum_t m w,
``proxy2_total_power = mean_i a_i^2 max(W_i, 0)``, ``expected_a_squared = mean_i a_i^2``, ``expected_w = mean_i W_i``
(proxy 1 needs the gradient norm, which an advantage strategy does not see).
"""

from __future__ import annotations

from typing import Any

import torch

from sharpgrpo.strategies.base import AdvantageStrategy, GenerationBatch, StrategyPaper, register_strategy
from sharpgrpo.strategies.thr_vocab import slice_width

DEFAULT_VOCAB_CHUNK = 8192
ALIGNMENTS = ("position", "token")


@torch.no_grad()
def sum_p_squared(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float,
                  rows_per_chunk: int = 8, vocab_chunk: int = DEFAULT_VOCAB_CHUNK,
                  exclude_ids: torch.Tensor | None = None, chunk_size: int = 512) -> torch.Tensor:
    """sum_v p(v)^2 of p = softmax((h W^T + b) / T) at every position, or with ``exclude_ids`` (B, L) the sum over
    v != exclude_ids[b, l] only. Shapes: hidden (B, L, H), weight (V, H), bias (V,) or None -> (B, L) float32.

    Streams over vocabulary tiles keeping, per position, the running maximum m, s = sum exp(z - m) and
    q = sum exp(2 (z - m)); then sum p^2 = q / s^2 (TRL's fused head: log q - 2 log s). The N tokens of
    ``rows_per_chunk`` rows are scored against at most ``vocab_chunk`` vocabulary entries at a time, fewer where the
    (N, w) tile would hold more than ``chunk_size * V`` logits (``thr_vocab.slice_width``, the rule of THR's score
    and of the sampling log-probabilities): the peak does not grow with L. The excluded token's square is zeroed in place
    before the sum (an index, not an (N, w) mask), so a tile has two (N, w) temporaries."""
    if rows_per_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"rows_per_chunk and vocab_chunk must be >= 1, got {rows_per_chunk}, {vocab_chunk}")
    rows, length, size = hidden.shape
    vocab_size = weight.shape[0]
    out = torch.empty((rows, length), dtype=torch.float32, device=hidden.device)
    for start in range(0, rows, rows_per_chunk):
        h = hidden[start : start + rows_per_chunk].reshape(-1, size).to(weight.dtype)
        ids = None if exclude_ids is None else exclude_ids[start : start + rows_per_chunk].reshape(-1).to(h.device)
        width = min(vocab_chunk, slice_width(chunk_size, vocab_size, h.shape[0]))
        m = s = q = None
        for v0 in range(0, vocab_size, width):
            chunk_bias = None if bias is None else bias[v0 : v0 + width]
            logits = torch.nn.functional.linear(h, weight[v0 : v0 + width], chunk_bias).float()
            if temperature != 1.0:
                logits /= temperature
            new_m = logits.amax(dim=-1) if m is None else torch.maximum(m, logits.amax(dim=-1))
            logits -= new_m.unsqueeze(-1)  # z - m', in place
            squares = torch.exp(2 * logits)
            if ids is not None:  # the excluded token's square set to 0 where it falls in this tile (not subtracted
                hit = ((ids >= v0) & (ids < v0 + logits.shape[-1])).nonzero().flatten()  # later: no cancellation
                squares[hit, ids[hit] - v0] = 0.0  # where p(y) is near 1)
            chunk_q = squares.sum(-1)
            del squares
            chunk_s = logits.exp_().sum(-1)
            if m is None:
                s, q = chunk_s, chunk_q
            else:
                scale = torch.exp(m - new_m)
                s, q = s * scale + chunk_s, q * scale * scale + chunk_q
            m = new_m
        out[start : start + rows_per_chunk] = (q / (s * s)).view(-1, length)
    return out


def path_variance_proxy(old_logps: torch.Tensor, sum_p_sq: torch.Tensor) -> torch.Tensor:
    """w = 1 - 2 p(y) + sum_v p(v)^2 = ||e_y - p||^2 per token, as verl writes it (core_algos.py L927-928).
    (B, T) -> (B, T)."""
    return 1 - 2 * torch.exp(old_logps) + sum_p_sq


def path_variance_proxy_from_others(old_logps: torch.Tensor, sum_other_p_sq: torch.Tensor) -> torch.Tensor:
    """The same w = ||e_y - p||^2 as (1 - p(y))^2 + sum_{v != y} p(v)^2: a sum of two non-negative terms, with no
    cancellation where p(y) is near 1 (there 1 - 2p + sum p^2 loses every digit of a w ~ 1e-6 in float32, and a
    baseline B[t] = sum R W / sum W of such tokens is noise). (B, T) -> (B, T)."""
    return torch.expm1(old_logps) ** 2 + sum_other_p_sq


def _group_baselines(returns: torch.Tensor, w_cumulative: torch.Tensor, mask: torch.Tensor, members: torch.Tensor,
                     inverse: torch.Tensor, handle_zero_tail: bool, epsilon: float) -> torch.Tensor:
    """B[i, t] of every row: the group's sum_i m W R / (sum_i m W + eps) at t, 0 for rows of one-member groups and
    outside ``members`` (rows that belong to no group), and the zero tail (module docstring)."""
    num_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    weight = w_cumulative * mask * members[:, None]
    numerator = returns.new_zeros(num_groups, returns.shape[1]).index_add_(0, inverse, returns * weight)
    denominator = returns.new_zeros(num_groups, returns.shape[1]).index_add_(0, inverse, weight) + epsilon
    size = torch.zeros(num_groups, dtype=torch.long, device=returns.device).index_add_(0, inverse, members.long())
    baselines = (numerator / denominator)[inverse] * (members & (size[inverse] > 1))[:, None]
    if handle_zero_tail:
        lengths = mask.sum(dim=1).to(torch.long)
        member_lengths = torch.where(members, lengths, torch.full_like(lengths, -1))
        longest = torch.full((num_groups,), -1, dtype=torch.long, device=returns.device)
        longest = longest.scatter_reduce(0, inverse, member_lengths, reduce="amax")
        at_longest = members & (lengths == longest[inverse])
        count_longest = torch.zeros(num_groups, dtype=torch.long, device=returns.device).index_add_(
            0, inverse, at_longest.long())
        shorter = torch.where(members & ~at_longest, lengths, torch.full_like(lengths, -1))
        second = torch.full((num_groups,), -1, dtype=torch.long, device=returns.device)
        second = second.scatter_reduce(0, inverse, shorter, reduce="amax")
        tail_rows = at_longest & (count_longest[inverse] == 1) & (size[inverse] > 1)
        positions = torch.arange(returns.shape[1], device=returns.device)
        zero = tail_rows[:, None] & (positions[None, :] >= second[inverse][:, None])
        baselines = baselines.masked_fill(zero, 0.0)
    return baselines


def optimal_token_baseline_advantages(
    rewards: torch.Tensor,
    mask: torch.Tensor,
    group_ids: torch.Tensor,
    w: torch.Tensor,
    *,
    align: str = "position",
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    is_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """OTB (``align="position"``, verl core_algos.py L871-987) or TIR-OTB (``align="token"``, L990-1121) token
    advantages (module docstring).

    Shapes: rewards (B,) outcome reward; mask (B, T) {0, 1}; group_ids (B,) any group labels (rows need not be
    consecutive); w (B, T) the per-token path-variance proxy of the sampling policy (:func:`path_variance_proxy`);
    is_weights (B, T) or None, the truncated importance weights of verl's rollout correction (w is scaled by their
    square) -> (B, T) advantages, 0 off the mask. Computed in the dtype of ``w``; no gradient."""
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    with torch.no_grad():
        dtype = w.dtype
        mask = mask.to(dtype)
        scaled = w if is_weights is None else w * is_weights.to(dtype) ** 2
        w_cumulative = (scaled * mask).cumsum(dim=-1)
        _, inverse = torch.unique(group_ids, return_inverse=True)
        returns = rewards.to(dtype)[:, None].expand_as(mask)
        if align == "position":
            members = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
            baselines = _group_baselines(returns, w_cumulative, mask, members, inverse, handle_zero_tail, epsilon)
            return (returns - baselines) * mask
        # TIR: each row's masked-in tokens moved to the front, in order; empty rows belong to no group.
        valid = mask.bool()
        lengths = valid.sum(dim=1)
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        width = int(lengths.max()) if lengths.numel() else 0
        order = order[:, :width]
        compact_mask = (torch.arange(width, device=mask.device)[None, :] < lengths[:, None]).to(dtype)
        compact_w = torch.gather(w_cumulative, 1, order) * compact_mask
        compact_returns = returns[:, :width] * compact_mask
        baselines = _group_baselines(compact_returns, compact_w, compact_mask, lengths > 0, inverse,
                                     handle_zero_tail, epsilon)
        compact_advantages = (compact_returns - baselines) * compact_mask
        advantages = torch.zeros_like(mask).scatter_(1, order, compact_advantages) * mask
        return advantages


def variance_proxy_metrics(advantages: torch.Tensor, mask: torch.Tensor, w: torch.Tensor) -> dict[str, float]:
    """verl's variance proxies, on-policy branch (``metric_utils.py`` L691-802; module docstring). Shapes: (B, T)
    each -> ``proxy2_total_power``, ``expected_a_squared``, ``expected_w``."""
    mask = mask.to(w.dtype)
    a = (advantages * mask).sum(-1) / (mask.sum(-1) + 1e-8)
    w_sum = (w * mask).sum(-1)
    return {
        "proxy2_total_power": float((a**2 * w_sum.clamp_min(0.0)).mean()),
        "expected_a_squared": float((a**2).mean()),
        "expected_w": float(w_sum.mean()),
    }


@register_strategy("otb")
class OptimalTokenBaselineStrategy(AdvantageStrategy):
    """``otb``: verl's optimal token baseline (docs/methods.md §14). Reads the outcome rewards, the sampling
    log-probabilities and sum_v p^2 of the sampling distribution (from the last hidden states through the LM head,
    :func:`sum_p_squared`, tiles of ``vocab_chunk``). Replaces the incoming advantages, so it comes first among
    the advantage strategies. Metrics ``otb/proxy2_total_power`` (of its output) and ``otb/proxy2_total_power_input``
    (of the advantages it replaced: the outcome advantage), ``otb/expected_a_squared``, ``otb/expected_w``,
    ``otb/baseline_mean``."""

    needs_hidden_states = True
    needs_old_logps = True
    align: str = "position"
    metric_prefix = "otb"
    metrics = ("otb/proxy2_total_power", "otb/proxy2_total_power_input", "otb/expected_a_squared", "otb/expected_w",
               "otb/baseline_mean")
    params = ("otb_handle_zero_tail", "otb_vocab_chunk")
    epsilon: float = 1e-8  # verl's default (core_algos.py L879)
    paper = StrategyPaper(
        "Optimal Token Baseline (verl)",
        "verl-project/verl, compute_optimal_token_baseline_advantage (verl/trainer/ppo/core_algos.py; "
        "docs/algo/otb.md)",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        from sharpgrpo.strategies.base import STRATEGIES
        from sharpgrpo.validation import ConfigError

        names = list(args.strategies)
        advantage = [(n, STRATEGIES.get(n)) for n in names if STRATEGIES.get(n).kind == "advantage"]
        mine = next(n for n, c in advantage if c is cls)
        if advantage[0][1] is not cls:
            raise ConfigError(
                f"strategies: {mine} replaces the advantages with R - B[t] (verl's optimal token baseline), so "
                f"{advantage[0][0]} before it would be discarded; list {mine} first among the advantage strategies."
            )

    def __init__(self, args: Any):
        super().__init__(args)
        self.handle_zero_tail = bool(args.otb_handle_zero_tail)
        self.vocab_chunk = int(args.otb_vocab_chunk)

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        if batch.hidden_states is None or batch.unembedding_weight is None or batch.old_logps is None:
            raise ValueError(f"{self.metric_prefix} needs GenerationBatch.hidden_states, the unembedding and "
                             "old_logps (the trainer fills them for needs_hidden_states / needs_old_logps).")
        others = sum_p_squared(batch.hidden_states, batch.unembedding_weight, batch.unembedding_bias,
                               batch.temperature, vocab_chunk=self.vocab_chunk, exclude_ids=batch.completion_ids)
        w = path_variance_proxy_from_others(batch.old_logps.float(), others)
        mask = batch.completion_mask.float()
        advantages = optimal_token_baseline_advantages(
            batch.rewards.float(), mask, batch.group_ids, w, align=self.align,
            handle_zero_tail=self.handle_zero_tail, epsilon=self.epsilon)
        out = variance_proxy_metrics(advantages, mask, w)
        before = variance_proxy_metrics(batch.advantages.float(), mask, w)
        baseline = (batch.rewards.float()[:, None] - advantages) * mask
        p = self.metric_prefix
        metrics = {f"{p}/{k}": v for k, v in out.items()}
        metrics[f"{p}/proxy2_total_power_input"] = before["proxy2_total_power"]
        metrics[f"{p}/baseline_mean"] = float(baseline.sum() / mask.sum().clamp_min(1))
        return advantages.to(batch.advantages.dtype), metrics


@register_strategy("tir_otb")
class TirOptimalTokenBaselineStrategy(OptimalTokenBaselineStrategy):
    """``tir_otb``: verl's multi-turn (tool-integrated) optimal token baseline: positions aligned by their rank among
    each completion's masked-in tokens (docs/methods.md §14)."""

    align = "token"
    metric_prefix = "tir_otb"
    metrics = tuple(name.replace("otb/", "tir_otb/", 1) for name in OptimalTokenBaselineStrategy.metrics)
    paper = StrategyPaper(
        "Optimal Token Baseline, multi-turn variant (verl)",
        "verl-project/verl, compute_multi_turn_optimal_token_baseline_advantage (verl/trainer/ppo/core_algos.py)",
    )
