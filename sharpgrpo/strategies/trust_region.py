"""DPPO (Divergence Proximal Policy Optimization, "Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv 2602.04879): a per-token trust region on the probability itself, not on the ratio, conditioned on the sign of
the advantage. A token leaves the trust region, and its policy term is removed, when the update moves its probability
further than delta in the direction its advantage pushes:

    Binary-TV:  A > 0: p - p_old > delta_high;                      A <= 0: p - p_old < -delta_low
    Binary-KL:  A > 0: p > p_old and D(p_old || p) > delta_high;    A <= 0: p < p_old and D(p_old || p) > delta_low
    D(q || p) = q log(q / p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))     (Bernoulli KL, as verl computes it)

Released code: verl ``verl/trainer/ppo/core_algos.py`` ``compute_policy_loss_dppo_tv`` / ``_dppo_kl``, where the mask
replaces PPO's ratio clip and the surrogate is -A sg[min(r, C)] log p (truncated importance sampling): TRL's
``cispo`` surrogate with ``epsilon_high`` = C, or, with PPO-clip loss types, -r A without the clip (C = inf).
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

DPPO_PAPER = StrategyPaper(
    title="Rethinking the Trust Region in LLM Reinforcement Learning",
    citation="""@article{dppo2026,
    title   = {{Rethinking the Trust Region in LLM Reinforcement Learning}},
    journal = {arXiv preprint arXiv:2602.04879},
    year    = {2026}
}""",
    id="2602.04879",
)


def tv_trust_region_mask(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, delta_low: float, delta_high: float
) -> torch.Tensor:
    """DPPO Binary-TV: 1 where the token stays in the trust region, A > 0: p - p_old <= delta_high, A <= 0:
    p - p_old >= -delta_low. Shapes: ``logps``, ``old_logps`` (B, T); ``advantages`` (B, 1) or (B, T) -> (B, T)
    {0, 1}, detached."""
    difference = torch.exp(logps.detach()) - torch.exp(old_logps)
    inside = torch.where(advantages > 0, difference <= delta_high, difference >= -delta_low)
    return inside.to(logps.dtype)


def binary_kl(old_logps: torch.Tensor, logps: torch.Tensor) -> torch.Tensor:
    """Bernoulli KL D(p_old || p) of the sampled token's probability: p_old (log p_old - log p) + (1 - p_old)
    log((1 - p_old + 1e-8) / (1 - p + 1e-8)) (the 1e-8 as verl). Shapes: (B, T) -> (B, T)."""
    old_p, p = torch.exp(old_logps), torch.exp(logps)
    return old_p * (old_logps - logps) + (1 - old_p) * torch.log((1 - old_p + 1e-8) / (1 - p + 1e-8))


def kl_trust_region_mask(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, delta_low: float, delta_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPPO Binary-KL: 1 where the token stays in the trust region: A > 0: D <= delta_high or p <= p_old;
    A <= 0: D <= delta_low or p >= p_old. Shapes as ``tv_trust_region_mask``. Returns (mask (B, T) {0, 1}, D)."""
    logps = logps.detach()
    divergence = binary_kl(old_logps, logps)
    p, old_p = torch.exp(logps), torch.exp(old_logps)
    inside = torch.where(advantages > 0, (divergence <= delta_high) | (p <= old_p),
                         (divergence <= delta_low) | (p >= old_p))
    return inside.to(logps.dtype), divergence


class _DPPO(TokenLossStrategy):
    paper = DPPO_PAPER
    loss_types = (*PPO_CLIP_LOSS_TYPES, "cispo")
    sets = frozenset({"clip_range"})

    @classmethod
    def check_config(cls, args: Any) -> None:
        super().check_config(args)
        warn_on_policy(cls.registered_name(), "p = p_old, so every token is inside the trust region and the mask "
                        "removes nothing", args)

    def trust_region(self, context: LossContext) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        inside, metrics = self.trust_region(context)
        terms = LossTerms(token_mask=inside)
        if not self.args.dppo_keep_clip and self.args.loss_type in PPO_CLIP_LOSS_TYPES:
            terms.epsilon_low, terms.epsilon_high = unclipped_range(context.logps)  # the mask replaces the clip
        valid = context.mask.bool()
        positive = valid & (context.advantages > 0)
        outside = 1.0 - inside
        metrics = {
            "dppo/frac_masked": masked_mean(outside, valid),
            "dppo/frac_masked_positive": masked_mean(outside, positive),
            "dppo/frac_masked_negative": masked_mean(outside, valid & ~positive),
            **metrics,
        }
        return terms, metrics


@register_strategy("dppo_tv")
class DPPOBinaryTV(_DPPO):
    """DPPO-Binary-TV trust-region mask (``dppo_tv_low``, ``dppo_tv_high``)."""

    metrics = ("dppo/frac_masked", "dppo/frac_masked_positive", "dppo/frac_masked_negative", "dppo/mean_abs_prob_diff")
    params = ("dppo_tv_low", "dppo_tv_high", "dppo_keep_clip")

    def trust_region(self, context):
        inside = tv_trust_region_mask(context.logps, context.old_logps, context.advantages, self.args.dppo_tv_low,
                                      self.args.dppo_tv_high)
        difference = (torch.exp(context.logps.detach()) - torch.exp(context.old_logps)).abs()
        return inside, {"dppo/mean_abs_prob_diff": masked_mean(difference, context.mask.bool())}


@register_strategy("dppo_kl")
class DPPOBinaryKL(_DPPO):
    """DPPO-Binary-KL trust-region mask (``dppo_kl_low``, ``dppo_kl_high``)."""

    metrics = ("dppo/frac_masked", "dppo/frac_masked_positive", "dppo/frac_masked_negative", "dppo/mean_binary_kl")
    params = ("dppo_kl_low", "dppo_kl_high", "dppo_keep_clip")

    def trust_region(self, context):
        inside, divergence = kl_trust_region_mask(context.logps, context.old_logps, context.advantages,
                                                  self.args.dppo_kl_low, self.args.dppo_kl_high)
        return inside, {"dppo/mean_binary_kl": masked_mean(divergence, context.mask.bool())}
