"""GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673): maximise the geometric mean of a
sequence's token ratios instead of their arithmetic mean, with a sign-aware token clip in log space:

    l[i,t]  = A>0: min(log r, clip(log r, -eps_low, eps_high));   A<=0: max(log r, clip(log r, -eps_low, eps_high))
    J_i     = exp( sum_t l[i,t] m[i,t] / max(1, sum_t m[i,t]) ) A_i        m = completion mask (x TRL's entropy mask)
    loss    = -mean_i J_i                                                   (+ beta * each sequence's token-mean KL)

A sequence-level objective: the strategy returns ``LossTerms.sequence_loss``, which replaces the per-token surrogate
and its aggregation (``sharpgrpo.training.loss.terms.sequence_objective_loss``). Released code: TRL 1.16
``trl/experimental/gmpo/gmpo_trainer.py`` (``GMPOTrainer._compute_loss``, installed: parity test) and verl
``verl/trainer/ppo/core_algos.py`` ``compute_policy_loss_geo_mean`` (token advantages averaged per sequence).
"""

from __future__ import annotations

import math
import warnings

import torch

from sharpgrpo.strategies.base import (
    LossContext,
    LossTerms,
    StrategyPaper,
    TokenLossStrategy,
    masked_mean,
    register_strategy,
)

GMPO_PAPER = StrategyPaper(
    title="Geometric-Mean Policy Optimization",
    citation="""@article{zhao2025gmpo,
    title   = {{Geometric-Mean Policy Optimization}},
    author  = {Yuzhong Zhao and Yue Liu and Junpeng Liu and Jingye Chen and Xun Wu and Yaru Hao and Tengchao Lv and
               Shaohan Huang and Lei Cui and Qixiang Ye and Fang Wan and Furu Wei},
    journal = {arXiv preprint arXiv:2507.20673},
    year    = {2025}
}""",
    id="2507.20673",
)


def clipped_log_ratio(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, epsilon_low: float, epsilon_high: float
) -> torch.Tensor:
    """GMPO's token clip in log space, sign-aware (PPO's min written in logs): A > 0 -> min(log r, clip(log r)),
    A <= 0 -> max(log r, clip(log r)), clip to [-epsilon_low, epsilon_high]. Shapes: ``logps``, ``old_logps`` (B, T),
    ``advantages`` (B, 1) or (B, T) -> (B, T), with the gradient of ``logps``."""
    log_ratio = logps - old_logps
    clamped = torch.clamp(log_ratio, min=-epsilon_low, max=epsilon_high)
    return torch.where(advantages > 0, torch.minimum(log_ratio, clamped), torch.maximum(log_ratio, clamped))


def gmpo_sequence_loss(
    logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
    epsilon_low: float, epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GMPO's per-sequence loss -exp(mean_t clipped log r) A_i (module docstring). Token advantages (B, T) are
    averaged over each sequence's tokens (verl's geo_mean). Shapes: ``logps``, ``old_logps``, ``mask`` (B, T);
    ``advantages`` (B, 1) or (B, T). Returns (loss (B,), the geometric-mean ratio (B,))."""
    mask = mask.to(logps.dtype)
    lengths = mask.sum(-1).clamp(min=1.0)
    sequence_advantages = advantages.expand_as(logps)
    sequence_advantages = (sequence_advantages * mask).sum(-1) / lengths if advantages.shape[-1] > 1 else (
        advantages[:, 0]
    )
    clipped = clipped_log_ratio(logps, old_logps, sequence_advantages.unsqueeze(-1), epsilon_low, epsilon_high)
    ratio = torch.exp((clipped * mask).sum(-1) / lengths)
    return -ratio * sequence_advantages, ratio


@register_strategy("gmpo")
class GMPO(TokenLossStrategy):
    """GMPO's sequence objective (``gmpo_epsilon_low``, ``gmpo_epsilon_high``), alone and with ``loss_type: grpo``.

    The clip range it reports to the loss (for TRL's ``clip_ratio/*`` metrics, which then count what TRL's
    GMPOTrainer counts) is its log-space range in ratio terms: [exp(-eps_low), exp(eps_high)]."""

    metrics = ("gmpo/sequence_ratio_mean",)
    params = ("gmpo_epsilon_low", "gmpo_epsilon_high")
    paper = GMPO_PAPER
    loss_types = ("grpo",)
    sets = frozenset({"clip_range", "sequence_loss"})

    @classmethod
    def check_config(cls, args) -> None:
        super().check_config(args)
        if args.beta != 0.0 and args.use_bias_correction_kl:
            warnings.warn(
                "strategies: gmpo with beta > 0 and use_bias_correction_kl=true multiplies the KL term by the token "
                "ratio (TRL's GRPO semantics); TRL's GMPOTrainer ignores use_bias_correction_kl (plain k3). Set "
                "use_bias_correction_kl: false to train as trl.experimental.gmpo does.",
                UserWarning,
                stacklevel=2,
            )

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        low, high = self.args.gmpo_epsilon_low, self.args.gmpo_epsilon_high
        mask = context.mask if context.entropy_mask is None else context.mask * context.entropy_mask
        loss, ratio = gmpo_sequence_loss(context.logps, context.old_logps, context.advantages, mask,
                                         epsilon_low=low, epsilon_high=high)
        terms = LossTerms(sequence_loss=loss, epsilon_low=context.logps.new_tensor(1 - math.exp(-low)),
                          epsilon_high=context.logps.new_tensor(math.exp(high) - 1))
        has_tokens = context.mask.sum(-1) > 0
        return terms, {"gmpo/sequence_ratio_mean": masked_mean(ratio.detach(), has_tokens)}
