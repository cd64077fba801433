"""The policy loss of one micro-batch as one function: tensors and settings in, ``PolicyLossResult`` out.

``policy_loss`` is TRL 1.16's ``GRPOTrainer._compute_loss`` after the forward, for every TRL loss type, with the
strategies folded in (docs/methods.md §1 and "Strategy kinds"):

    A      = f(p_old) * A                                       a folded advantage strategy (AR on-policy), else A
    r      = exp(log r),  log r at importance_sampling_level     (surrogates.log_importance_weights)
    w      = the weight strategy's token weights                 (1 without one)
    s      = surrogate(w r or r; eps_low, eps_high, A) [* w]     (surrogates.weighted_policy_surrogate)
    l      = min(token_mask * where(gradient_mask, s, sg[s]), loss_cap) + extra_loss   (the loss strategies' terms;
             their loss_mask takes tokens out of the mask below, normaliser included: verl's rejection)
    l      = l * off_policy_mask * entropy_mask * vllm_is_ratio              (TRL's masks and IS correction)
    l      = l + beta * kl_weight * kl(w)                        (surrogates.kl_penalty, the one KL estimator)
    L      = aggregate(l)  or  a sequence objective              (aggregation)
    L      = L + sum(env_loss * env_mask) / sum(env_mask)        (a loss strategy's term on environment tokens: ECHO)
    L      = L - entropy_coef * H  + router_aux_loss_coef * aux  (TRL's entropy bonus and MoE auxiliary loss)

It reads no trainer: what the trainer knows arrives as ``LossBatch`` (this micro-batch's tensors, TRL's masks
already computed), ``LossSettings`` (the config's and TRL's numbers) and the ``StrategySet``; metrics are reduced over
processes by ``accelerator`` (``reduce``/``gather``, as TRL's are) and returned, never appended anywhere. The trainer
appends them and hands the result's per-token tensors to the telemetry; the sharpness probe calls this function for
its own loss passes and keeps nothing of them. With the ``equal`` strategy the loss and gradients are the parent's
(tests/integration/test_parity.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOTrainer

from sharpgrpo.strategies import AdvantageStrategy, LossContext
from sharpgrpo.training.loss.aggregation import (
    WINDOW_NORMALISED_LOSS_TYPES,
    aggregate_loss,
    sequence_objective_loss,
    token_loss_shares,
    window_token_share,
)
from sharpgrpo.training.loss.metrics import global_masked_mean, loss_metrics, process_means, weight_metrics
from sharpgrpo.training.loss.surrogates import kl_penalty, log_importance_weights, weighted_policy_surrogate
from sharpgrpo.training.loss.terms import apply_token_terms, clip_range, environment_token_loss, weighted_kl


@dataclass(frozen=True)
class LossSettings:
    """The numbers the loss reads from the config and TRL's trainer (``from_trainer``); names as in ``GRPOConfig``."""

    loss_type: str
    importance_sampling_level: str = "token"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    delta: float | None = None
    beta: float = 0.0
    kl_weighting: str = "loss"
    kl_estimator: str = "k3"  # sharpgrpo.strategies.kl_estimators (TRL's k3 by default)
    use_bias_correction_kl: bool = False
    weight_placement: str = "loss"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo: dict[str, float] = field(default_factory=dict)  # k_pos, lambda_pos, k_neg, lambda_neg
    off_policy_mask_threshold: float | None = None
    vllm_importance_sampling: bool = False  # multiply by TRL's ``importance_sampling_ratio``
    max_completion_length: int | None = None
    steps_per_generation: int = 1
    entropy_bonus: bool = False  # TRL's ``_entropy_bonus_enabled``
    router_aux_loss_coef: float = 0.0

    @classmethod
    def from_trainer(cls, trainer) -> LossSettings:
        """Read at every micro-batch, so that a changed ``trainer.loss_type`` or ``args`` field takes effect."""
        args = trainer.args
        return cls(
            loss_type=trainer.loss_type, importance_sampling_level=trainer.importance_sampling_level,
            epsilon_low=trainer.epsilon_low, epsilon_high=trainer.epsilon_high, delta=args.delta, beta=trainer.beta,
            kl_weighting=args.kl_weighting, kl_estimator=args.kl_estimator,
            use_bias_correction_kl=args.use_bias_correction_kl,
            weight_placement=args.weight_placement, sapo_temperature_pos=args.sapo_temperature_pos,
            sapo_temperature_neg=args.sapo_temperature_neg,
            vespo={"k_pos": args.vespo_k_pos, "lambda_pos": args.vespo_lambda_pos, "k_neg": args.vespo_k_neg,
                   "lambda_neg": args.vespo_lambda_neg},
            off_policy_mask_threshold=trainer.off_policy_mask_threshold,
            vllm_importance_sampling=trainer.use_vllm and trainer.vllm_importance_sampling_correction,
            max_completion_length=trainer.max_completion_length, steps_per_generation=args.steps_per_generation,
            entropy_bonus=trainer._entropy_bonus_enabled,
            router_aux_loss_coef=trainer.router_aux_loss_coef if trainer.aux_loss_enabled else 0.0,
        )


