"""The loss-side strategies' terms (``sharpgrpo.strategies.base.LossTerms``) folded into the loss.

Pure torch. The policy loss (``sharpgrpo.training.loss.policy_loss``) builds a ``LossContext``, calls
``collect_loss_terms`` once per micro-batch, passes the clip range it returns to the surrogate, then
``apply_token_terms`` to the per-token policy term (before TRL's off-policy mask, entropy mask and vLLM
importance-sampling ratio, which act on the whole policy term, as verl's ``rollout_is_weights`` do), the KL factor to
the beta * KL term, or, for a sequence-level objective, ``sequence_objective_loss`` in place of the surrogate and its
aggregation (``sharpgrpo.training.loss.aggregation``). Order inside the policy term (docs/methods.md, "Strategy
kinds"):

    l[i,t] = min(token_mask * where(gradient_mask, s, sg[s]), loss_cap) + extra_loss,
             s = surrogate(r; eps_low[i,t], eps_high[i,t])

and ``loss_mask`` takes the token out of the mask the loss is aggregated over (its normaliser included).
"""

from __future__ import annotations

import torch

from sharpgrpo.strategies.base import LossContext, LossTerms
from sharpgrpo.strategies.base import declared_columns as checked_columns


def collect_loss_terms(strategies, context: LossContext, check_metrics=None
                       ) -> tuple[LossTerms, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every loss strategy's terms for one micro-batch, combined: masks and KL factors multiply, extra terms add, the
    clip range and a sequence objective come from the one strategy that sets them (the config refuses two).
    ``strategies``: (name, strategy) pairs. Returns (combined terms, metrics as 0-d device tensors, each strategy's
    per-token terms and declared diagnostics (``LossTerms.columns``) named ``<name>/<field>``, the telemetry's
    columns). ``check_metrics(strategy, metrics)``, when given, checks each strategy's metrics
    (``StrategyOutputChecker.metrics``)."""
    combined, metrics, columns = LossTerms(), {}, {}
    for strategy_name, strategy in strategies:
        terms, strategy_metrics = strategy.loss_terms(context)
        if check_metrics is not None:
            check_metrics(strategy, strategy_metrics)
        metrics.update(strategy_metrics)
        columns.update({f"{strategy_name}/{name}": value for name, value in per_token_terms(terms).items()})
        columns.update({f"{strategy_name}/{name}": value for name, value in declared_columns(strategy_name, strategy,
                                                                                             terms).items()})
        for name in ("gradient_mask", "token_mask", "loss_mask", "kl_weight", "env_mask"):
            combined = _merge(combined, name, getattr(terms, name), torch.mul)
        combined = _merge(combined, "loss_cap", terms.loss_cap, torch.minimum)
        combined = _merge(combined, "extra_loss", terms.extra_loss, torch.add)
        combined = _merge(combined, "env_loss", terms.env_loss, torch.add)
        for name in ("epsilon_low", "epsilon_high", "sequence_loss"):
            if getattr(terms, name) is not None:
                setattr(combined, name, getattr(terms, name))
    return combined, metrics, columns


def _merge(terms: LossTerms, name: str, value: torch.Tensor | None, combine) -> LossTerms:
    if value is not None:
        current = getattr(terms, name)
        setattr(terms, name, value if current is None else combine(current, value))
    return terms


def clip_range(terms: LossTerms | None, epsilon_low: float, epsilon_high: float):
    """The clip range the surrogate uses: the strategy's per-token one where set, else the configured floats."""
    if terms is None:
        return epsilon_low, epsilon_high
    low = epsilon_low if terms.epsilon_low is None else terms.epsilon_low
    high = epsilon_high if terms.epsilon_high is None else terms.epsilon_high
    return low, high


def apply_token_terms(per_token_loss: torch.Tensor, terms: LossTerms | None) -> torch.Tensor:
    """The policy term with the strategies' masks, cap and extra term: ``min(token_mask * where(gradient_mask, l,
    sg[l]), loss_cap) + extra_loss`` (where the cap binds, the term is the detached cap: no gradient). (B, T) ->
    (B, T)."""
    if terms is None:
        return per_token_loss
    if terms.gradient_mask is not None:
        per_token_loss = torch.where(terms.gradient_mask.bool(), per_token_loss, per_token_loss.detach())
    if terms.token_mask is not None:
        per_token_loss = per_token_loss * terms.token_mask
    if terms.loss_cap is not None:
        per_token_loss = torch.minimum(per_token_loss, terms.loss_cap.detach().to(per_token_loss.dtype))
    if terms.extra_loss is not None:
        per_token_loss = per_token_loss + terms.extra_loss
    return per_token_loss


def weighted_kl(per_token_kl: torch.Tensor, terms: LossTerms | None) -> torch.Tensor:
    """The per-token KL estimate times the strategies' ``kl_weight`` (Archer), where set."""
    if terms is None or terms.kl_weight is None:
        return per_token_kl
    return per_token_kl * terms.kl_weight


def per_token_terms(terms: LossTerms | None) -> dict[str, torch.Tensor]:
    """The per-token fields a loss strategy set (masks, extra terms, per-token clip range, KL factor), by field name
    (``LossTerms.TERMS``)."""
    if terms is None:
        return {}
    return {name: getattr(terms, name) for name in LossTerms.TERMS if torch.is_tensor(getattr(terms, name))}


def declared_columns(strategy_name: str, strategy, terms: LossTerms) -> dict[str, torch.Tensor]:
    """The strategy's per-token diagnostics (``LossTerms.columns``), each declared in its class's ``columns``; an
    undeclared one (or one named like a ``LossTerms`` field) is refused naming the strategy
    (``strategies.base.declared_columns``, the check every kind's columns pass)."""
    return checked_columns(strategy_name, strategy, terms.columns, reserved=tuple(LossTerms.TERMS))


def environment_token_loss(terms: LossTerms | None, env_mask: torch.Tensor | None, accumulation_steps: float
                           ) -> torch.Tensor | None:
    """The strategies' ``env_loss`` summed over the environment tokens of the micro-batch they cover (``env_mask``
    narrowed by the strategies' ``LossTerms.env_mask``), divided by their number (1 at least) and by the accumulation
    steps; None when no strategy set one or the batch has no such tokens."""
    if terms is None or terms.env_loss is None or env_mask is None:
        return None
    env_mask = env_mask.to(terms.env_loss.dtype)
    if terms.env_mask is not None:
        env_mask = env_mask * terms.env_mask.to(env_mask.dtype)
    return (terms.env_loss * env_mask).sum() / env_mask.sum().clamp(min=1.0) / accumulation_steps
