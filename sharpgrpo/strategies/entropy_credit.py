"""Advantage strategies driven by the sampling policy's per-token entropy (docs/methods.md §11).

* ``entropy_shaping`` (Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective", arXiv 2506.14758):
  A'[i, t] = A[i, t] + min(alpha * sg[H[i, t]], |A[i, t]| / kappa). The bonus is >= 0 and at most |A| / kappa, so for
  kappa >= 1 it never flips the sign of an advantage: it raises the credit of high-entropy (exploratory) tokens of
  correct completions and softens the penalty of those of incorrect ones.
* ``gtpo`` (Tan et al. 2025, "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy",
  arXiv 2508.04349): per group, token rewards redistributed by entropy share. For a correct completion i (the set
  O+) and position t, with d_t the number of correct completions that have a token at t,

      r+[i, t] = alpha_1 * 1 + alpha_2 * H[i, t] / sum_{k in O+} H[k, t] * d_t                    (GTPO Eq. 3)

  and for an incorrect completion j (O-), h_t the number of incorrect completions with a token at t, the confident
  (low-entropy) mistakes taking the larger share of the penalty,

      r-[j, t] = -alpha_1 - alpha_2 * (1 / H[j, t]) / sum_{k in O-} (1 / H[k, t]) * h_t           (GTPO Eq. 5)

  then normalised to advantages over the group's tokens (Eq. 6). The sequence form GRPO-S does the same with each
  completion's mean token entropy and one reward per completion (``gtpo_level: sequence``).

Both read ``GenerationBatch.entropies`` (``needs_entropies``): the entropy of the policy that sampled the batch,
detached by construction (sg[.]).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    group_slices,
    masked_mean,
    register_strategy,
)
from sharpgrpo.strategies.correctness import batch_correct

GTPO_EPS = 1e-8  # the denominators of the shares and of the normalisation (GTPO Remark 2.1's epsilon)


def _sampling_entropies(batch: GenerationBatch, name: str) -> torch.Tensor:
    if batch.entropies is None:
        raise ValueError(f"{name} needs GenerationBatch.entropies (the trainer fills it for `needs_entropies`).")
    return batch.entropies.to(batch.advantages.dtype)


def _mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(values, mask))


def entropy_shaped_advantages(advantages: torch.Tensor, entropies: torch.Tensor, alpha: float, kappa: float
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Cheng et al. 2025: A' = A + min(alpha * sg[H], |A| / kappa). Shapes: advantages (B, T) (or (B, 1)),
    entropies (B, T) -> (A' (B, T), the bonus (B, T))."""
    bonus = torch.minimum(alpha * entropies.detach(), advantages.abs() / kappa)
    return advantages + bonus, bonus


def gtpo_shaped_token_rewards(entropies: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, alpha1: float,
                              alpha2: float, eps: float = GTPO_EPS) -> torch.Tensor:
    """GTPO Eq. 3 (correct completions) and Eq. 5 (incorrect ones) for one group; 0 off the mask.

    Shapes: entropies (G, T), mask (G, T) {0, 1}, correct (G,) bool -> (G, T) shaped token rewards."""
    m = mask.to(entropies.dtype)
    pos = m * correct.to(m.dtype)[:, None]
    neg = m * (~correct).to(m.dtype)[:, None]
    h = entropies.detach().clamp_min(0)
    d = pos.sum(0, keepdim=True)  # (1, T): correct completions alive at t
    share_pos = h * pos / (h * pos).sum(0, keepdim=True).clamp_min(eps)
    inverse = 1.0 / (h + eps)
    hneg = neg.sum(0, keepdim=True)
    share_neg = inverse * neg / (inverse * neg).sum(0, keepdim=True).clamp_min(eps)
    return pos * (alpha1 + alpha2 * share_pos * d) - neg * (alpha1 + alpha2 * share_neg * hneg)


def gtpo_shaped_sequence_rewards(entropies: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, alpha1: float,
                                 alpha2: float, eps: float = GTPO_EPS) -> torch.Tensor:
    """GRPO-S: GTPO's shaping with one reward per completion, from its mean token entropy Hbar_i:
    r+_i = alpha_1 + alpha_2 * Hbar_i / sum_{O+} Hbar * |O+|, r-_j = -alpha_1 - alpha_2 * (1/Hbar_j) / sum_{O-} (1/Hbar)
    * |O-|. Shapes: entropies (G, T), mask (G, T), correct (G,) bool -> (G,)."""
    m = mask.to(entropies.dtype)
    mean_h = (entropies.detach().clamp_min(0) * m).sum(1) / m.sum(1).clamp_min(1)
    pos, neg = correct.to(m.dtype), (~correct).to(m.dtype)
    share_pos = mean_h * pos / (mean_h * pos).sum().clamp_min(eps)
    inverse = 1.0 / (mean_h + eps)
    share_neg = inverse * neg / (inverse * neg).sum().clamp_min(eps)
    return pos * (alpha1 + alpha2 * share_pos * pos.sum()) - neg * (alpha1 + alpha2 * share_neg * neg.sum())


def normalise_shaped_rewards(rewards: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, separate: bool,
                             eps: float = GTPO_EPS) -> torch.Tensor:
    """GTPO Eq. 6: (r - mean) / (std + eps) over the masked entries (population std), of the whole group or of the
    correct and the incorrect completions' entries separately. Shapes: rewards (G, T), mask (G, T), correct (G,)
    -> (G, T), 0 off the mask. (The sequence form passes (G, 1) rewards and an all-ones (G, 1) mask.)"""
    m = mask.to(rewards.dtype)
    sets = [m * correct.to(m.dtype)[:, None], m * (~correct).to(m.dtype)[:, None]] if separate else [m]
    out = torch.zeros_like(rewards)
    for members in sets:
        count = members.sum()
        if count == 0:
            continue
        mean = (rewards * members).sum() / count
        std = (((rewards - mean) ** 2) * members).sum().div(count).sqrt()
        out = out + members * (rewards - mean) / (std + eps)
    return out


