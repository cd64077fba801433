"""How a micro-batch's per-token loss (B, T) becomes the scalar it back-propagates: TRL 1.16's aggregation of each
``loss_type``, and GMPO's sequence-level one. One definition: a token's share of the loss (the per-token telemetry's
``loss_share``) is the derivative of ``aggregate_loss`` with respect to that token's loss (``token_loss_shares``),
not a second formula.
"""

from __future__ import annotations

import torch


# Loss types normalised by the tokens of the whole accumulation window (TRL's `num_items_in_batch`).
WINDOW_NORMALISED_LOSS_TYPES = ("dapo", "cispo", "vespo")


def window_token_share(num_items_in_batch: torch.Tensor, num_processes: int, accumulation_steps: int | None = None,
                       steps_per_generation: int = 1) -> torch.Tensor:
    """This process's share of the loss tokens of an accumulation window, the divisor of the window-normalised loss
    types (TRL 1.16). TRL's ``num_items_in_batch`` counts a generation batch's tokens over all processes; in training
    (``accumulation_steps`` given) a window is ``accumulation_steps / steps_per_generation`` of that batch."""
    share = num_items_in_batch.clamp(min=1.0) / num_processes
    if accumulation_steps is not None:
        share = share * accumulation_steps / steps_per_generation
    return share


def aggregate_loss(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: float,
    window_tokens: torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's scalar loss from its per-token loss (B, T), aggregated as TRL 1.16's ``loss_type`` does.

    ``grpo``/``sapo``: mean over each sequence's tokens, then over sequences; ``bnpo``: mean over the micro-batch's
    tokens; ``dr_grpo``: sum / (sequences x ``max_completion_length``); ``luspo``: each sequence's sum, mean over
    sequences; ``dapo``/``cispo``/``vespo``: sum / ``window_tokens`` (this process's share of the loss tokens of the
    accumulation window). The per-micro-batch types are divided by ``accumulation_steps`` (the window types are
    already normalised per window). Returns (loss to back-propagate, the policy loss before that division).
    """
    if loss_type in ("grpo", "sapo"):
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    elif loss_type == "luspo":  # each sequence's loss times its length
        loss = (per_token_loss * mask).sum(-1).mean()
    elif loss_type in WINDOW_NORMALISED_LOSS_TYPES:
        loss = (per_token_loss * mask).sum() / window_tokens
        return loss, loss.detach()
    else:  # refused by SharpGRPOConfig; kept so that a future loss type cannot pass silently
        raise ValueError(f"Unsupported loss type: {loss_type}")
    return loss / accumulation_steps, loss.detach()


def sequence_objective_loss(
    sequence_loss: torch.Tensor, per_token_kl: torch.Tensor | None, beta: float, mask: torch.Tensor,
    accumulation_steps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A sequence-level objective's micro-batch loss, as TRL 1.16's ``GMPOTrainer._compute_loss`` aggregates it:

        L = mean_i ( sequence_loss[i] + beta * sum_t kl[i,t] mask[i,t] / max(1, sum_t mask[i,t]) ) / accumulation

    Shapes: ``sequence_loss`` (B,), ``per_token_kl`` and ``mask`` (B, T). Returns (loss to back-propagate, the
    mean policy loss before the division)."""
    per_sequence = sequence_loss
    if per_token_kl is not None and beta != 0.0:
        per_sequence = per_sequence + beta * (per_token_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    loss = per_sequence.mean()
    return loss / accumulation_steps, loss.detach()


def token_loss_shares(
    mask: torch.Tensor,
    loss_type: str,
    *,
    accumulation_steps: float,
    window_tokens: torch.Tensor | None = None,
    max_completion_length: int | None = None,
) -> torch.Tensor:
    """Each token's factor in ``aggregate_loss``: (B, T) ``s = d loss / d per_token_loss``, so that ``loss =
    sum(per_token_loss * s)`` (the aggregation is linear in the per-token loss; equal up to the order of the float
    sums). ``grpo``/``sapo``: mask / (|o_i| B acc); ``bnpo``: mask / (sum(mask) acc); ``dr_grpo``: mask / (B L_max
    acc); ``luspo``: mask / (B acc); ``dapo``/``cispo``/``vespo``: mask / window_tokens. Used by the per-token
    telemetry (`sharpgrpo.training.telemetry`) to state every token's share of the loss."""
    mask = mask.detach().float()
    with torch.enable_grad():
        probe = torch.zeros_like(mask, requires_grad=True)
        loss, _ = aggregate_loss(probe, mask, loss_type, accumulation_steps=accumulation_steps,
                                 window_tokens=None if window_tokens is None else window_tokens.detach(),
                                 max_completion_length=max_completion_length)
        (shares,) = torch.autograd.grad(loss, probe)
    return shares