@dataclass(frozen=True)
class LossBatch:
    """One micro-batch as the loss sees it, after the forward. Shapes: ``B`` completions, ``T`` tokens.

    Attributes:
        logps: (B, T) log-probabilities of the sampled tokens under the policy being trained, with their graph.
        entropies: (B, T) per-token entropy of that policy (TRL's ``compute_entropy``).
        mask: (B, T) {0, 1} completion mask times TRL's tool mask.
        advantages: (B,), (B, 1) or (B, T) advantages (after the advantage strategies run at generation).
        old_logps: (B, T) TRL's ``old_per_token_logps`` or None (on-policy: the loss's own detached ``logps``).
        sampling_logps: (B, T) TRL's ``sampling_per_token_logps`` (the sampling engine's) or None.
        ref_logps: (B, T) the reference model's log-probabilities (``beta`` > 0).
        importance_sampling_ratio: TRL's vLLM importance-sampling ratio, or None.
        entropy_mask: (B, T) TRL's top-entropy mask, or None.
        aux_loss: the MoE router's auxiliary loss, or None.
        num_items_in_batch: TRL's count of a generation batch's loss tokens over all processes (window normaliser).
        accumulation_steps: gradient accumulation steps of the window (1 in evaluation).
        training: a training micro-batch (the window normaliser spans ``accumulation_steps``).
        env_mask: (B, T) {0, 1} the completion tokens the environment wrote (TRL's tool mask 0), or None.
        env_roles: (B, T) long, the environment tokens' message roles (``LossContext.env_roles``), or None.
        completion_ids: (B, T) long, the completion's token ids, or None.
    """

    logps: torch.Tensor
    entropies: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    old_logps: torch.Tensor | None = None
    sampling_logps: torch.Tensor | None = None
    ref_logps: torch.Tensor | None = None
    importance_sampling_ratio: torch.Tensor | None = None
    entropy_mask: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    num_items_in_batch: torch.Tensor | None = None
    accumulation_steps: float = 1.0
    training: bool = True
    env_mask: torch.Tensor | None = None
    env_roles: torch.Tensor | None = None
    completion_ids: torch.Tensor | None = None


@dataclass(frozen=True)
class LossTensors:
    """The per-token tensors the loss used, detached when read (the telemetry's columns: ``COLUMNS``)."""

    mask: torch.Tensor  # the batch's loss mask (completion mask times tool mask)
    loss_mask: torch.Tensor  # the mask the loss was aggregated over: ``mask`` less the tokens a strategy removed
    old_logp: torch.Tensor
    sampling_logp: torch.Tensor | None
    logp: torch.Tensor
    ratio: torch.Tensor
    surrogate_ratio: torch.Tensor
    entropy: torch.Tensor
    entropy_mask: torch.Tensor | None
    weight: torch.Tensor | None
    advantage: torch.Tensor
    token_loss: torch.Tensor
    off_policy_mask: torch.Tensor | None
    is_weight: torch.Tensor | None
    kl: torch.Tensor | None
    epsilon_low: float | torch.Tensor  # the clip range the surrogate used (a loss strategy's per-token one)
    epsilon_high: float | torch.Tensor
    strategy_terms: dict[str, torch.Tensor]  # each loss strategy's per-token terms, "<strategy>/<field>"


