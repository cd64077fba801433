"""KTAE: key-token advantage estimation (Sun et al. 2025, "KTAE: A Model-Free Algorithm to Key-Tokens Advantage
Estimation in Mathematical Reasoning", arXiv 2505.16826; docs/methods.md §11.4).

Per group of G completions (n+ correct, n- incorrect) and per token id v of the group's completions, the 2 x 2
presence-by-correctness table

    a = #correct completions containing v      b = #incorrect completions containing v
    c = n+ - a                                  d = n- - b

gives two association strengths and a signed direction:

    F(v)  = exp(-2 p(v)), p the two-sided Fisher exact test's p-value (0 where p = 1: no evidence at all)
    IG(v) = H(correct) - H(correct | v present)                  (information gain, in bits)
    x(v)  = h(a / n+, b / n-) + [tf+ / (tf- + 1e-5) - tf- / (tf+ + 1e-5)]      (``ktae_frequency``)

with h(p1, p2) = asin(sqrt p1) - asin(sqrt p2) (Cohen's h) and tf the BM25-saturated frequency of v among the
correct / incorrect completions' tokens (k1 = 2, b = 0.5, "document length" = each class's token count over their
mean). The key-token score and the token advantage are

    s(v) = (sigmoid((alpha F(v) + beta IG(v)) x(v) / (alpha + beta)) - 1/2) * 2 * scale     in (-scale, scale)
    A[i, t] = A[i] + s(y[i, t])                                                               on completion tokens

Groups whose completions are all correct or all incorrect get s = 0. No model, no forward: only the token ids, the
mask and the correctness. Reproduces xiaolizh1/KTAE ``verl/workers/actor/compute_key_tokens.py`` and
``verl/trainer/ppo/core_algos.py::compute_ktae_outcome_advantage_and_keytokens`` (commit ea9fb77), tests/strategies/
test_ktae.py; where they differ from the scripts, the code's values are the defaults (docs/methods.md §11.4).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    group_slices,
    register_strategy,
)
from sharpgrpo.strategies.correctness import batch_correct
from sharpgrpo.validation import ConfigError

BM25_K1 = 2.0
BM25_B = 0.5
FISHER_RELATIVE_TOLERANCE = 1e-7  # tables as likely as the observed one, up to rounding (scipy's fisher_exact too)


def _log_comb(n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)


def fisher_exact_pvalues(tables: torch.Tensor) -> torch.Tensor:
    """Two-sided Fisher exact test of each 2 x 2 table: the hypergeometric probability of every table with the
    observed margins that is at most as likely as the observed one, summed. Shapes: tables (N, 4) counts
    (a, b, c, d) -> (N,) float64 p-values in (0, 1]."""
    t = tables.double()
    a, b, c, d = t.unbind(dim=1)
    row, col, n = a + b, a + c, a + b + c + d
    k_low, k_high = (row + col - n).clamp_min(0), torch.minimum(row, col)
    k = torch.arange(int(k_high.max().item()) + 1 if t.numel() else 1, dtype=torch.float64, device=t.device)
    k = k.unsqueeze(0).expand(t.shape[0], -1)
    valid = (k >= k_low[:, None]) & (k <= k_high[:, None])
    col_, row_, n_ = col[:, None], row[:, None], n[:, None]
    log_pk = _log_comb(col_, k) + _log_comb(n_ - col_, (row_ - k).clamp_min(0)) - _log_comb(n_, row_)
    log_obs = _log_comb(col, a) + _log_comb(n - col, row - a) - _log_comb(n, row)
    at_most = valid & (log_pk <= log_obs[:, None] + math.log1p(FISHER_RELATIVE_TOLERANCE))
    return torch.where(at_most, log_pk.exp(), torch.zeros_like(log_pk)).sum(1).clamp_max(1.0)


def information_gain(tables: torch.Tensor) -> torch.Tensor:
    """IG = H(Y) - H(Y | X) in bits, Y correctness, X presence of the token. Shapes: (N, 4) -> (N,) float64."""
    t = tables.double()
    a, b, c, d = t.unbind(dim=1)
    n = (a + b + c + d).clamp_min(1)

    def plogp(p):
        return torch.where(p > 0, -p * torch.log2(p.clamp_min(1e-300)), torch.zeros_like(p))

    def binary_entropy(x, y):
        total = x + y
        safe = total.clamp_min(1)
        return torch.where(total > 0, plogp(x / safe) + plogp(y / safe), torch.zeros_like(total))

    h_y = binary_entropy(a + c, b + d)
    h_y_x = (a + b) / n * binary_entropy(a, b) + (c + d) / n * binary_entropy(c, d)
    return h_y - h_y_x


def cohens_h(p1: torch.Tensor, p2: torch.Tensor) -> torch.Tensor:
    """Cohen's h = asin(sqrt p1) - asin(sqrt p2) (proportions clamped to [0, 1])."""
    return torch.asin(p1.clamp(0, 1).sqrt()) - torch.asin(p2.clamp(0, 1).sqrt())


