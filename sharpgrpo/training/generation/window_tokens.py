"""The window-normalised loss types' token count after the tokens a loss strategy removes from the loss.

``dapo``, ``cispo`` and ``vespo`` divide each micro-batch's summed loss by TRL's ``num_items_in_batch``, the loss
tokens of the whole generation batch over all processes, counted at generation. A loss strategy whose ``loss_mask``
removes tokens from the loss and its normaliser (a decoupled rollout correction's rejection, verl's ``response_mask``
after ``compute_rollout_correction_and_add_to_batch``) must remove them from that count too, or the divisor is
verl's ``batch_num_tokens`` before rejection. Such a strategy declares ``removes_tokens_at_generation`` and computes
the mask from the old and the sampling log-probabilities (``generation_loss_mask``); this module recounts.

The old log-probabilities are TRL's ``old_per_token_logps`` where TRL computed them; otherwise (on-policy) they are
computed here once, by the forward TRL's off-policy path uses, and stored as ``old_per_token_logps``, so that the loss
reads the very values the count was made from (verl recomputes ``old_log_prob`` in its decoupled mode likewise).
"""

from __future__ import annotations

from typing import Any

import torch

from sharpgrpo.training.generation.inputs import loss_mask
from sharpgrpo.training.loss.aggregation import WINDOW_NORMALISED_LOSS_TYPES


def recount_window_tokens(trainer, output: dict[str, Any]) -> dict[str, Any]:
    """``output`` with ``num_items_in_batch`` counting only the tokens left in the loss (and ``old_per_token_logps``
    filled where it was missing), when the loss type is window-normalised and a loss strategy removes tokens at
    generation; else ``output`` unchanged. ``trainer``: the ``SharpGRPOTrainer`` (its strategies, accelerator and
    ``_sampling_logps`` forward)."""
    removers = [strategy for _, strategy in trainer.strategies.loss if strategy.removes_tokens_at_generation]
    sampling = output.get("sampling_per_token_logps")
    if trainer.loss_type not in WINDOW_NORMALISED_LOSS_TYPES or not removers or sampling is None:
        return output
    if output.get("old_per_token_logps") is None:
        with torch.no_grad():
            output["old_per_token_logps"] = trainer._sampling_logps(output)
    mask = loss_mask(output)
    kept = mask
    for strategy in removers:
        kept = kept * strategy.generation_loss_mask(output["old_per_token_logps"], sampling, mask).to(mask.dtype)
    output["num_items_in_batch"] = trainer.accelerator.gather(kept.sum().reshape(1)).sum()
    return output
