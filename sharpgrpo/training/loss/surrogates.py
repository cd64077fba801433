"""The per-token policy surrogates of TRL 1.16's loss types, with a token weight in the importance ratio.

Pure torch, no trainer state. ``SharpGRPOTrainer._compute_loss`` computes the importance ratio r (token- or
sequence-level), multiplies it by the token weight w under ``weight_placement='ratio'`` (GRPO-SG Eq. 13), calls
``policy_surrogate`` and, under ``weight_placement='loss'``, multiplies the result by w. With w = 1 each surrogate is
exactly TRL 1.16's (``GRPOTrainer._compute_loss``; tests/integration/test_parity.py checks loss and gradients).

Where ``ratio`` placement is defined: a surrogate that passes the ratio through a trust-region function (PPO's
clip, CISPO's truncation, SAPO's soft gate) takes w*r in place of r, so on-policy (r = 1) the token's gradient is
w A grad log p until the trust region acts on w*r (GRPO-SG Lemma 3.4). VESPO has no per-token ratio: its gamma weight
acts on the product of a whole sequence's ratios, where a per-token w has no place, so ``ratio`` placement is
refused for it (``SharpGRPOConfig``).
"""

from __future__ import annotations

import torch

from sharpgrpo.strategies.kl_estimators import DEFAULT_KL_ESTIMATOR, kl_from_log_ratio
from sharpgrpo.strategies.loss_types import LOSS_TYPES, PPO_CLIP_LOSS_TYPES


def policy_surrogate(
    loss_type: str,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    per_token_logps: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    phi_seq: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Per-token policy loss (to minimise) of ``loss_type``, before masking and aggregation.

    Shapes: ``ratio`` (B, T) or (B, 1) (sequence-level ratio); ``advantages`` (B, 1) or (B, T); ``per_token_logps``
    (B, T) with gradient; ``phi_seq`` (B, 1) or (B, T), VESPO only. Returns (B, T), or (B, 1) when every input
    that enters the surrogate is (B, 1).

    * PPO clip (``dapo``, ``grpo``, ``bnpo``, ``dr_grpo``, ``luspo``): -min(r A, clip(r, 1-eps_low, 1+eps_high) A),
      with r capped at ``delta`` in the first term when set (two-sided clipping, INTELLECT-2).
    * ``cispo`` (MiniMax-M1): -sg[min(r, eps_high)] A log p (the truncated ratio scales the gradient).
    * ``sapo`` (Soft Adaptive Policy Optimization): -sigmoid(tau (r - 1)) 4/tau A, tau = ``sapo_temperature_pos``
      where A > 0 and ``sapo_temperature_neg`` elsewhere.
    * ``vespo`` (VESPO): -phi A log p, phi the detached gamma weight of the sequence ratio
      (``GRPOTrainer.get_gamma_weights``); ``ratio`` is not used.
    """
    if loss_type in PPO_CLIP_LOSS_TYPES:
        clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
        if delta is not None:
            ratio = torch.clamp(ratio, max=delta)
        return -torch.min(ratio * advantages, clipped * advantages)
    if loss_type == "cispo":
        return -torch.clamp(ratio, max=epsilon_high).detach() * advantages * per_token_logps
    if loss_type == "sapo":
        positive, negative = advantages.new_tensor(sapo_temperature_pos), advantages.new_tensor(sapo_temperature_neg)
        temperatures = torch.where(advantages > 0, positive, negative)
        return -torch.sigmoid(temperatures * (ratio - 1)) * 4 / temperatures * advantages
    if loss_type == "vespo":
        if phi_seq is None:
            raise ValueError("`loss_type='vespo'` needs the gamma weights `phi_seq`.")
        return -phi_seq * advantages * per_token_logps
    raise ValueError(f"Unknown loss type {loss_type!r}; expected one of {', '.join(LOSS_TYPES)}.")


def weighted_policy_surrogate(
    loss_type: str,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    per_token_logps: torch.Tensor,
    weights: torch.Tensor | None,
    placement: str,
    **surrogate_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy_surrogate`` with a token weight placed as docs/methods.md §1 says ("Where w enters the loss").

    ``loss`` (default): ``w * surrogate(r)``. ``ratio`` (GRPO-SG Eq. 13 as printed): ``surrogate(w * r)``.
    ``weights=None`` is TRL's unweighted surrogate. Returns (per-token loss, the ratio the surrogate saw: w*r under
    ``ratio``), from which the trainer counts the tokens whose gradient the clip switched off.
    """
    if placement not in ("ratio", "loss"):
        raise ValueError(f"placement must be 'ratio' or 'loss', got {placement!r}")
    surrogate_ratio = ratio if weights is None or placement == "loss" else ratio * weights
    per_token_loss = policy_surrogate(loss_type, surrogate_ratio, advantages, per_token_logps, **surrogate_kwargs)
    if weights is not None and placement == "loss":
        per_token_loss = weights * per_token_loss
    return per_token_loss, surrogate_ratio


def log_importance_weights(
    per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """log r at TRL's ``importance_sampling_level``: ``token`` (B, T); ``sequence`` (B, 1), the masked mean of the
    token log-ratios (GSPO); ``sequence_token`` (B, T), GSPO-token: the sequence ratio's value with each token's
    gradient, so token advantages still act."""
    log_ratio = per_token_logps - old_per_token_logps
    if level == "token":
        return log_ratio
    sequence_log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    if level == "sequence":
        return sequence_log_ratio
    return sequence_log_ratio.detach() + per_token_logps - per_token_logps.detach()


def kl_penalty(
    ref_per_token_logps: torch.Tensor,
    per_token_logps: torch.Tensor,
    weights: torch.Tensor | None,
    kl_weighting: str,
    ratio: torch.Tensor | None = None,
    estimator: str = DEFAULT_KL_ESTIMATOR,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) by ``estimator`` (``sharpgrpo.strategies.kl_estimators``; default TRL's
    k3, pref/p - log(pref/p) - 1), with the token weight placed by ``kl_weighting``: ``loss`` w * kl (GRPO-SG
    Lemma 3.4: the gradient carries beta * w), ``inside`` the estimator of log(w * pref / p) (TR-GRPO Eq. 11),
    ``none`` unweighted. ``ratio`` (TRL's ``use_bias_correction_kl``) multiplies the estimate by the importance ratio.
    (B, T) -> (B, T)."""
    ref_logp_minus_logp = ref_per_token_logps - per_token_logps
    if weights is not None and kl_weighting == "inside":
        ref_logp_minus_logp = ref_logp_minus_logp + torch.log(weights)
    per_token_kl = kl_from_log_ratio(ref_logp_minus_logp, estimator)
    if weights is not None and kl_weighting == "loss":
        per_token_kl = weights * per_token_kl
    if ratio is not None:
        per_token_kl = per_token_kl * ratio
    return per_token_kl
