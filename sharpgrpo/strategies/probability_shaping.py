"""Probability-shaped token weights: GRPO-SG / TR-GRPO and the papers' ablations, plus AR-Lopti (docs/methods.md §1).

GRPO-SG (Sharpness-Guided GRPO, newest version of TR-GRPO) damps the gradients of sharp, low-probability tokens
by giving higher-probability tokens a larger weight:

    w = clip( alpha * ( sigmoid( sg[p] / tau ) - mu ), L, U )        GRPO-SG Eq. 19 / TR-GRPO Eq. 12

with p the detached, temperature-scaled probability of the sampled token under the current policy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    TokenWeightStrategy,
    register_strategy,
)
from sharpgrpo.validation import ConfigError


def probability_shaping_weights(
    probs: torch.Tensor, alpha: float, mu: float, tau: float, lower: float, upper: float
) -> torch.Tensor:
    """GRPO-SG Eq. 19: w = clip(alpha*(sigmoid(p/tau) - mu), L, U). Shapes: probs (...) -> w (...), no gradient."""
    probs = probs.detach()
    return (alpha * (torch.sigmoid(probs / tau) - mu)).clamp(min=lower, max=upper)


def reverse_probability_shaping_weights(
    probs: torch.Tensor, alpha: float, mu: float, tau: float, lower: float, upper: float
) -> torch.Tensor:
    """TR-GRPO Table 4 'Reverse' ablation: w' = 2 - w with w of Eq. 19 (favours low-probability tokens)."""
    return 2.0 - probability_shaping_weights(probs, alpha, mu, tau, lower, upper)


def ratio_silenced_range(
    weight_fn: Callable[[torch.Tensor], torch.Tensor], epsilon_high: float, iterations: int = 60
) -> tuple[float, float] | None:
    """The token probabilities p in [0, 1] whose positive-advantage tokens get no gradient on-policy under
    ``weight_placement: ratio``: those with w(p) > 1 + eps_high (r = 1, so w*r lands in the clipped branch).

    ``weight_fn`` maps probabilities (float64) to weights and must be monotone in p (Eq. 19 and its reverse are).
    Returns ``(low, high)`` with the silenced set ``(low, high]`` / ``[low, high)`` up to the bisection's
    resolution 2^-iterations, or None when no p is silenced. With the docs/methods.md §1 defaults (alpha 2, mu 0.25,
    tau 1/9, clip [1, 1.4], eps_high 0.24) it is p > 0.2112 (= tau * logit((1 + eps_high)/alpha + mu)).
    """
    limit = 1.0 + epsilon_high

    def silenced(p: float) -> bool:
        return bool(weight_fn(torch.tensor([p], dtype=torch.float64))[0] > limit)

    at_zero, at_one = silenced(0.0), silenced(1.0)
    if at_zero and at_one:
        return 0.0, 1.0
    if not at_zero and not at_one:
        return None
    low, high = 0.0, 1.0  # invariant: silenced(low) == at_zero, silenced(high) == at_one
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        if silenced(middle) == at_zero:
            low = middle
        else:
            high = middle
    return (high, 1.0) if at_one else (0.0, low)


def ar_token_advantages(old_probs: torch.Tensor, advantages: torch.Tensor, alpha: float) -> torch.Tensor:
    """AR-Lopti (Yang et al. 2025): A[i,t] = (alpha*sg[p_old[i,t]] + (1 - alpha)) * A[i,t].

    Shapes: old_probs (B, T), advantages (B, T) -> (B, T). Applied on both advantage signs, not renormalised.
    """
    return (alpha * old_probs.detach() + (1.0 - alpha)) * advantages


GRPO_SG_PAPER = StrategyPaper(
    "Sharpness-Guided Group Relative Policy Optimization via Probability Shaping",
    "Tue Le, Linh Ngo Van, Trung Le. Sharpness-Guided Group Relative Policy Optimization via Probability Shaping "
    "(GRPO-SG; earlier version: Sharpness-Controlled GRPO with Token-Level Probability Shaping, TR-GRPO).",
)
AR_PAPER = StrategyPaper(
    "Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs",
    "Yang et al. 2025, Do Not Let Low-Probability Tokens Over-Dominate in RL for LLMs (AR-Lopti).",
)


