"""TRL 1.16's entropy bonus (``entropy_coef``; adaptive with ``use_adaptive_entropy``, Skywork-OR1), as the
parent's ``_compute_loss`` applies it; the trainer subtracts the returned term from the loss and logs the returned
metrics.

The coefficient times the mean entropy over ``effective_mask``, scaled for gradient accumulation only (the same for
every loss type), not weighted by any token weight. Adaptive control applies the coefficient of the previous
optimizer step and updates it from the accumulation window's token-weighted mean entropy over all processes; its
state lives on the trainer, where TRL keeps it (``entropy_coef``, ``_last_world_entropy``,
``_entropy_window_stats``), so that TRL's checkpointing of it is unchanged. Parity with the parent:
tests/integration/test_parity.py.
"""

from __future__ import annotations

import torch


def entropy_bonus(trainer, entropies, effective_mask, policy_loss, mode) -> tuple[torch.Tensor, dict[str, float]]:
    """The term to subtract from the loss, and its metrics (``policy_loss``, ``entropy_coef`` at optimizer steps)."""
    args, accelerator = trainer.args, trainer.accelerator
    accumulation = trainer.current_gradient_accumulation_steps if mode == "train" else 1.0
    entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
    if trainer.use_adaptive_entropy:
        apply_coef = trainer.entropy_coef if trainer._last_world_entropy <= args.entropy_target else 0.0
    else:
        apply_coef = trainer.entropy_coef
    metrics = {"policy_loss": accelerator.gather(policy_loss).nanmean().item()}
    if trainer.use_adaptive_entropy and mode == "train":
        stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
        window = trainer._entropy_window_stats
        trainer._entropy_window_stats = stats if window is None else window + stats
        if accelerator.sync_gradients:
            totals = accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
            world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
            delta = args.entropy_coef_delta
            if world_entropy <= args.entropy_target:
                trainer.entropy_coef = min(trainer.entropy_coef + delta, args.entropy_coef_max)
            else:
                trainer.entropy_coef = max(trainer.entropy_coef - delta, args.entropy_coef_min)
            trainer._last_world_entropy = world_entropy
            trainer._entropy_window_stats = None
    if mode == "train" and accelerator.sync_gradients:
        metrics["entropy_coef"] = trainer.entropy_coef
    return apply_coef * entropy_loss, metrics
