"""Archer: dual-token constraints by entropy (Wang et al. 2025, "Stabilizing Knowledge, Promoting Reasoning:
Dual-Token Constraints for RLVR", arXiv 2507.15778; authors' code wizard-III/ArcherCodeR; docs/methods.md §11.5).

Per response, the tokens whose entropy (of the policy being trained, detached) exceeds the response's
``archer_entropy_quantile`` quantile of its token entropies are *high-entropy* (reasoning forks), the others
*low-entropy* (knowledge). Both sets are updated together, with

* a per-token clip range: the ratio of a low-entropy token is clipped to [1 - eps_low^L, 1 + eps_high^L], of a
  high-entropy token to [1 - eps_low^H, 1 + eps_high^H] (released: 0.2 / 0.5, wider for the forks);
* the KL of the low-entropy tokens times ``beta`` (the released ``kl_loss_coef``), of the high-entropy tokens times
  ``archer_high_entropy_kl_scale``, which is the released ``high_entropy_kl_loss_scale_coef`` with its released
  meaning: the high-entropy KL's own coefficient, used alone (released: 0, no KL on the forks), not a multiple of
  ``beta``. The loss multiplies every token's KL by ``beta``, so the per-token weight on ``beta * KL`` is 1 for
  low-entropy tokens and ``archer_high_entropy_kl_scale / beta`` for high-entropy ones. With ``archer_kl_mean:
  split`` (the released code) the KL of each set is averaged over that set's tokens, which per token is a weight
  N / N_L (resp. scale / beta * N / N_H) on a token mean over the N tokens of the micro-batch.

The released loss's dual clip (``clip_ratio_c=10``: for A < 0 the loss is at most -A c) is TRL's ``delta``: with
``delta: 10`` (any ``delta`` >= 1 + the largest epsilon_high) TRL's -min(min(r, delta) A, clip(r) A) equals verl's
dual-clip loss token by token. The released KL is verl's ``low_var_kl`` (k3 without the importance ratio): TRL's
default ``use_bias_correction_kl: true`` multiplies it by the ratio, so archer warns unless it is false.

A loss-side strategy (``TokenLossStrategy``): ``loss_terms`` returns the per-token ``epsilon_low``,
``epsilon_high`` and ``kl_weight`` of ``LossTerms``; the loss applies them (``sharpgrpo.training.loss.surrogates``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    LossContext,
    LossTerms,
    StrategyPaper,
    TokenLossStrategy,
    on_policy,
    register_strategy,
)
from sharpgrpo.validation import ConfigError


def _float(tensor: torch.Tensor) -> torch.Tensor:
    """Detached, in float64 when given float64, else float32 (nanquantile needs one of them)."""
    return tensor.detach().to(torch.float64 if tensor.dtype == torch.float64 else torch.float32)


def response_entropy_thresholds(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """The ``quantile`` of each response's masked token entropies (linear interpolation, torch.nanquantile; NaN for a
    response without tokens). Shapes: entropies (B, T), mask (B, T) -> (B, 1)."""
    entropies = _float(entropies)
    masked = torch.where(mask.bool(), entropies, torch.full_like(entropies, float("nan")))
    return torch.nanquantile(masked, quantile, dim=-1, keepdim=True)


def archer_token_terms(entropies: torch.Tensor, mask: torch.Tensor, quantile: float, low_entropy_clip: tuple[float, float],
                       high_entropy_clip: tuple[float, float], high_entropy_kl_scale: float, kl_mean: str = "split"
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Archer's per-token clip bounds and KL weights (module docstring).

    Shapes: entropies (B, T), mask (B, T) {0, 1} -> (epsilon_low (B, T), epsilon_high (B, T), kl_weight (B, T),
    high (B, T) bool: the high-entropy completion tokens). Off the mask: the high-entropy bounds (as the released
    code's ``torch.where``) and KL weight 0."""
    valid = mask.bool()
    threshold = response_entropy_thresholds(entropies, mask, quantile)
    entropies = _float(entropies)
    high = (entropies > threshold) & valid
    low = (entropies <= threshold) & valid
    def pick(low_value: float, high_value: float) -> torch.Tensor:
        return torch.where(low, torch.full_like(entropies, low_value), torch.full_like(entropies, high_value))

    eps_low, eps_high = pick(low_entropy_clip[0], high_entropy_clip[0]), pick(low_entropy_clip[1], high_entropy_clip[1])
    low_weight, high_weight = 1.0, float(high_entropy_kl_scale)
    if kl_mean == "split":
        total = valid.sum().to(entropies.dtype)
        low_weight = total / low.sum().clamp_min(1)
        high_weight = high_weight * total / high.sum().clamp_min(1)
    zero = torch.zeros_like(entropies)
    kl_weight = torch.where(low, low_weight + zero, torch.where(high, high_weight + zero, zero))
    return eps_low, eps_high, kl_weight, high


def high_entropy_kl_weight(high_entropy_kl_coef: float, beta: float) -> float:
    """The weight on ``beta * KL`` of a high-entropy token that makes its KL's coefficient ``high_entropy_kl_coef``
    (the released ``high_entropy_kl_loss_scale_coef``, used alone): coef / beta; 0 when beta is 0 (no KL term, and the
    config refuses a coefficient > 0 there)."""
    return float(high_entropy_kl_coef) / float(beta) if beta else 0.0