def bm25_frequencies(count_correct: torch.Tensor, count_wrong: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """BM25-saturated relative frequencies (tf+, tf-) of each token among the correct / incorrect completions'
    tokens: f (k1 + 1) / (f + k1 (1 - b + b L / Lbar)), f = count / L, L the class's token count, Lbar the mean of
    the two. Shapes: (N,) counts -> two (N,) float64."""
    total_c, total_w = count_correct.sum().double(), count_wrong.sum().double()
    mean_length = (total_c + total_w) / 2
    out = []
    for count, total in ((count_correct.double(), total_c), (count_wrong.double(), total_w)):
        f = count / total
        out.append(f * (BM25_K1 + 1) / (f + BM25_K1 * (1 - BM25_B + BM25_B * total / mean_length)))
    return out[0], out[1]


def key_token_scores(completion_ids: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, alpha: float,
                     beta: float, frequency: bool = True, scale: float = 1.0,
                     ignored_token_ids: Sequence[int] = ()) -> torch.Tensor:
    """Per-position key-token score s(y[i, t]) of one group (module docstring); 0 off the mask, for the
    ``ignored_token_ids`` and in groups without both correct and incorrect completions.

    Shapes: completion_ids (G, T) long, mask (G, T) {0, 1}, correct (G,) bool -> (G, T) float64."""
    out = torch.zeros(completion_ids.shape, dtype=torch.float64, device=completion_ids.device)
    present = mask.bool()
    n_correct, n_wrong = int(correct.sum()), int((~correct).sum())
    if n_correct == 0 or n_wrong == 0 or not present.any():
        return out
    tokens, inverse = torch.unique(completion_ids[present], return_inverse=True)
    rows = torch.arange(completion_ids.shape[0], device=completion_ids.device)[:, None].expand_as(completion_ids)
    rows = rows[present]
    contains = torch.zeros(completion_ids.shape[0], tokens.numel(), dtype=torch.bool, device=completion_ids.device)
    contains[rows, inverse] = True
    a = contains[correct].sum(0).double()
    b = contains[~correct].sum(0).double()
    tables = torch.stack([a, b, n_correct - a, n_wrong - b], dim=1)
    pvalues = fisher_exact_pvalues(tables)
    fisher = torch.where(pvalues < 1 - FISHER_RELATIVE_TOLERANCE, torch.exp(-2 * pvalues), torch.zeros_like(pvalues))
    gain = information_gain(tables) if beta else torch.zeros_like(fisher)
    direction = cohens_h(a / n_correct, b / n_wrong)
    if frequency:
        correct_rows = correct[rows]
        count_c = torch.bincount(inverse[correct_rows], minlength=tokens.numel())
        count_w = torch.bincount(inverse[~correct_rows], minlength=tokens.numel())
        tf_c, tf_w = bm25_frequencies(count_c, count_w)
        direction = direction + tf_c / (tf_w + 1e-5) - tf_w / (tf_c + 1e-5)
    strength = (alpha * fisher + beta * gain) * direction / (alpha + beta)
    score = (torch.sigmoid(strength) - 0.5) * 2 * scale
    if len(ignored_token_ids):
        score[torch.isin(tokens, torch.as_tensor(list(ignored_token_ids), device=tokens.device))] = 0.0
    out[present] = score[inverse]
    return out


@register_strategy("ktae")
class KTAEStrategy(AdvantageStrategy):
    """KTAE (docs/methods.md §11.4): each completion token's advantage plus its token id's key-token score in the
    group, from the group's token ids and correctness only (``sharpgrpo.strategies.correctness``). Composes after
    any advantage strategy (it adds to ``batch.advantages``).

    Metrics: ``ktae/score_abs_mean`` (masked mean |s|), ``ktae/frac_positive`` (tokens with s > 0) and
    ``ktae/frac_groups_scored`` (groups with correct and incorrect completions)."""

    metrics = ("ktae/frac_groups_scored", "ktae/frac_positive", "ktae/score_abs_mean")
    needs_old_logps = False
    needs_correctness = True
    params = ("ktae_alpha", "ktae_beta", "ktae_frequency", "ktae_scale")
    paper = StrategyPaper(
        "KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning",
        "Sun et al. 2025, KTAE: A Model-Free Algorithm to Key-Tokens Advantage Estimation in Mathematical Reasoning.",
        "2505.16826",
    )

    @classmethod
    def check_params(cls, args: Any) -> None:
        if args.ktae_alpha + args.ktae_beta <= 0:
            raise ConfigError(
                f"ktae_alpha={args.ktae_alpha:g}, ktae_beta={args.ktae_beta:g}: their sum divides the key-token "
                "strength; set at least one > 0."
            )

    @classmethod
    def inert(cls, args: Any) -> str | None:
        """Why ktae would add nothing to any advantage (None when it acts)."""
        if args.ktae_scale == 0:
            return "ktae_scale=0: every key-token score is (sigmoid(s) - 0.5) * 2 * 0 = 0, so no advantage changes"
        return None

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        args: Any = self.args
        scores = torch.zeros_like(batch.advantages, dtype=torch.float64)
        correct = batch_correct(batch).to(batch.advantages.device)
        scored = groups = 0
        for rows in group_slices(batch.group_ids):
            groups += 1
            group_correct = correct[rows]
            scored += int(bool(group_correct.any()) and not bool(group_correct.all()))
            scores[rows] = key_token_scores(batch.completion_ids[rows], batch.completion_mask[rows], group_correct,
                                            args.ktae_alpha, args.ktae_beta, args.ktae_frequency, args.ktae_scale)
        mask = batch.completion_mask.to(torch.float64)
        count = mask.sum().clamp_min(1)
        out = batch.advantages + scores.to(batch.advantages.dtype)
        return out, {
            "ktae/score_abs_mean": float((scores.abs() * mask).sum() / count),
            "ktae/frac_positive": float(((scores > 0) * mask).sum() / count),
            "ktae/frac_groups_scored": scored / max(groups, 1),
        }