class _ProbabilityShaping(TokenWeightStrategy):
    """Reads the `sg_*` parameters shared by `grpo_sg` and `reverse`."""

    params = ("sg_alpha", "sg_mu", "sg_tau", "sg_lower", "sg_upper", *TokenWeightStrategy.params)
    paper = GRPO_SG_PAPER
    shaping = staticmethod(probability_shaping_weights)  # w(p, alpha, mu, tau, L, U)

    @classmethod
    def check_params(cls, args: Any) -> None:
        if args.sg_lower > args.sg_upper:
            raise ConfigError(f"sg_lower={args.sg_lower}: must not exceed sg_upper={args.sg_upper} (L <= U, Eq. 19).")

    @classmethod
    def check_config(cls, args: Any) -> None:
        """A warning when the sg_* values make every weight the same (plain GRPO: the printed tau = 9)."""
        grid = torch.linspace(0.0, 1.0, 1001, dtype=torch.float64)
        weights = probability_shaping_weights(grid, args.sg_alpha, args.sg_mu, args.sg_tau, args.sg_lower,
                                              args.sg_upper)
        low, high = weights.min().item(), weights.max().item()
        if high - low < 1e-6:
            warnings.warn(
                f"GRPO-SG weights are constant ({low:.4f}..{high:.4f}) for every token probability in [0, 1] with "
                f"sg_alpha={args.sg_alpha}, sg_mu={args.sg_mu}, sg_tau={args.sg_tau}, clip [{args.sg_lower}, "
                f"{args.sg_upper}]: this is plain GRPO. The papers print tau = 9, which does this; the default is "
                "tau = 1/9 (docs/methods.md §1).",
                UserWarning,
                stacklevel=2,
            )
        super().check_config(args)

    @classmethod
    def ratio_silenced(cls, args: Any, epsilon_high: float) -> str | None:
        params = (args.sg_alpha, args.sg_mu, args.sg_tau, args.sg_lower, args.sg_upper)
        found = ratio_silenced_range(lambda p: cls.shaping(p, *params), epsilon_high)
        if found is None:
            return None  # w never exceeds 1 + epsilon_high: nothing is silenced
        if found == (0.0, 1.0):
            return "every token probability p in [0, 1]"
        if found[1] == 1.0:
            return f"every token probability p > {found[0]:.3f}"
        return f"every token probability p < {found[1]:.3f}"

    def _params(self) -> tuple[float, float, float, float, float]:
        a = self.args
        return a.sg_alpha, a.sg_mu, a.sg_tau, a.sg_lower, a.sg_upper


@register_strategy("grpo_sg")
class GRPOSGWeights(_ProbabilityShaping):
    """GRPO-SG / TR-GRPO token weights (Eq. 19), clipped to [sg_lower, sg_upper]."""

    def bounds(self) -> tuple[float, float]:
        return self.args.sg_lower, self.args.sg_upper

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return probability_shaping_weights(logps.detach().exp(), *self._params())


@register_strategy("reverse")
class ReverseWeights(_ProbabilityShaping):
    """TR-GRPO 'Reverse' ablation: 2 - w, in [2 - sg_upper, 2 - sg_lower]."""

    shaping = staticmethod(reverse_probability_shaping_weights)

    def bounds(self) -> tuple[float, float]:
        return 2.0 - self.args.sg_upper, 2.0 - self.args.sg_lower

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return reverse_probability_shaping_weights(logps.detach().exp(), *self._params())


@register_strategy("equal")
class EqualWeights(TokenWeightStrategy):
    """TR-GRPO 'Equal' ablation: w = 1, the parent GRPO loss exactly."""

    paper = GRPO_SG_PAPER

    @classmethod
    def ratio_silenced(cls, args: Any, epsilon_high: float) -> str | None:
        return None  # w = 1

    def bounds(self) -> tuple[float, float]:
        return 1.0, 1.0

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(logps, dtype=logps.dtype).detach()


@register_strategy("random")
class RandomWeights(TokenWeightStrategy):
    """TR-GRPO 'Random' ablation: w ~ Uniform[random_weight_low, random_weight_high] per token, seeded.

    The generator lives on the CPU (the same draws on any device) and is part of the checkpointed state. Each
    process seeds it with seed + process index, so data-parallel ranks draw different weights.
    """

    params = ("random_weight_low", "random_weight_high", "random_weight_seed", *TokenWeightStrategy.params)
    paper = GRPO_SG_PAPER

    @classmethod
    def check_params(cls, args: Any) -> None:
        if args.random_weight_low > args.random_weight_high:
            raise ConfigError(
                f"random_weight_low={args.random_weight_low}: must not exceed random_weight_high="
                f"{args.random_weight_high}."
            )

    @classmethod
    def ratio_silenced(cls, args: Any, epsilon_high: float) -> str | None:
        low, high = args.random_weight_low, args.random_weight_high
        fraction = min(max((high - (1 + epsilon_high)) / max(high - low, 1e-12), 0.0), 1.0)
        if fraction == 0.0:
            return None
        return f"a random {fraction:.1%} of tokens (w ~ U[{low}, {high}] > 1 + epsilon_high)"

    def __init__(self, args):
        super().__init__(args)
        seed = args.random_weight_seed if args.random_weight_seed is not None else args.seed
        seed += args.process_index
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))

    def bounds(self) -> tuple[float, float]:
        return self.args.random_weight_low, self.args.random_weight_high

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        low, high = self.bounds()
        uniform = torch.rand(logps.shape, generator=self.generator, dtype=torch.float64)
        return (low + (high - low) * uniform).to(device=logps.device, dtype=logps.dtype)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


@register_strategy("ar")
class ARTokenAdvantages(AdvantageStrategy):
    """AR-Lopti token advantages from the sampling policy's probabilities (``ar_alpha``)."""

    metrics = ("ar/factor_mean",)
    params = ("ar_alpha",)
    paper = AR_PAPER
    folds_into_loss = True
    loss_factor_metric = "ar/factor_mean"

    def loss_factor(self, logps: torch.Tensor) -> torch.Tensor:
        return ar_token_advantages(logps.exp(), 1.0, self.args.ar_alpha)

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        factor_mask = batch.completion_mask.bool()
        advantages = ar_token_advantages(batch.old_logps.exp(), batch.advantages, self.args.ar_alpha)
        factors = (self.args.ar_alpha * batch.old_logps.exp() + 1 - self.args.ar_alpha)[factor_mask]
        metrics = {"ar/factor_mean": factors.mean().item() if factors.numel() else 1.0}
        return advantages, metrics