@register_strategy("archer")
class ArcherStrategy(TokenLossStrategy):
    """Archer (docs/methods.md §11.5): per-token clip ranges and KL weights by response-level entropy quantile.

    Metrics (device scalars): ``archer/frac_high_entropy`` (high-entropy share of the micro-batch's tokens),
    ``archer/entropy_threshold`` (mean per-response threshold), ``archer/kl_weight_mean``."""

    metrics = ("archer/entropy_threshold", "archer/frac_high_entropy", "archer/kl_weight_mean")
    params = ("archer_entropy_quantile", "archer_low_entropy_clip_low", "archer_low_entropy_clip_high",
              "archer_high_entropy_clip_low", "archer_high_entropy_clip_high", "archer_high_entropy_kl_scale",
              "archer_kl_mean")
    sets = frozenset({"clip_range"})  # the per-token clip range: no other clip-range strategy beside it
    paper = StrategyPaper(
        "Stabilizing Knowledge, Promoting Reasoning: Dual-Token Constraints for RLVR",
        "Wang et al. 2025, Stabilizing Knowledge, Promoting Reasoning: Dual-Token Constraints for RLVR.",
        "2507.15778",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        if args.beta == 0.0 and args.archer_high_entropy_kl_scale > 0:
            raise ConfigError(
                f"archer_high_entropy_kl_scale={args.archer_high_entropy_kl_scale:g} with beta=0: the high-entropy "
                "tokens' KL needs the reference model, which TRL loads only with beta > 0 (the low-entropy tokens' "
                "KL coefficient, the released kl_loss_coef); set beta > 0 or archer_high_entropy_kl_scale: 0."
            )
        if args.beta == 0.0:
            if on_policy(args):  # inert: refused by `inert`
                return
            warnings.warn(
                "archer with beta=0: no KL term, so only the clip ranges differ by entropy; the released recipe "
                "(ArcherCodeR run_archer_qwen2.5_1.5b_code.sh) uses a KL loss with beta=0.001 on low-entropy tokens.",
                UserWarning,
                stacklevel=2,
            )
        elif getattr(args, "use_bias_correction_kl", False):
            warnings.warn(
                "archer with beta > 0 and use_bias_correction_kl=true (TRL's default) multiplies each token's KL by its "
                "importance ratio; the released code's KL (verl low_var_kl) has no ratio, and the gradient differs "
                "(13-34% at beta 0.04 in the issue's comparison). Set use_bias_correction_kl: false to train as "
                "ArcherCodeR does.",
                UserWarning,
                stacklevel=2,
            )

    @classmethod
    def inert(cls, args: Any) -> str | None:
        """Why archer would train exactly as plain GRPO with these settings (None when it does not): both entropy
        sets get the same clip range and the same KL weight, or on-policy (no clip acts) without KL."""
        same_clip = (args.archer_low_entropy_clip_low == args.archer_high_entropy_clip_low
                     and args.archer_low_entropy_clip_high == args.archer_high_entropy_clip_high)  # fmt: skip
        if not same_clip:
            if args.beta == 0.0 and on_policy(args):
                return ("on-policy (num_iterations=1, steps_per_generation <= gradient_accumulation_steps) every "
                        "ratio is 1, so no clip range ever acts, and beta=0 has no KL: it trains as plain GRPO; set "
                        "beta > 0 or num_iterations > 1")  # fmt: skip
            return None
        if args.beta == 0.0:
            return ("the low- and high-entropy tokens get the same clip range and beta=0 (no KL), so nothing depends "
                    "on entropy")  # fmt: skip
        if args.archer_kl_mean == "token" and args.archer_high_entropy_kl_scale == args.beta:
            return ("the low- and high-entropy tokens get the same clip range and the same KL coefficient "
                    "(archer_high_entropy_kl_scale = beta, archer_kl_mean: token)")  # fmt: skip
        return None

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        if context.entropies is None:
            raise ValueError("archer needs the per-token entropies of the policy being trained (LossContext.entropies).")
        args: Any = self.args
        eps_low, eps_high, kl_weight, high = archer_token_terms(
            context.entropies, context.mask, args.archer_entropy_quantile,
            (args.archer_low_entropy_clip_low, args.archer_low_entropy_clip_high),
            (args.archer_high_entropy_clip_low, args.archer_high_entropy_clip_high),
            high_entropy_kl_weight(args.archer_high_entropy_kl_scale, args.beta), args.archer_kl_mean,
        )
        mask = context.mask.to(eps_low.dtype)
        count = mask.sum().clamp_min(1)
        threshold = response_entropy_thresholds(context.entropies, context.mask, args.archer_entropy_quantile)
        metrics = {
            "archer/frac_high_entropy": (high.to(mask.dtype) * mask).sum() / count,
            "archer/entropy_threshold": torch.nan_to_num(threshold).mean(),
            "archer/kl_weight_mean": (kl_weight * mask).sum() / count,
        }
        return LossTerms(epsilon_low=eps_low, epsilon_high=eps_high, kl_weight=kl_weight), metrics