@dataclass(frozen=True)
class PolicyLossResult:
    """What ``policy_loss`` returns.

    Attributes:
        loss: the scalar to back-propagate.
        metrics: this micro-batch's metrics, reduced over processes (TRL's names and ours).
        tensors: the per-token tensors the loss used (``LossTensors``).
        weights: the weight strategy's weights (None without one); the sharpness probe pins them.
        entropy_stats: (sum of entropy over the effective mask, its token count), detached, for TRL's adaptive
            entropy control (None without the entropy bonus).
        loss_type, accumulation_steps, window_tokens, max_completion_length: how the per-token loss was aggregated
            (``loss_shares``).
    """

    loss: torch.Tensor
    metrics: dict[str, float]
    tensors: LossTensors
    weights: torch.Tensor | None
    entropy_stats: torch.Tensor | None
    loss_type: str
    accumulation_steps: float
    window_tokens: torch.Tensor | None
    max_completion_length: int | None

    def loss_shares(self) -> torch.Tensor:
        """(B, T) each token's factor in the aggregated loss (``aggregation.token_loss_shares``)."""
        return token_loss_shares(self.tensors.loss_mask, self.loss_type, accumulation_steps=self.accumulation_steps,
                                 window_tokens=self.window_tokens, max_completion_length=self.max_completion_length)


