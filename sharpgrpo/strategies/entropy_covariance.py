"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617): restrict the update of the few tokens whose covariance between log-probability and
advantage is largest, the tokens that drive policy entropy down.

Both read the per-token statistic CW-GRPO weights smoothly (docs/methods.md §2), here over one micro-batch's tokens:

    c[i,t] = (A[i,t] - mean A) (log p[i,t] - mean log p)           means over the micro-batch's valid tokens

and select tokens by hard rules (the released code: verl ``verl/trainer/ppo/core_algos.py``
``compute_policy_loss_clip_cov`` / ``compute_policy_loss_kl_cov``, from the authors' PRIME-RL/Entropy-Mechanism-of-RL):

* Clip-Cov: among the tokens whose PPO clip is inactive and with lb < c < ub, a uniformly random subset of
  n = max(floor(r N), 1) tokens (N the valid tokens) has its policy term removed.
* KL-Cov: the k = max(floor(k_ratio N), 1) tokens with the largest c get beta |log p - log p_old| added to their loss.

Pure torch, with no host synchronisation: the count stays a device tensor, and selection ranks the tokens by sorting.
"""

from __future__ import annotations

from typing import Any

import torch

from sharpgrpo.strategies.base import (
    LossContext,
    LossTerms,
    StrategyPaper,
    TokenLossStrategy,
    masked_mean,
    register_strategy,
    unclipped_range,
    warn_on_policy,
)
from sharpgrpo.strategies.loss_types import PPO_CLIP_LOSS_TYPES
from sharpgrpo.validation import ConfigError

ENTROPY_MECHANISM_PAPER = StrategyPaper(
    title="The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models",
    citation="""@article{cui2025entropy,
    title   = {{The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models}},
    author  = {Ganqu Cui and Yuchen Zhang and Jiacheng Chen and Lifan Yuan and Zhi Wang and Yuxin Zuo and Haozhan Li
               and Yuchen Fan and Huayu Chen and Weize Chen and Zhiyuan Liu and Hao Peng and Lei Bai and Wanli Ouyang
               and Yu Cheng and Bowen Zhou and Ning Ding},
    journal = {arXiv preprint arXiv:2505.22617},
    year    = {2025}
}""",
    id="2505.22617",
)


def token_covariance(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cui et al. 2025 (the covariance behind entropy change): c[i,t] = (A[i,t] - mean A)(log p[i,t] - mean log p),
    both means over the valid tokens of the micro-batch (token-weighted, as verl's ``masked_mean``).

    Shapes: ``logps`` (B, T) detached; ``advantages`` (B, 1) or (B, T); ``mask`` (B, T) -> c (B, T)."""
    mask = mask.to(logps.dtype)
    advantages = advantages.to(logps.dtype).expand_as(logps)
    count = mask.sum().clamp(min=1.0)
    mean_advantage = (advantages * mask).sum() / count
    mean_logp = (logps * mask).sum() / count
    return (advantages - mean_advantage) * (logps - mean_logp)


def selection_count(mask: torch.Tensor, ratio: float) -> torch.Tensor:
    """max(floor(ratio * N), 1), N the valid tokens of ``mask`` (B, T): a 0-d device tensor (no host read), in
    float64 as Python's ``int(ratio * N)`` in verl (float32 where the device has no float64)."""
    dtype = torch.float32 if mask.device.type == "mps" else torch.float64
    return torch.floor(ratio * mask.sum().to(dtype)).clamp(min=1).long()


def smallest_keys(candidates: torch.Tensor, keys: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The ``count`` candidates with the smallest ``keys`` (all of them when fewer): with i.i.d. uniform keys, a
    uniformly random subset of min(count, #candidates) candidates, as verl's ``randperm`` draws it.
    Shapes: ``candidates`` (B, T) bool, ``keys`` (B, T) -> (B, T) bool."""
    ranked = torch.where(candidates, keys, torch.full_like(keys, float("inf")))
    order = ranked.flatten().argsort(stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return (rank.view_as(candidates) < count) & candidates


def clip_cov_selection(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
    epsilon_low: float, epsilon_high: float, ratio: float, lower: float, upper: float, keys: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clip-Cov's selection (Cui et al. 2025, Clip-Cov): a token is a candidate when it is valid, PPO's clip does not
    already silence it (-A clip(r, 1-eps_low, 1+eps_high) <= -A r) and lower < c < upper; a random
    max(floor(ratio N), 1) of the candidates (by smallest ``keys``) are selected.

    Shapes: ``logps``, ``old_logps``, ``mask``, ``keys`` (B, T); ``advantages`` (B, 1) or (B, T).
    Returns (selected (B, T) bool, candidates (B, T) bool, c (B, T))."""
    logps = logps.detach()
    advantages = advantages.expand_as(logps)
    ratio_r = torch.exp(logps - old_logps)
    clipped = -advantages * torch.clamp(ratio_r, 1 - epsilon_low, 1 + epsilon_high) > -advantages * ratio_r
    covariance = token_covariance(logps, advantages, mask)
    valid = mask.bool()
    candidates = valid & ~clipped & (covariance > lower) & (covariance < upper)
    selected = smallest_keys(candidates, keys, selection_count(mask, ratio))
    return selected, candidates, covariance


def kl_cov_selection(
    logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, ratio: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-Cov's selection (Cui et al. 2025, KL-Cov): the max(floor(ratio N), 1) valid tokens with the largest c.
    Shapes: ``logps`` (B, T), ``advantages`` (B, 1) or (B, T), ``mask`` (B, T) -> (selected (B, T) bool, c (B, T))."""
    covariance = token_covariance(logps.detach(), advantages, mask)
    valid = mask.bool()
    # Largest first = smallest -c; invalid tokens last.
    selected = smallest_keys(valid, -covariance, selection_count(mask, ratio))
    return selected, covariance


def kl_cov_penalty(logps: torch.Tensor, old_logps: torch.Tensor, selected: torch.Tensor, coef: float) -> torch.Tensor:
    """KL-Cov's per-token penalty, added to the policy term of the selected tokens: coef |log p - log p_old|
    (with the gradient of log p; |x| has gradient 0 at x = 0, so on-policy it acts only from the second update on a
    batch). Shapes: (B, T) -> (B, T)."""
    return coef * (logps - old_logps).abs() * selected.to(logps.dtype)


@register_strategy("clip_cov")
class ClipCov(TokenLossStrategy):
    """Clip-Cov: the policy term of a random ``clip_cov_ratio`` of the tokens with ``clip_cov_lb`` < c <
    ``clip_cov_ub`` is removed (released) or detached (``clip_cov_keep_value``). The random keys come from a CPU
    generator seeded with ``seed`` + process index and checkpointed."""

    metrics = ("clip_cov/frac_candidates", "clip_cov/frac_selected", "clip_cov/mean_cov", "clip_cov/mean_cov_selected")
    params = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "clip_cov_keep_value")
    paper = ENTROPY_MECHANISM_PAPER
    loss_types = PPO_CLIP_LOSS_TYPES

    @classmethod
    def check_params(cls, args: Any) -> None:
        if args.clip_cov_lb >= args.clip_cov_ub:
            raise ConfigError(f"clip_cov_lb={args.clip_cov_lb}: must be below clip_cov_ub={args.clip_cov_ub}.")

    def __init__(self, args):
        super().__init__(args)
        self.generator = torch.Generator(device="cpu").manual_seed(int(args.seed) + int(args.process_index))

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        args = self.args
        keys = torch.rand(context.logps.shape, generator=self.generator).to(context.logps.device)
        selected, candidates, covariance = clip_cov_selection(
            context.logps, context.old_logps, context.advantages, context.mask,
            epsilon_low=context.epsilon_low, epsilon_high=context.epsilon_high, ratio=args.clip_cov_ratio,
            lower=args.clip_cov_lb, upper=args.clip_cov_ub, keys=keys,
        )
        kept = (~selected).to(context.logps.dtype)
        terms = LossTerms(gradient_mask=kept) if args.clip_cov_keep_value else LossTerms(token_mask=kept)
        valid = context.mask.bool()
        metrics = {
            "clip_cov/frac_selected": masked_mean(selected.float(), valid),
            "clip_cov/frac_candidates": masked_mean(candidates.float(), valid),
            "clip_cov/mean_cov_selected": masked_mean(covariance, selected),
            "clip_cov/mean_cov": masked_mean(covariance, valid),
        }
        return terms, metrics

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


@register_strategy("kl_cov")
class KLCov(TokenLossStrategy):
    """KL-Cov: beta |log p - log p_old| added to the ``kl_cov_ratio`` tokens of largest c; as released, on the
    unclipped surrogate -r A (``kl_cov_keep_clip`` keeps the configured clip)."""

    metrics = ("kl_cov/abs_log_ratio_selected", "kl_cov/frac_selected", "kl_cov/mean_cov_selected")
    params = ("kl_cov_ratio", "kl_cov_coef", "kl_cov_keep_clip")
    paper = ENTROPY_MECHANISM_PAPER
    loss_types = (*PPO_CLIP_LOSS_TYPES, "cispo")
    sets = frozenset({"clip_range"})

    @classmethod
    def inert(cls, args: Any) -> str | None:
        """Why kl_cov would train exactly as plain GRPO (None when it acts): no penalty and the clip kept."""
        if args.kl_cov_coef == 0 and args.kl_cov_keep_clip:
            return ("kl_cov_coef=0 adds no penalty and kl_cov_keep_clip=true keeps the configured clip, so the loss is "
                    "plain GRPO's")  # fmt: skip
        return None

    @classmethod
    def check_config(cls, args: Any) -> None:
        super().check_config(args)
        warn_on_policy("kl_cov", "its penalty |log p - log p_old| is 0 with gradient 0, so kl_cov is the "
                        "unclipped surrogate", args)

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        args = self.args
        selected, covariance = kl_cov_selection(context.logps, context.advantages, context.mask, args.kl_cov_ratio)
        penalty = kl_cov_penalty(context.logps, context.old_logps, selected, args.kl_cov_coef)
        terms = LossTerms(extra_loss=penalty)
        if not args.kl_cov_keep_clip:
            terms.epsilon_low, terms.epsilon_high = unclipped_range(context.logps)
        valid = context.mask.bool()
        metrics = {
            "kl_cov/frac_selected": masked_mean(selected.float(), valid),
            "kl_cov/mean_cov_selected": masked_mean(covariance, selected),
            "kl_cov/abs_log_ratio_selected": masked_mean((context.logps - context.old_logps).detach().abs(),
                                                          selected),
        }
        return terms, metrics


