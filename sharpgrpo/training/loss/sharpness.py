"""A direct measurement of the sharpness the GRPO-SG / TR-GRPO papers argue about.

GRPO-SG Theorem 3.3 bounds the population loss by the robust empirical loss max_{||eps|| <= rho} L(theta + eps), and
Eq. 15 replaces the sharpness term by its first-order surrogate rho * ||grad L||; the papers then track only the
gradient norm (Figure 1). The SAM inner maximisation (Foret et al. 2021) measures the term itself, to first order in
the step direction and exactly in the loss:

    g = grad_theta L(theta),   eps = rho * g / ||g||,   increase = L(theta + eps) - L(theta)

so ``increase`` can be compared with ``rho * ||g||``: the two agree for a locally linear loss, and the excess is the
curvature along g (``increase = rho ||g|| + rho^2/2 u^T H u + O(rho^3)`` with u = g/||g||).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

SHARPNESS_KEYS = ("sharpness/grad_norm", "sharpness/ascent_loss_increase", "sharpness/rho", "sharpness/loss")


def sharpness_probe(
    model: torch.nn.Module,
    loss_fn: Callable[[], torch.Tensor],
    rho: float,
    params: Iterable[torch.nn.Parameter] | None = None,
    grad_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Loss, gradient norm and loss increase after a SAM ascent step of radius ``rho``; the model is left untouched.

    Args:
        model: the module whose trainable parameters (``requires_grad``) are probed.
        loss_fn: computes the scalar loss on a fixed batch with the current parameters (called twice: at theta, with
            gradient, and at theta + eps, without). It must not call ``backward`` itself.
        rho: the ascent radius (> 0).
        params: the parameters to perturb (default: every trainable parameter of ``model``).
        grad_reduce: applied to each gradient before the norm, e.g. a mean over data-parallel processes so that
            every process takes the same step (default: none, the local gradient).

    Returns:
        ``{"sharpness/grad_norm": ||g||, "sharpness/ascent_loss_increase": L(theta + eps) - L(theta),
        "sharpness/rho": rho, "sharpness/loss": L(theta)}``. With g = 0 the step is zero and the increase is 0.

    The parameters are restored from a copy (bit-exact; subtracting eps would not be), ``.grad`` is never written
    (the gradient comes from ``torch.autograd.grad``), the training/eval mode is unchanged, and the random number
    generators are forked, so both losses see the same dropout masks and the training run's random stream is not
    advanced.
    """
    if rho <= 0:
        raise ValueError(f"rho must be > 0, got {rho}.")
    params = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not params:
        raise ValueError("The model has no trainable parameters to probe.")
    devices = sorted({p.device.index for p in params if p.device.type == "cuda" and p.device.index is not None})
    with torch.random.fork_rng(devices=devices):
        rng_state = torch.get_rng_state()
        cuda_states = [torch.cuda.get_rng_state(d) for d in devices]
        with torch.enable_grad():
            loss = loss_fn()
            if loss.dim() != 0:
                raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}.")
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        loss_value = loss.detach().item()
        grads = [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]
        if grad_reduce is not None:
            grads = [grad_reduce(g) for g in grads]
        # At least fp32 (bf16 gradients), fp64 kept.
        norms = [torch.linalg.vector_norm(g.to(torch.promote_types(g.dtype, torch.float32))) for g in grads]
        grad_norm = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device, torch.float64) for n in norms])).item()
        increase = 0.0
        if grad_norm > 0:
            saved = [p.detach().clone() for p in params]
            try:
                with torch.no_grad():
                    scale = rho / grad_norm
                    for p, g in zip(params, grads):
                        p.add_(g.to(p.dtype), alpha=scale)
                    # The same random draws as the first pass (dropout masks), then the original parameters back.
                    torch.set_rng_state(rng_state)
                    for device, state in zip(devices, cuda_states):
                        torch.cuda.set_rng_state(state, device)
                    ascent_loss = loss_fn().detach().item()
            finally:
                with torch.no_grad():
                    for p, original in zip(params, saved):
                        p.copy_(original)
            increase = ascent_loss - loss_value
    return {
        "sharpness/grad_norm": grad_norm,
        "sharpness/ascent_loss_increase": increase,
        "sharpness/rho": float(rho),
        "sharpness/loss": loss_value,
    }


class SharpnessProbe:
    """SAM-style sharpness (``sharpness_probe``) on the first micro-batch of every ``every``-th optimizer step of a
    ``GRPOTrainer``; ``every = 0`` turns it off.

    The loss probed is the micro-batch's policy loss times the accumulation steps, i.e. on the scale of a whole
    step's loss, computed by the pure policy loss (``sharpgrpo.training.loss.policy_loss``): its passes append no
    metric, capture no telemetry and move no entropy control, so nothing is restored. The token weights drawn by its
    first pass are pinned: its second pass and the training loss of the same micro-batch use them, so the ascent
    measures the loss the step optimises and a `random` run with the probe draws exactly the weights of a run without
    it. The results are logged as ``sharpness/*``.
    """

    def __init__(self, every: int, rho: float):
        self.every, self.rho = every, rho
        self._last_step: int | None = None

    def _due(self, trainer) -> bool:
        step = trainer.state.global_step
        return bool(self.every) and trainer.model.training and step % self.every == 0 and self._last_step != step

    def pinned_weights(self, trainer, model, loss_result: Callable) -> torch.Tensor | None:
        """When due, run the probe on ``loss_result(weights) -> PolicyLossResult`` (this micro-batch's loss), log its
        metrics and return the token weights its first pass drew (None: not due, or no weight strategy)."""
        if not self._due(trainer):
            return None
        self._last_step = trainer.state.global_step
        pinned: list[torch.Tensor | None] = [None]
        scale = trainer.current_gradient_accumulation_steps
        accelerator = trainer.accelerator

        def loss_fn() -> torch.Tensor:
            result = loss_result(pinned[0])
            pinned[0] = result.weights if pinned[0] is None else pinned[0]
            return result.loss * scale

        result = sharpness_probe(
            accelerator.unwrap_model(model), loss_fn, self.rho,
            grad_reduce=(lambda g: accelerator.reduce(g, "mean")) if accelerator.num_processes > 1 else None,
        )
        for key, value in result.items():
            trainer._metrics["train"][key].append(value)
        return pinned[0]