def gtpo_advantages(entropies: torch.Tensor, mask: torch.Tensor, correct: torch.Tensor, alpha1: float,
                    alpha2: float, level: str = "token", separate: bool = False) -> torch.Tensor:
    """GTPO (``level`` token) or GRPO-S (``level`` sequence) advantages of one group. Shapes: entropies (G, T),
    mask (G, T), correct (G,) bool -> (G, T) (the sequence form broadcast over t; 0 off the mask)."""
    if level == "sequence":
        rewards = gtpo_shaped_sequence_rewards(entropies, mask, correct, alpha1, alpha2)[:, None]
        ones = torch.ones_like(rewards)
        return normalise_shaped_rewards(rewards, ones, correct, separate) * mask.to(rewards.dtype)
    rewards = gtpo_shaped_token_rewards(entropies, mask, correct, alpha1, alpha2)
    return normalise_shaped_rewards(rewards, mask, correct, separate)


@register_strategy("entropy_shaping")
class EntropyShapingStrategy(AdvantageStrategy):
    """Entropy advantage shaping (docs/methods.md §11.2): A' = A + min(alpha sg[H], |A| / kappa) on every token, H the
    sampling policy's entropy. Composes after any advantage strategy (it shapes ``batch.advantages``).

    Metrics: ``entropy_shaping/bonus_mean`` (masked mean of the bonus), ``entropy_shaping/frac_capped`` (tokens whose
    bonus is the cap |A| / kappa), ``entropy_shaping/entropy_mean``."""

    metrics = ("entropy_shaping/bonus_mean", "entropy_shaping/entropy_mean", "entropy_shaping/frac_capped")
    needs_old_logps = False
    needs_entropies = True
    params = ("entropy_shaping_alpha", "entropy_shaping_kappa")
    paper = StrategyPaper(
        "Reasoning with Exploration: An Entropy Perspective",
        "Cheng et al. 2025, Reasoning with Exploration: An Entropy Perspective.",
        "2506.14758",
    )

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.completion_mask.to(batch.advantages.dtype)
        entropies = _sampling_entropies(batch, "entropy_shaping")
        shaped, bonus = entropy_shaped_advantages(batch.advantages, entropies, self.args.entropy_shaping_alpha,
                                                  self.args.entropy_shaping_kappa)
        shaped = torch.where(mask.bool(), shaped, batch.advantages)
        capped = (batch.advantages.abs() / self.args.entropy_shaping_kappa < self.args.entropy_shaping_alpha * entropies)
        return shaped, {
            "entropy_shaping/bonus_mean": _mean(bonus, mask),
            "entropy_shaping/frac_capped": _mean(capped.to(mask.dtype), mask),
            "entropy_shaping/entropy_mean": _mean(entropies, mask),
        }


@register_strategy("gtpo")
class GTPOStrategy(AdvantageStrategy):
    """GTPO / GRPO-S (docs/methods.md §11.3): per group, token (or sequence) rewards shaped by the entropy share, +1
    for correct and -1 for incorrect completions (``sharpgrpo.strategies.correctness``), normalised over the group.
    Replaces the incoming advantages (like TRL's, they come from the outcome rewards).

    Metrics: ``gtpo/frac_positive`` (tokens with A > 0), ``gtpo/abs_mean``, ``gtpo/entropy_mean``."""

    metrics = ("gtpo/abs_mean", "gtpo/entropy_mean", "gtpo/frac_positive")
    needs_old_logps = False
    needs_entropies = True
    needs_correctness = True
    params = ("gtpo_alpha1", "gtpo_alpha2", "gtpo_level", "gtpo_normalization")
    paper = StrategyPaper(
        "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy",
        "Tan et al. 2025, GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy.",
        "2508.04349",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        """Warn when advantage strategies listed before ``gtpo`` would have their output replaced."""
        from sharpgrpo.strategies.base import STRATEGIES

        names = list(args.strategies)
        if "gtpo" not in names:  # selected by a dotted path: nothing to say
            return
        earlier = [n for n in names[: names.index("gtpo")] if STRATEGIES.get(n).kind == "advantage"]
        if earlier:
            warnings.warn(
                f"strategies={names}: gtpo replaces the token advantages of {earlier} listed before it (it computes "
                "its own from the outcomes); list gtpo first to compose them (docs/methods.md §11.3).",
                UserWarning,
                stacklevel=2,
            )

    @classmethod
    def inert(cls, args: Any) -> str | None:
        if args.gtpo_alpha1 == 0 and args.gtpo_alpha2 == 0:
            return ("gtpo_alpha1 = gtpo_alpha2 = 0: every shaped reward is 0, so every advantage, the loss and its "
                    "gradient are 0 at every step")  # fmt: skip
        return None

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        args: Any = self.args
        out = torch.zeros_like(batch.advantages)
        correct = batch_correct(batch).to(out.device)
        entropies = _sampling_entropies(batch, "gtpo")
        for rows in group_slices(batch.group_ids):
            out[rows] = gtpo_advantages(entropies[rows], batch.completion_mask[rows], correct[rows],
                                        args.gtpo_alpha1, args.gtpo_alpha2, args.gtpo_level,
                                        args.gtpo_normalization == "separate")
        mask = batch.completion_mask.to(out.dtype)
        return out, {
            "gtpo/frac_positive": _mean((out > 0).to(out.dtype), mask),
            "gtpo/abs_mean": _mean(out.abs(), mask),
            "gtpo/entropy_mean": _mean(entropies, mask),
        }
