"""The loss's metrics, reduced over processes like TRL's: one value per micro-batch, averaged at logging time.

Each piece returns its metrics as ``{name: value}`` (as verl's loss functions do); the trainer appends them to its
``self._metrics[mode]`` with ``append_metrics``. Pure functions of tensors plus the accelerator that reduces them.
TRL's own names and definitions stay (``kl``, ``entropy``, ``clip_ratio/*``, ``cispo_clip_ratio``,
``vespo/phi_seq_mean``); ``token_weight/*`` describe the weight strategy's w.
"""

from __future__ import annotations

import torch

from sharpgrpo.strategies.loss_types import PPO_CLIP_LOSS_TYPES


def global_masked_mean(accelerator, values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``values`` (B, T) over ``mask`` on every process, or of (B, 1) per-sequence values over sequences."""
    if values.shape[1] == 1:  # one value per sequence
        local = torch.stack([values.sum(), torch.tensor(float(values.shape[0]), device=values.device)])
    else:
        local = torch.stack([(values * mask).sum(), mask.sum().float()])
    totals = accelerator.reduce(local, reduction="sum")
    return (totals[0] / totals[1].clamp(min=1.0)).item()


def append_metrics(metrics: dict[str, list], values: dict[str, float]) -> None:
    """Append one micro-batch's metric values to the trainer's lists (``self._metrics[mode]``)."""
    for name, value in values.items():
        metrics[name].append(value)


def loss_metrics(accelerator, loss_type: str, mask, entropies, ratio, advantages, *, clip_range, kl=None,
                 phi_seq=None) -> dict[str, float]:
    """TRL's own metric names and definitions (kl, entropy, clip_ratio/*, cispo_clip_ratio, vespo/phi_seq_mean),
    computed on the unweighted ratio ``ratio``; ``clip_range`` is the loss's (epsilon_low, epsilon_high), numbers or
    per-token tensors."""
    from trl.trainer.utils import nanmax, nanmin

    epsilon_low, epsilon_high = clip_range
    values: dict[str, float] = {}
    if kl is not None:
        values["kl"] = global_masked_mean(accelerator, kl, mask)
    values["entropy"] = global_masked_mean(accelerator, entropies, mask)
    if loss_type == "cispo":
        is_clipped = ((ratio > epsilon_high) & (advantages > 0)).float()
        values["cispo_clip_ratio"] = global_masked_mean(accelerator, is_clipped, mask)
    if loss_type == "vespo":
        values["vespo/phi_seq_mean"] = global_masked_mean(accelerator, phi_seq, mask)
    if loss_type not in PPO_CLIP_LOSS_TYPES:
        return values
    is_low = ((ratio < 1 - epsilon_low) & (advantages < 0)).float()
    is_high = ((ratio > 1 + epsilon_high) & (advantages > 0)).float()
    values["clip_ratio/low_mean"] = global_masked_mean(accelerator, is_low, mask)
    values["clip_ratio/high_mean"] = global_masked_mean(accelerator, is_high, mask)
    values["clip_ratio/region_mean"] = global_masked_mean(accelerator, torch.maximum(is_low, is_high), mask)

    def per_sequence(x):
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    values["clip_ratio/low_min"] = nanmin(accelerator.gather(per_sequence(is_low))).item()
    values["clip_ratio/high_max"] = nanmax(accelerator.gather(per_sequence(is_high))).item()
    return values


def process_means(accelerator, values: dict[str, torch.Tensor] | None) -> dict[str, float]:
    """0-d device metrics (e.g. the loss strategies'; None: none), each averaged over processes, read with one host
    synchronisation."""
    if not values:
        return {}
    names = list(values)
    local = torch.stack([values[name].detach().float().reshape(()) for name in names])
    return dict(zip(names, accelerator.reduce(local, reduction="mean").tolist(), strict=True))


def weight_metrics(accelerator, weights, mask, advantages, *, bounds, clip_range, loss_type, surrogate_ratio,
                   bad_weights=None) -> tuple[dict[str, float], int]:
    """``token_weight/*``: statistics of w over valid tokens, and the share of tokens the clip switched off (a
    ``loss_type`` without PPO's clip switches no token off: logged as 0). ``bounds`` is the strategy's (lower,
    upper), ``clip_range`` the loss's (epsilon_low, epsilon_high), ``surrogate_ratio`` the ratio the surrogate
    clipped. Returns the metrics and ``bad_weights`` (the output checker's device count of invalid weights), read in
    the same host synchronisation as the metrics."""
    epsilon_low, epsilon_high = clip_range
    valid = mask.bool()
    w = weights.detach().float()
    lower, upper = bounds
    at_lower = (w <= lower + 1e-6).float()
    at_upper = (w >= upper - 1e-6).float()
    # A token gets no policy gradient when min() picks the clipped branch and the clip is active.
    grad_clipped = torch.zeros_like(w)
    if loss_type in PPO_CLIP_LOSS_TYPES and surrogate_ratio is not None:
        grad_clipped = (
            ((surrogate_ratio > 1 + epsilon_high) & (advantages > 0))
            | ((surrogate_ratio < 1 - epsilon_low) & (advantages < 0))
        ).float()
    local = torch.stack(
        [
            (w * mask).sum(),
            (w * w * mask).sum(),
            valid.sum().float(),
            (at_lower * mask).sum(),
            (at_upper * mask).sum(),
            (grad_clipped.expand_as(w) * mask).sum(),
        ]
    )
    totals = accelerator.reduce(local, reduction="sum")
    n = totals[2].clamp(min=1.0)
    mean = totals[0] / n
    # With no valid token the extremes are +inf and -inf, which the min over processes ignores.
    local_extremes = torch.stack([w.masked_fill(~valid, float("inf")).min(),
                                  -w.masked_fill(~valid, float("-inf")).max()])
    extremes = accelerator.gather(local_extremes.unsqueeze(0)).min(dim=0).values
    zero = mean.new_zeros(())
    values = torch.stack([  # read with one host synchronisation
        mean, (totals[1] / n - mean * mean).clamp(min=0.0).sqrt(), extremes[0], -extremes[1],
        totals[3] / n, totals[4] / n, totals[5] / n, zero if bad_weights is None else bad_weights.float(),
    ]).tolist()
    names = ("mean", "std", "min", "max", "frac_at_lower", "frac_at_upper", "frac_grad_clipped")
    metrics = {  # a constant weight (equal) has no bound to sit at
        f"token_weight/{name}": value for name, value in zip(names, values[:-1], strict=True)
        if lower < upper or not name.startswith("frac_at")
    }
    return metrics, int(values[-1])
