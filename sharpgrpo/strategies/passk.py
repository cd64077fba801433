"""Pass@k-mixed advantages (Chen et al. 2025, "Pass@k Training"; docs/methods.md §4; THR paper Sec. 6.2).

Per group of n = G completions, c of them correct (``sharpgrpo.strategies.correctness``: the task's answer check, else the
docs/methods.md §3 fallback; for binary rewards, the completions with reward 1):

    rho     = 1 - C(n-c, K) / C(n, K)                      # unbiased pass@K of the group
    sigma   = sqrt(rho (1 - rho))
    A_pos   = (1 - rho) / (sigma + 1e-6)
    A_neg   = (1 - rho - C(n-c-1, K-1) / C(n-1, K-1)) / (sigma + 1e-6)
    A_mixed = q * A_grpo + (1 - q) * A_passk,   q = c / n  (THR Sec. 6.2, "Pass@K-mixed")

C(a, b) is 0 when b > a or a < 0 (as scipy's ``comb`` in the reference code RUCAIBox/Passk_Training
``code/passk_adv.py``). Consequences, identical to the reference: c = 0 or c = n gives A_passk = 0 for every
completion (sigma = 0, numerators 0); n - c < K (fewer than K incorrect completions, an "easy" group) gives rho = 1 and
A_passk = 0 for all. K > n is rejected (the reference divides 0 by 0 there).
"""

from __future__ import annotations

import math
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


def _comb(n: int, k: int) -> int:
    """Binomial coefficient with C(n, k) = 0 for k > n, n < 0 or k < 0."""
    if n < 0 or k < 0 or k > n:
        return 0
    return math.comb(n, k)


def _as_correct(correct: torch.Tensor) -> torch.Tensor:
    """(G,) bool; a float tensor must hold binary rewards in {0, 1} (1 = correct)."""
    if correct.dtype == torch.bool:
        return correct
    if not bool(((correct == 0) | (correct == 1)).all()):
        values = sorted({float(v) for v in correct.flatten().tolist()})
        raise ValueError(
            "passk_mixed needs correctness as bool or binary rewards in {0, 1} (docs/methods.md §4); got values "
            f"{values[:8]}{' ...' if len(values) > 8 else ''}. Rescale the reward to 0/1 (1 = correct)."
        )
    return correct == 1


def passk_group_statistics(num_generations: int, num_correct: int, k: int) -> tuple[float, float, float]:
    """(rho, A_pos, A_neg) of one group with n = num_generations, c = num_correct (Chen et al. 2025)."""
    n, c = num_generations, num_correct
    if not 1 <= k <= n:
        raise ValueError(f"passk_k must be in [1, num_generations={n}], got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"num_correct must be in [0, {n}], got {c}")
    rho = 1.0 - _comb(n - c, k) / _comb(n, k)
    sigma = math.sqrt(rho * (1.0 - rho))
    adv_pos = (1.0 - rho) / (sigma + 1e-6)
    adv_neg = (1.0 - rho - _comb(n - c - 1, k - 1) / _comb(n - 1, k - 1)) / (sigma + 1e-6)
    return rho, adv_pos, adv_neg


def passk_advantages(correct: torch.Tensor, k: int) -> torch.Tensor:
    """Pass@K advantages of one group (docs/methods.md §4). Shapes: correct (G,) bool (or binary rewards in {0, 1})
    -> (G,) float32.

    Raises ValueError for non-binary float input or K outside [1, G]."""
    if correct.dim() != 1:
        raise ValueError(f"correct must be (G,), got {tuple(correct.shape)}")
    correct = _as_correct(correct)
    _, adv_pos, adv_neg = passk_group_statistics(correct.numel(), int(correct.sum()), k)
    pos = torch.full(correct.shape, adv_pos, dtype=torch.float32, device=correct.device)
    neg = torch.full(correct.shape, adv_neg, dtype=torch.float32, device=correct.device)
    return torch.where(correct, pos, neg)


def mixed_advantages(grpo_advantages: torch.Tensor, correct: torch.Tensor, k: int) -> torch.Tensor:
    """Pass@K-mixed (THR Sec. 6.2): q * A_grpo + (1 - q) * A_passk with q = c / n, for one group.

    Shapes: grpo_advantages (G,) or (G, T); correct (G,) bool (or binary rewards) -> same shape as
    grpo_advantages."""
    correct = _as_correct(correct)
    passk = passk_advantages(correct, k).to(grpo_advantages.device, grpo_advantages.dtype)
    q = float(correct.sum()) / correct.numel()
    if grpo_advantages.dim() == 2:
        passk = passk[:, None]
    return q * grpo_advantages + (1.0 - q) * passk


@register_strategy("passk_mixed")
class PassKMixedStrategy(AdvantageStrategy):
    """Pass@K-mixed advantages (docs/methods.md §4). Config attribute: ``passk_k``. c counts the correct completions of
    each group (``sharpgrpo.strategies.correctness.batch_correct``: the reward functions' answer checks, else the docs/methods.md §3
    fallback, which for binary {0, 1} rewards is reward == 1).

    ``batch.advantages`` (B, T) is used as A_grpo (row j's token advantages), so the strategy composes after another
    advantage strategy (e.g. ``thr``); the pass@K term is broadcast over tokens (padding included; the loss masks it).
    Metrics: ``passk/pass_at_k`` (mean rho over groups) and ``passk/mix_q`` (mean q = c / n)."""

    metrics = ("passk/pass_at_k", "passk/mix_q")
    needs_old_logps = False
    needs_correctness = True
    params = ("passk_k",)
    paper = StrategyPaper(
        "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning Models",
        "Chen et al. 2025, Pass@k Training for Adaptively Balancing Exploration and Exploitation.",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        if not 1 <= args.passk_k <= args.num_generations:
            raise ConfigError(
                f"passk_k={args.passk_k}: must be an integer in [1, num_generations={args.num_generations}]."
            )

    def __init__(self, args: Any):
        super().__init__(args)
        self.k = int(args.passk_k)

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        out = batch.advantages.clone()
        rhos, qs = [], []
        correct = batch_correct(batch)
        for rows in group_slices(batch.group_ids):
            group_correct = correct[rows].to(batch.advantages.device)
            out[rows] = mixed_advantages(batch.advantages[rows], group_correct, self.k)
            num_correct = int(group_correct.sum())
            rhos.append(passk_group_statistics(group_correct.numel(), num_correct, self.k)[0])
            qs.append(num_correct / group_correct.numel())
        metrics = {"passk/pass_at_k": sum(rhos) / max(len(rhos), 1), "passk/mix_q": sum(qs) / max(len(qs), 1)}
        return out, metrics
