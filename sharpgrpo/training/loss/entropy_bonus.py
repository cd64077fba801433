"""TRL 1.16's entropy bonus coefficient (``entropy_coef``; adaptive with ``use_adaptive_entropy``, Skywork-OR1), as
the parent's ``_compute_loss`` controls it.

The bonus itself (the coefficient times the mean entropy over the effective mask, scaled for gradient accumulation
only, not weighted by any token weight) is a term of the policy loss (``sharpgrpo.training.loss.policy_loss``). Its
coefficient is decided here, before the loss: adaptive control applies the coefficient of the previous optimizer step
and updates it after the loss from the accumulation window's token-weighted mean entropy over all processes
(``PolicyLossResult.entropy_stats``). The state lives on the trainer, where TRL keeps it (``entropy_coef``,
``_last_world_entropy``, ``_entropy_window_stats``), so that TRL's checkpointing of it is unchanged. Parity with the
parent: tests/integration/test_parity.py.
"""

from __future__ import annotations

import torch


def entropy_coef_to_apply(trainer) -> float:
    """The coefficient this micro-batch's loss applies (0 while the adaptive control's entropy is above target)."""
    if not trainer._entropy_bonus_enabled:
        return 0.0
    if trainer.use_adaptive_entropy:
        return trainer.entropy_coef if trainer._last_world_entropy <= trainer.args.entropy_target else 0.0
    return trainer.entropy_coef


def update_entropy_control(trainer, entropy_stats: torch.Tensor | None, training: bool) -> dict[str, float]:
    """After a training micro-batch's loss: accumulate its (entropy sum, token count) and, at the window's end
    (``sync_gradients``), move the adaptive coefficient towards ``entropy_target`` over all processes. Returns the
    ``entropy_coef`` metric at optimizer steps (every bonus, adaptive or not)."""
    if entropy_stats is None or not training:
        return {}
    args, accelerator = trainer.args, trainer.accelerator
    if trainer.use_adaptive_entropy:
        window = trainer._entropy_window_stats
        trainer._entropy_window_stats = entropy_stats if window is None else window + entropy_stats
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
    return {"entropy_coef": trainer.entropy_coef} if accelerator.sync_gradients else {}