def policy_loss(
    batch: LossBatch,
    strategies,
    settings: LossSettings,
    accelerator: Any,
    *,
    folded: AdvantageStrategy | None = None,
    weights: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> PolicyLossResult:
    """The loss of one micro-batch (module docstring), its metrics and its per-token tensors.

    ``strategies``: the ``StrategySet`` (its weight and loss strategies act here); ``folded``: the advantage strategy
    applied in the loss as a factor of the detached on-policy probabilities, or None; ``weights``: token weights drawn
    earlier for this micro-batch (the sharpness probe's pinned ones; not checked again), else the weight strategy's;
    ``entropy_coef``: the entropy bonus coefficient to apply (TRL's adaptive control decides it before the call).
    A weight strategy's invalid output raises the checker's error naming it, after the metrics were read.
    """
    s, mask, logps = settings, batch.mask, batch.logps
    advantages = batch.advantages.unsqueeze(1) if batch.advantages.dim() == 1 else batch.advantages
    loss_factor = None
    if folded is not None:  # e.g. AR-Lopti: p_old = the loss's own detached probabilities (on-policy)
        loss_factor = folded.loss_factor(logps.detach())
        advantages = loss_factor * advantages
    old_logps = logps.detach() if batch.old_logps is None else batch.old_logps
    terms, strategy_metrics, strategy_terms = strategies.loss_terms(LossContext(
        logps, old_logps, advantages, mask, batch.entropies.detach(), s.epsilon_low, s.epsilon_high,
        batch.entropy_mask, batch.sampling_logps, batch.env_mask, batch.env_roles,
        batch.completion_ids))  # masks, extra terms, clip range, sequence loss
    if terms is not None and terms.loss_mask is not None:  # e.g. rejected tokens: out of the loss and its normaliser
        mask = mask * terms.loss_mask.to(mask.dtype)
    off_policy_mask = None
    if s.off_policy_mask_threshold is not None:
        off_policy_mask = GRPOTrainer.get_off_policy_mask(
            advantages=advantages, per_token_logps=logps,
            sampling_per_token_logps=old_logps if batch.sampling_logps is None else batch.sampling_logps,
            mask=mask, off_policy_threshold=s.off_policy_mask_threshold,
        )
    epsilon_low, epsilon_high = clip_range(terms, s.epsilon_low, s.epsilon_high)
    log_ratio = logps - old_logps
    coef_1 = torch.exp(log_importance_weights(logps, old_logps, mask, s.importance_sampling_level))
    bad_weights = None
    if strategies.weight is not None and weights is None:
        weights, bad_weights = strategies.token_weights(logps, mask, advantages, batch.entropies)
    per_token_kl = None
    if s.beta != 0.0:
        per_token_kl = kl_penalty(batch.ref_logps, logps, weights, s.kl_weighting,
                                  coef_1 if s.use_bias_correction_kl else None, estimator=s.kl_estimator)
    phi_seq = None
    if s.loss_type == "vespo":  # TRL's gamma weight of the sequence ratio (the parent's own method)
        phi_seq = GRPOTrainer.get_gamma_weights(
            advantages=advantages, log_ratio_per_token=log_ratio, mask=mask,
            importance_sampling_ratio=batch.importance_sampling_ratio, **s.vespo,
        )
    per_token_loss, surrogate_ratio = weighted_policy_surrogate(
        s.loss_type, coef_1, advantages, logps, weights, s.weight_placement, epsilon_low=epsilon_low,
        epsilon_high=epsilon_high, delta=s.delta, sapo_temperature_pos=s.sapo_temperature_pos,
        sapo_temperature_neg=s.sapo_temperature_neg, phi_seq=phi_seq,
    )
    per_token_loss = apply_token_terms(per_token_loss, terms)
    if terms is not None and terms.loss_mask is not None:  # a removed token's term is 0, as its share is
        per_token_loss = per_token_loss * terms.loss_mask.to(per_token_loss.dtype)
    if off_policy_mask is not None:
        per_token_loss = per_token_loss * off_policy_mask
    if batch.entropy_mask is not None:
        per_token_loss = per_token_loss * batch.entropy_mask
    is_weight = batch.importance_sampling_ratio if s.vllm_importance_sampling else None
    if is_weight is not None and s.loss_type != "vespo":  # VESPO has it inside phi
        per_token_loss = per_token_loss * is_weight
    if per_token_kl is not None:
        per_token_kl = weighted_kl(per_token_kl, terms)
        per_token_loss = per_token_loss + s.beta * per_token_kl

    accumulation = batch.accumulation_steps
    window_tokens = None
    if s.loss_type in WINDOW_NORMALISED_LOSS_TYPES:
        window_tokens = window_token_share(batch.num_items_in_batch, accelerator.num_processes,
                                           *((accumulation, s.steps_per_generation) if batch.training else ()))
    if terms is not None and terms.sequence_loss is not None:  # GMPO: replaces the surrogate and aggregation
        loss, policy_part = sequence_objective_loss(terms.sequence_loss, per_token_kl, s.beta, mask, accumulation)
    else:
        loss, policy_part = aggregate_loss(per_token_loss, mask, s.loss_type, accumulation_steps=accumulation,
                                           window_tokens=window_tokens, max_completion_length=s.max_completion_length)
    env_loss = environment_token_loss(terms, batch.env_mask, accumulation)  # ECHO: its own token mean
    if env_loss is not None:
        loss = loss + env_loss
    metrics: dict[str, float] = {}
    entropy_stats = None
    if s.entropy_bonus:  # TRL's: the coefficient times the mean entropy over the effective mask, per window
        effective_mask = mask if batch.entropy_mask is None else mask * batch.entropy_mask
        entropies = batch.entropies
        entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation
        metrics["policy_loss"] = accelerator.gather(policy_part).nanmean().item()
        entropy_stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
        loss = loss - entropy_coef * entropy_loss
    if batch.aux_loss is not None:
        loss = loss + s.router_aux_loss_coef * batch.aux_loss / accumulation
        metrics["aux_loss"] = accelerator.gather_for_metrics(batch.aux_loss).mean().item()

    clip = (epsilon_low, epsilon_high)
    metrics |= loss_metrics(accelerator, s.loss_type, mask, batch.entropies, coef_1, advantages, clip_range=clip,
                            kl=per_token_kl, phi_seq=phi_seq)
    metrics |= process_means(accelerator, strategy_metrics)
    if folded is not None:
        metrics[folded.loss_factor_metric] = global_masked_mean(accelerator, loss_factor, mask)
    bad = 0
    if weights is not None:
        weight_values, bad = weight_metrics(
            accelerator, weights, mask, advantages, bounds=strategies.weight.bounds(), clip_range=clip,
            loss_type=s.loss_type, surrogate_ratio=surrogate_ratio, bad_weights=bad_weights,
        )
        metrics |= weight_values
    if bad:
        strategies.checker.raise_for_weights(strategies.weight, weights, logps, mask)
    tensors = LossTensors(
        mask=batch.mask, loss_mask=mask, old_logp=old_logps, sampling_logp=batch.sampling_logps, logp=logps,
        ratio=coef_1, surrogate_ratio=surrogate_ratio, entropy=batch.entropies, entropy_mask=batch.entropy_mask,
        weight=weights,
        advantage=advantages, token_loss=per_token_loss, off_policy_mask=off_policy_mask, is_weight=is_weight,
        kl=per_token_kl, epsilon_low=epsilon_low, epsilon_high=epsilon_high, strategy_terms=strategy_terms,
    )
    return PolicyLossResult(loss, metrics, tensors, weights, entropy_stats, s.loss_type, accumulation,
                            window_tokens, s.max_completion_length)
