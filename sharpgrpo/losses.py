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

# Loss types whose surrogate is PPO's clipped objective (they differ only in how tokens are aggregated).
PPO_CLIP_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "luspo")
LOSS_TYPES = PPO_CLIP_LOSS_TYPES + ("cispo", "sapo", "vespo")
# Loss types whose surrogate has a per-token importance ratio for `weight_placement='ratio'` to scale.
RATIO_PLACEMENT_LOSS_TYPES = PPO_CLIP_LOSS_TYPES + ("cispo", "sapo")


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
