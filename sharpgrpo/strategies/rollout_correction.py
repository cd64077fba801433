"""Rollout correction: importance weights, rejection and mismatch diagnostics between the policy that sampled a batch
(the rollout engine, e.g. vLLM: ``pi_rollout``) and the policy the trainer computes (``pi_train``).

Released code reproduced here (read, not copied): verl 0.9.1's ``verl/trainer/ppo/rollout_corr_helper.py`` (the PyPI
release, Apache-2.0; the tests import it and run it unchanged on shared inputs; line numbers below are of that file),
and the presets of ``RolloutCorrectionConfig`` in ``verl/trainer/config/algorithm.py`` of the same release. With ``r_t = pi_train(y_t) / pi_rollout(y_t)`` and
``log r_t`` clamped to +-20 before any ``exp`` (``SAFETY_BOUND``, rollout_corr_helper.py line 75):

* importance weights (``compute_rollout_correction_weights``, lines 522-657): token ``w_t = r_t``; sequence
  ``w = prod_t r_t = exp(sum_t log r_t)``; geometric ``w = exp(mean_t log r_t)`` (the length-normalised ratio of
  GSPO; verl reports it only as a rejection statistic, ``seq_mean_k1``, its "Geo-RS"). Then ``truncate`` (TIS:
  ``min(w, C)``) or ``mask`` (MIS, Liu et al. 2025: ``w 1[w <= C]``), optionally divided by their batch mean;
  0 on padding;
* rejection (``compute_rollout_rejection_mask``, lines 197-413): per token ``k1 = -log r``, ``k2 = (log r)^2 / 2``,
  ``k3 = r - 1 - log r``; a token (``token_k*``) or a whole sequence (its sum, mean or max: ``seq_sum_k*``,
  ``seq_mean_k*``, ``seq_max_k{2,3}``) is rejected when the statistic leaves its bound: ``log(lower) <= k1 <=
  log(upper)`` for K1, ``k <= upper`` for K2 and K3; several options must all pass;
* diagnostics (``compute_offpolicy_metrics``, lines 904-1011, and ``compute_is_metrics``, lines 660-784): mismatch
  KL ``E[log pi_rollout - log pi_train]`` and its K3 form, both perplexities, their log difference and ratio,
  chi-square at token level ``E[r_t^2] - 1`` and sequence level ``E[(prod_t r_t)^2] - 1``, and the effective sample
  size ``1 / E[(w / E[w])^2]`` of the weights clamped to ``[1/C, C]``.

Modes (verl's ``bypass_mode``): ``decoupled`` keeps three policies (``pi_rollout`` samples, ``pi_old`` is the
trainer's recomputation, ``pi_theta`` is trained) and weights the PPO loss by ``w(pi_old / pi_rollout)``; ``bypass``
takes ``pi_old = pi_rollout`` (no recomputation), so the PPO ratio itself is ``pi_theta / pi_rollout``.

Masked means are ``sum(v m) / sum(m)`` (verl adds 1e-8 to the count, a relative 1e-8 difference on a non-empty mask).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    LossContext,
    LossTerms,
    StrategyPaper,
    TokenLossStrategy,
    masked_mean,
    register_strategy,
)
from sharpgrpo.strategies.loss_types import PPO_CLIP_LOSS_TYPES

SAFETY_BOUND = 20.0  # rollout_corr_helper.py line 74: |log r| clamped before exp
IS_LEVELS = ("token", "sequence", "geometric")
IS_HANDLING = ("truncate", "mask")
TOKEN_RS_OPTIONS = ("token_k1", "token_k2", "token_k3")
RS_OPTIONS = TOKEN_RS_OPTIONS + (
    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3",
)  # fmt: skip
MODES = ("decoupled", "bypass")


@dataclass(frozen=True)
class CorrectionPreset:
    """One of verl's ``RolloutCorrectionConfig`` presets (algorithm.py, commit b178a3c, lines 181-560)."""

    rollout_is: str | None
    is_threshold: float
    rollout_rs: str | None
    rs_threshold: str | None
    mode: str


# verl's presets by their factory-method name, with verl's default thresholds.
PRESETS: dict[str, CorrectionPreset] = {
    "decoupled_token_is": CorrectionPreset("token", 2.0, None, None, "decoupled"),
    "decoupled_seq_is": CorrectionPreset("sequence", 2.0, None, None, "decoupled"),
    "decoupled_seq_is_rs": CorrectionPreset("sequence", 2.0, "seq_sum_k1", "0.5_2.0", "decoupled"),
    "decoupled_geo_rs": CorrectionPreset(None, 2.0, "seq_mean_k1", "0.999_1.001", "decoupled"),
    "decoupled_geo_rs_seq_tis": CorrectionPreset("sequence", 2.0, "seq_mean_k1", "0.999_1.001", "decoupled"),
    "decoupled_geo_rs_token_tis": CorrectionPreset("token", 2.0, "seq_mean_k1", "0.999_1.001", "decoupled"),
    "decoupled_k3_rs": CorrectionPreset(None, 2.0, "seq_mean_k3", "0.01", "decoupled"),
    "decoupled_k3_rs_seq_tis": CorrectionPreset("sequence", 2.0, "seq_mean_k3", "0.01", "decoupled"),
    "decoupled_k3_rs_token_tis": CorrectionPreset("token", 2.0, "seq_mean_k3", "0.01", "decoupled"),
    "bypass_ppo_clip": CorrectionPreset(None, 2.0, None, None, "bypass"),
    "bypass_ppo_clip_geo_rs": CorrectionPreset(None, 2.0, "seq_mean_k1", "0.999_1.001", "bypass"),
    "bypass_ppo_clip_k3_rs": CorrectionPreset(None, 2.0, "seq_mean_k3", "0.01", "bypass"),
}


def _masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    values = torch.where(mask.bool(), values, torch.zeros_like(values))  # NaN on padding never leaks in
    return values.sum() if dim is None else values.sum(dim=dim)


def _masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The strategies' one masked mean (``base.masked_mean``), with NaN off the mask zeroed first (vLLM's padded
    log-probabilities are NaN there)."""
    return masked_mean(torch.where(mask.bool(), values, torch.zeros_like(values)), mask, dim)


def log_ratio(train_logps: torch.Tensor, rollout_logps: torch.Tensor) -> torch.Tensor:
    """``log r = log pi_train - log pi_rollout`` per token (rollout_corr_helper.py line 778). (B, T) -> (B, T)."""
    return train_logps - rollout_logps


def filled_sampling_logps(train_logps: torch.Tensor, sampling_logps: torch.Tensor) -> torch.Tensor:
    """The sampling engine's log-probabilities with each NaN (a token vLLM could not score) replaced by the trainer's
    own, so that its ratio is exactly 1: no correction, no rejection, no mismatch, as TRL 1.16 treats it
    (grpo_trainer.py ``_generate_and_score_completions``: ``torch.nan_to_num(per_token_logps_diff, nan=0.0)``, "their
    importance ratio is exactly 1"). (B, T) -> (B, T)."""
    return torch.where(torch.isnan(sampling_logps), train_logps.detach(), sampling_logps)


def rollout_log_ratio(old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The strategies' input: :func:`log_ratio` of the trainer's detached log-probabilities over the sampling
    engine's, 0 where vLLM's is NaN (:func:`filled_sampling_logps`) and on every token off ``mask``. (B, T)."""
    sampling = filled_sampling_logps(old_logps, sampling_logps)
    return log_ratio(old_logps.detach(), sampling).masked_fill(~mask.bool(), 0.0)


def divergence_estimators(log_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token K1, K2, K3 of ``log r`` clamped to +-SAFETY_BOUND (rollout_corr_helper.py lines 226-229):
    ``k1 = -log r``, ``k2 = (log r)^2 / 2``, ``k3 = exp(log r) - 1 - log r``."""
    safe = log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return -safe, 0.5 * safe.square(), torch.exp(safe) - 1.0 - safe


def raw_importance_weights(log_r: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Untruncated weights, 0 on padding: token ``r_t``; sequence ``exp(sum_t log r_t)``; geometric
    ``exp(mean_t log r_t)``, each exponent clamped to +-SAFETY_BOUND (rollout_corr_helper.py lines 534-550).
    (B, T) -> (B, T)."""
    if level == "token":
        exponent = log_r
    elif level == "sequence":
        exponent = _masked_sum(log_r, mask, dim=-1).unsqueeze(-1).expand_as(log_r)
    elif level == "geometric":
        exponent = _masked_mean(log_r, mask, dim=-1).unsqueeze(-1).expand_as(log_r)
    else:
        raise ValueError(f"rollout_is={level!r}: must be one of {', '.join(IS_LEVELS)}.")
    return torch.exp(exponent.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask.to(log_r.dtype)


def importance_weights(
    log_r: torch.Tensor, mask: torch.Tensor, level: str, threshold: float, handling: str = "truncate",
    batch_normalize: bool = False,
) -> torch.Tensor:
    """Detached rollout-correction weights (B, T), 0 on padding: :func:`raw_importance_weights`, then ``truncate``
    (``min(w, C)``, verl's TIS, rollout_corr_helper.py line 566) or ``mask`` (``w 1[w <= C]``, MIS), then, with
    ``batch_normalize``, divided by their mean over the batch's tokens (token level) or sequences (sequence and
    geometric levels) when that mean exceeds 1e-8 (lines 575-603)."""
    if not threshold > 0:
        raise ValueError(f"rollout_is_threshold={threshold}: must be > 0.")
    weights = raw_importance_weights(log_r.detach(), mask, level)
    if handling == "truncate":
        weights = weights.clamp(max=threshold)
    elif handling == "mask":
        weights = weights * (weights <= threshold).to(weights.dtype)
    else:
        raise ValueError(f"rollout_is_handling={handling!r}: must be one of {', '.join(IS_HANDLING)}.")
    if batch_normalize:
        if level == "token":
            mean = _masked_mean(weights, mask)
        else:
            valid = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = (_masked_mean(weights, mask, dim=-1) * valid).sum() / valid.sum().clamp_min(1e-8)
        weights = torch.where(mean > 1e-8, weights / mean, weights)
    return weights


def parse_rejection_thresholds(options: list[str], spec: str | float) -> dict[str, tuple[float | None, float]]:
    """Per option, ``(lower, upper)``: K1 options take ``"lower_upper"`` ratio bounds (one number: the upper, its
    reciprocal the lower); K2/K3 options one upper bound. One spec is shared by every option, or one per option,
    comma separated (rollout_corr_helper.py lines 92-158)."""
    specs = [str(spec)] if isinstance(spec, (int, float)) else [part.strip() for part in str(spec).split(",")]
    specs = [part for part in specs if part]
    if len(specs) not in (1, len(options)):
        raise ValueError(f"rollout_rs_threshold={spec!r}: give one threshold or one per rollout_rs option "
                         f"({len(options)}).")
    specs = specs * len(options) if len(specs) == 1 else specs
    bounds: dict[str, tuple[float | None, float]] = {}
    for option, text in zip(options, specs, strict=True):
        try:
            if option.endswith("k1"):
                lower_text, upper_text = text.split("_", 1) if "_" in text else (None, text)
                upper = float(upper_text)
                lower = 1.0 / upper if lower_text is None else float(lower_text)
            else:
                if "_" in text:
                    raise ValueError
                lower, upper = None, float(text)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"rollout_rs_threshold={spec!r}: {text!r} is not a valid bound for {option} (K1: "
                             "'lower_upper' ratio bounds; K2/K3: one positive upper bound).") from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold={spec!r}: the bounds of {option} must be > 0.")
        if lower is not None and lower > upper:
            raise ValueError(f"rollout_rs_threshold={spec!r}: the lower bound of {option} exceeds its upper bound "
                             "(one K1 number is the upper ratio bound, so it must be >= 1).")
        bounds[option] = (lower, upper)
    return bounds


def parse_rejection_options(rollout_rs: str) -> list[str]:
    """The comma-separated options, duplicates dropped in order, each one of :data:`RS_OPTIONS`."""
    options = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    unknown = [option for option in options if option not in RS_OPTIONS]
    if not options or unknown:
        raise ValueError(f"rollout_rs={rollout_rs!r}: options must be among {', '.join(RS_OPTIONS)}.")
    return options


def rejection_statistic(log_r: torch.Tensor, mask: torch.Tensor, option: str) -> torch.Tensor:
    """The statistic ``option`` bounds: per token (B, T) for ``token_k*``, per sequence (B,) otherwise (its sum, mean
    or max over the sequence's tokens; the max of an empty sequence is 0)."""
    k1, k2, k3 = divergence_estimators(log_r)
    per_token = {"k1": k1, "k2": k2, "k3": k3}[option[-2:]]
    if option in TOKEN_RS_OPTIONS:
        return per_token
    if option.startswith("seq_sum"):
        return _masked_sum(per_token, mask, dim=-1)
    if option.startswith("seq_mean"):
        return _masked_mean(per_token, mask, dim=-1)
    peak = per_token.masked_fill(~mask.bool(), -math.inf).max(dim=-1).values
    return torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)


def rejection_mask(log_r: torch.Tensor, mask: torch.Tensor, rollout_rs: str, threshold: str | float) -> torch.Tensor:
    """(B, T) {0, 1}: 1 where the token and its sequence pass every option of ``rollout_rs`` (and are not padding).
    K1 statistics must lie in ``[log lower, log upper]``; K2/K3 statistics at most ``upper``."""
    options = parse_rejection_options(rollout_rs)
    bounds = parse_rejection_thresholds(options, threshold)
    keep = mask.bool().clone()
    for option in options:
        lower, upper = bounds[option]
        statistic = rejection_statistic(log_r.detach(), mask, option)
        if lower is not None:
            passed = (statistic >= math.log(lower)) & (statistic <= math.log(upper))
        else:
            passed = statistic <= upper
        keep &= passed if passed.dim() == 2 else passed.unsqueeze(-1)
    return keep.to(log_r.dtype)


def mismatch_per_token(log_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token mismatch KL estimates of ``log r = log pi_train - log pi_rollout``, the terms whose masked means are
    verl's ``kl`` and ``k3_kl`` diagnostics (verl 0.9.1 ``rollout_corr_helper.py`` ``compute_offpolicy_metrics``,
    lines 959 and 964-966): K1 ``log pi_rollout - log pi_train = -log r`` and K3 ``exp(log r) - log r - 1`` (no
    clamp, as there). (B, T) -> ((B, T), (B, T))."""
    return -log_r, torch.exp(log_r) - log_r - 1


def mismatch_diagnostics(train_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor
                         ) -> dict[str, torch.Tensor]:
    """verl's off-policy diagnostics (rollout_corr_helper.py lines 822-931), 0-d tensors: ``kl`` =
    E[log pi_rollout - log pi_train] (KL(pi_rollout || pi_train)), ``k3_kl`` = E[r - log r - 1], ``training_ppl`` /
    ``rollout_ppl`` = batch mean of exp(-mean_t log p), their ``*_log_ppl``, ``log_ppl_diff`` (mean, abs mean, max,
    min of the per-sequence rollout minus train mean log-probability), ``ppl_ratio`` = mean exp(log_ppl_diff),
    ``chi2_token`` = E_t[r_t^2] - 1 and ``chi2_seq`` = E_seq[exp(2 sum_t log r_t)] - 1 (log r clamped to +-20).
    Sequence means run over every row, as verl's do (a row without tokens counts as log-probability 0)."""
    log_r = log_ratio(train_logps, rollout_logps)
    train_mean = _masked_mean(train_logps, mask, dim=-1)
    rollout_mean = _masked_mean(rollout_logps, mask, dim=-1)
    log_ppl_diff = rollout_mean - train_mean
    k1, k3 = mismatch_per_token(log_r)
    safe = log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    sequence_sum = _masked_sum(log_r, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-train_mean).mean(),
        "training_log_ppl": (-train_mean).mean(),
        "kl": _masked_mean(k1, mask),
        "k3_kl": _masked_mean(k3, mask),
        "rollout_ppl": torch.exp(-rollout_mean).mean(),
        "rollout_log_ppl": (-rollout_mean).mean(),
        "log_ppl_diff": log_ppl_diff.mean(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean(),
        "log_ppl_diff_max": log_ppl_diff.max(),
        "log_ppl_diff_min": log_ppl_diff.min(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean(),
        "chi2_token": _masked_mean(torch.exp(safe).square(), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * sequence_sum).mean() - 1.0,
    }


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """verl's ESS of the weights (verl 0.9.1, rollout_corr_helper.py lines 753-759): with ``v = clamp(w, 0, C)`` (the
    truncated weights) and ``u = v / (E[v] + 1e-8)``, ``1 / E[u^2]`` over the batch's tokens; 1 when all weights are
    equal, 1/n for one weight of n."""
    clamped = weights.clamp(min=0.0, max=threshold)
    normalised = clamped / (_masked_mean(clamped, mask) + 1e-8)
    return 1.0 / _masked_mean(normalised.square(), mask)


def rejected_fractions(keep: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fraction of tokens rejected, fraction of sequences with a rejected token), verl's
    ``rollout_rs_masked_fraction`` and ``rollout_rs_seq_masked_fraction`` (rollout_corr_helper.py lines 343-347)."""
    rejected = mask.bool() & ~keep.bool()
    return _masked_mean(rejected.to(keep.dtype), mask), rejected.any(dim=-1).to(keep.dtype).mean()


def truncated_support(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                      min_p: float = 0.0) -> torch.Tensor:
    """The kept set a truncating sampler builds from ``logits`` (B, T, V) -> (B, T, V) bool, as vLLM 0.31's sampler
    builds it (``vllm/v1/sample/sampler.py`` ``Sampler.sample``: temperature, then min-p, then
    ``apply_top_k_top_p_pytorch`` in ``vllm/v1/sample/ops/topk_topp_sampler.py``: top-k, then top-p over the
    top-k-renormalised distribution, keeping at least the most likely token). Computed in ``logits``' dtype at least
    float32 (pass float64 for a reference)."""
    scaled = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    full = torch.log_softmax(scaled, dim=-1)
    kept = torch.ones_like(scaled, dtype=torch.bool)
    if min_p > 0:
        kept &= full >= full.max(dim=-1, keepdim=True).values + math.log(min_p)
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.masked_fill(~kept, -math.inf).topk(top_k, dim=-1).values[..., -1:]
        kept &= scaled >= kth
    if top_p < 1:
        truncated = torch.log_softmax(scaled.masked_fill(~kept, -math.inf), dim=-1)
        ordered, order = truncated.sort(dim=-1, descending=False)
        below = torch.cumsum(ordered.exp(), dim=-1) <= 1 - top_p
        below[..., -1] = False
        kept &= ~torch.zeros_like(below).scatter(-1, order, below)
    return kept


def truncated_support_logps(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
    min_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled tokens' log-probabilities on the support a truncating sampler kept, and the log of the kept mass.

    A sampler that truncates (``top_k`` > 0, ``top_p`` < 1, ``min_p`` > 0) draws from the temperature-scaled
    distribution renormalised over the tokens it keeps, ``q(y) = p(y) / S`` with ``S`` the kept mass; vLLM reports
    ``log q`` (``logprobs_mode="processed_logprobs"``, as TRL starts it), the trainer computes ``log p`` over the whole
    vocabulary, so ``log p - log q = log S`` for every token: the truncated-support bias of TRL's importance ratio
    (trl#6789). Replaying the truncation on the trainer's logits gives ``log q`` back. The kept set is
    :func:`truncated_support`'s; the sampled token always counts as kept (a token at the boundary may fall either
    side by float rounding). With the kept set vLLM itself returned, :func:`kept_set_logps` needs no sampling
    parameters (``sharpgrpo.training.generation.kept_sets``).

    Shapes: ``logits`` (B, T, V), ``tokens`` (B, T) -> (``log q`` (B, T), ``log S`` (B, T)).
    """
    full = torch.log_softmax(logits.float() / temperature, dim=-1)
    kept = truncated_support(logits, temperature, top_k, top_p, min_p)
    kept.scatter_(-1, tokens.unsqueeze(-1), True)
    log_kept_mass = torch.logsumexp(full.masked_fill(~kept, -math.inf), dim=-1)
    token_logps = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return token_logps - log_kept_mass, log_kept_mass


VLLM_MAX_LOGPROBS = 20  # vLLM 0.31 ModelConfig.max_logprobs default; TRL 1.16 does not change it


def effective_sampling(args: Any) -> dict[str, float]:
    """``top_k``, ``top_p``, ``min_p`` as vLLM receives them: the config's, overridden by ``generation_kwargs``
    (``top_k`` 0 or -1 and ``min_p`` 0 are off, as in TRL and vLLM)."""
    kwargs = dict(getattr(args, "generation_kwargs", None) or {})
    top_k, top_p, min_p = (kwargs.get(key, getattr(args, key, None)) for key in ("top_k", "top_p", "min_p"))
    return {"top_k": max(int(top_k or 0), 0), "top_p": 1.0 if top_p is None else float(top_p),
            "min_p": float(min_p or 0.0)}


def sampling_truncates(args: Any) -> bool:
    sampling = effective_sampling(args)
    return sampling["top_k"] > 0 or sampling["top_p"] < 1.0 or sampling["min_p"] > 0.0


def kept_set_problem(args: Any) -> str | None:
    """Why a truncating run's kept sets cannot be replayed (a clause), or None where they can or nothing is
    truncated (``sharpgrpo.training.generation.kept_sets``): they are read from the colocated vLLM engine's outputs,
    and bounded only with top-k on, at most ``VLLM_MAX_LOGPROBS``."""
    if not sampling_truncates(args):
        return None
    top_k = effective_sampling(args)["top_k"]
    if not getattr(args, "use_vllm", False) or args.vllm_mode != "colocate":
        return ("the kept sets are read from the colocated vLLM engine's outputs, and this backend returns none "
                "(a vLLM server, the rollout process, transformers)")
    if top_k <= 0:
        return (f"with top-p / min-p alone the kept set is unbounded, and vLLM returns kept sets only with top-k on "
                f"(its return_sampling_mask refuses top_k <= 0); set top_k (1 to {VLLM_MAX_LOGPROBS})")
    if top_k > VLLM_MAX_LOGPROBS:
        return (f"top_k={top_k}: the kept sets are read from vLLM's top-{top_k} log-probabilities, and vLLM returns "
                f"at most max_logprobs={VLLM_MAX_LOGPROBS}")
    return None


def replays_kept_sets(args: Any) -> bool:
    """Whether the run replays vLLM's kept sets: colocated vLLM sampling with a truncation whose kept sets are read."""
    return bool(getattr(args, "use_vllm", False)) and sampling_truncates(args) and kept_set_problem(args) is None


def kept_set_logps(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tokens: torch.Tensor,
    kept_ids: torch.Tensor, temperature: float, logit_scale: float = 1.0, softcap: float | None = None,
) -> torch.Tensor:
    """The sampled tokens' log-probabilities on a given kept set: ``log q(y) = z_y - logsumexp_{k in K} z_k`` with
    ``z = softcap tanh(logit_scale (h W^T + b) / softcap) / T`` (the transform of TRL 1.16's fused head), computed
    only at the kept ids (``log p(y) - log S`` without the full vocabulary's normaliser, which cancels). Differentiable
    in ``hidden``, ``weight`` and ``bias``; float32.

    Shapes: ``hidden`` (N, H), ``weight`` (V, H), ``bias`` (V,) or None, ``tokens`` (N,), ``kept_ids`` (N, K) with -1
    padding (each row holds its token) -> (N,)."""
    if kept_ids.numel() and not bool((kept_ids == tokens.unsqueeze(-1)).any(dim=-1).all()):
        raise ValueError("kept_ids: a token's kept set does not hold the sampled token.")
    valid = kept_ids >= 0
    rows = weight[kept_ids.clamp_min(0)].float()  # (N, K, H)
    logits = torch.einsum("nh,nkh->nk", hidden.float(), rows)
    if bias is not None:
        logits = logits + bias[kept_ids.clamp_min(0)].float()
    logits = logits * logit_scale
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logits = (logits / temperature).masked_fill(~valid, -math.inf)
    token_logits = logits.masked_fill(kept_ids != tokens.unsqueeze(-1), -math.inf).amax(dim=-1)
    return token_logits - torch.logsumexp(logits, dim=-1)


# --------------------------------------------------------------------------------------------------------------------
# The registered strategies: thin adapters over the functions above.
# --------------------------------------------------------------------------------------------------------------------
ROLLOUT_CORRECTION_PAPER = StrategyPaper(
    title="When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch",
    citation="""@misc{liu2025speedkills,
    title  = {{When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch}},
    author = {Liu, Jiacai and Li, Yingru and Fu, Yuqian and Wang, Jiawei and Liu, Qian and Shen, Yu},
    year   = {2025},
    url    = {https://richardli.xyz/rl-collapse}
}""",
)


def rejection_setting(args: Any) -> str | None:
    """``rollout_rs`` as the functions take it: None for ``none`` or empty."""
    value = str(getattr(args, "rollout_rs", "none") or "none").strip()
    return None if value.lower() == "none" else value


def correction_factors(log_r: torch.Tensor, mask: torch.Tensor, settings: Any, mode: str
                       ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What a correction setting does to each token, the one computation behind both strategies and the telemetry's
    what-if view (``sharpgrpo tokens --what-if``): ``(weights, keep)``, (B, T) each, detached.

    ``keep`` {0, 1}: :func:`rejection_mask` of ``settings.rollout_rs`` / ``rollout_rs_threshold`` (the loss mask
    without rejection). ``weights``, before rejection: ``mode="decoupled"``: :func:`importance_weights` at
    ``settings.rollout_is``'s level (None for ``none``); ``mode="bypass"``: ``pi_old / pi_rollout = exp(log r)``
    (log r clamped to +-SAFETY_BOUND), the PPO ratio's factor. The policy term's factor is ``weights * keep``
    (``keep`` when there are no weights). ``settings``: any object with the ``rollout_*`` fields (the config)."""
    log_r = log_r.detach()
    options = rejection_setting(settings)
    keep = mask.to(log_r.dtype) if options is None else rejection_mask(log_r, mask, options,
                                                                        settings.rollout_rs_threshold)
    if mode == "bypass":
        return torch.exp(log_r.clamp(-SAFETY_BOUND, SAFETY_BOUND)), keep
    if mode != "decoupled":
        raise ValueError(f"mode={mode!r}: must be one of {', '.join(MODES)}.")
    if settings.rollout_is == "none":
        return None, keep
    return importance_weights(log_r, mask, settings.rollout_is, settings.rollout_is_threshold,
                              settings.rollout_is_handling, settings.rollout_is_batch_normalize), keep


DIAGNOSTICS = ("kl", "k3_kl", "chi2_token", "chi2_seq", "ppl_ratio", "log_ppl_abs_diff")
REJECTION_METRICS = ("rejected_fraction", "rejected_seq_fraction")
# The per-token telemetry columns both strategies write (``TokenLossStrategy.columns``), besides their token_mask
# (the factor on the policy term, weights * keep) and the file's sampling_logp (the rollout log-p).
CORRECTION_COLUMNS = {
    "rejected": "1 where the rejection bounds (rollout_rs, rollout_rs_threshold) dropped the token or its sequence, "
    "0 where kept (0 everywhere with rollout_rs none)",
    "mismatch_k1": "the token's mismatch KL term, K1: log pi_rollout - log pi_train, pi_train = pi_old (decoupled) or "
    "pi_theta (bypass, as verl's bypass loss reads it); its mean over the loss tokens is rollout_corr/kl (verl 0.9.1 "
    "compute_offpolicy_metrics)",
    "mismatch_k3": "the token's mismatch KL term, K3: r - log r - 1 with r = pi_train / pi_rollout (its mean over the "
    "loss tokens is rollout_corr/k3_kl)",
}


def dual_clip_cap(advantages: torch.Tensor, factor: torch.Tensor | None, mask: torch.Tensor, clip_ratio_c: float
                  ) -> torch.Tensor | None:
    """verl's dual clip (``compute_policy_loss_vanilla``, core_algos.py: ``pg_losses3 = -advantages * clip_ratio_c``;
    ``torch.where(advantages < 0, torch.min(pg_losses3, clip_pg_losses1), clip_pg_losses1)``; Ye et al. 2020) as a
    cap on the token's policy term: ``-A c factor`` where A < 0 (``factor``: the weights that multiply the term
    after the cap, as verl's ``rollout_is_weights`` multiply ``pg_losses``; None for 1), ``inf`` elsewhere; None when
    ``clip_ratio_c`` is 0 (off). (B, 1) or (B, T) advantages -> (B, T)."""
    if not clip_ratio_c:
        return None
    scale = mask.to(advantages.dtype) if factor is None else factor
    bound = -advantages * clip_ratio_c * scale
    return torch.where((advantages < 0).expand_as(bound), bound, torch.full_like(bound, math.inf)).detach()


class _RolloutCorrection(TokenLossStrategy):
    paper = ROLLOUT_CORRECTION_PAPER

    @classmethod
    def check_params(cls, args: Any) -> None:
        """``rollout_rs`` and ``rollout_rs_threshold`` parse as verl parses them, and ``rollout_clip_ratio_c`` is 0
        (off) or above 1, as verl asserts (one line naming the field)."""
        from sharpgrpo.validation import ConfigError

        if args.rollout_clip_ratio_c and not args.rollout_clip_ratio_c > 1.0:
            raise ConfigError(f"rollout_clip_ratio_c={args.rollout_clip_ratio_c}: dual-clip PPO's bound must be above "
                              "1 (verl's clip_ratio_c; its default 3), or 0 to turn it off.")
        options = rejection_setting(args)
        if options is None:
            return
        if args.rollout_rs_threshold is None or not str(args.rollout_rs_threshold).strip():
            raise ConfigError(f"rollout_rs_threshold is empty: rollout_rs={options!r} needs its bounds.")
        try:
            parse_rejection_thresholds(parse_rejection_options(options), args.rollout_rs_threshold)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @classmethod
    def check_config(cls, args: Any) -> None:
        """Needs vLLM's log-probabilities on the trainer's support, and replaces TRL's own vLLM correction."""
        super().check_config(args)
        from sharpgrpo.validation import ConfigError

        name = cls.registered_name()
        if not (args.use_vllm or getattr(args, "async_generation", False)):
            raise ConfigError(f"strategies: {name} corrects for the sampling engine, whose per-token "
                              "log-probabilities come only with use_vllm=True or async_generation=true (the trainer's "
                              "own transformers generation samples from the policy itself).")
        if args.use_vllm and args.vllm_importance_sampling_correction:
            raise ConfigError(f"strategies: {name} replaces TRL's vLLM importance-sampling correction; set "
                              "vllm_importance_sampling_correction=false.")
        problem = kept_set_problem(args) if args.use_vllm else None  # the rollout process samples untruncated p
        if problem is not None:  # replayed kept sets make vLLM's and the trainer's log-probabilities comparable
            raise ConfigError(f"strategies: {name} with truncated sampling: vLLM's log-probabilities are then of the "
                              f"truncated, renormalised distribution, and {problem} (docs/methods.md §17.3).")

    def _terms(self, context: LossContext, factor: torch.Tensor | None, keep: torch.Tensor, **fields
               ) -> LossTerms:
        """The terms of a correction whose policy-term factor is ``factor`` (None: 1) and whose rejection keeps
        ``keep``: with ``rollout_rs_normalizer`` ``excluded`` (verl) the rejected tokens leave the loss and its
        normaliser (``loss_mask``); with ``kept`` only their term is zeroed (``token_mask``), the normaliser keeps
        them. The dual-clip cap (``rollout_clip_ratio_c``) bounds the term after the factor."""
        rejecting = rejection_setting(self.args) is not None
        if rejecting and self.args.rollout_rs_normalizer == "kept":
            factor = keep if factor is None else factor * keep
        # decoupled: verl caps pg_losses before its IS weights multiply them; bypass: the term is already PPO's on
        # pi_theta / pi_rollout (the factor is part of that ratio), capped at -A c itself
        scale = factor if self.mode == "decoupled" else None
        cap = dual_clip_cap(context.advantages, scale, context.mask, self.args.rollout_clip_ratio_c)
        return LossTerms(token_mask=None if factor is None else factor.detach(),
                         loss_mask=keep.detach() if rejecting and self.args.rollout_rs_normalizer == "excluded"
                         else None, loss_cap=cap, **fields)

    def _diagnostics(self, context: LossContext, train_logps: torch.Tensor, log_r: torch.Tensor,
                     weights: torch.Tensor | None, keep: torch.Tensor) -> dict[str, torch.Tensor]:
        """verl's ``rollout_corr/*`` metrics of ``train_logps`` against the rollout's (pi_old in decoupled mode,
        pi_theta in bypass mode, as verl's ``compute_policy_loss_bypass_mode`` passes ``old_log_prob=log_prob``)."""
        mask = context.mask
        sampling = filled_sampling_logps(train_logps, context.sampling_logps)  # as the weights read it
        metrics = {f"rollout_corr/{name}": value
                   for name, value in mismatch_diagnostics(train_logps.detach(), sampling, mask).items()
                   if name in DIAGNOSTICS}
        if weights is not None:
            level, threshold = self.args.rollout_is, self.args.rollout_is_threshold
            metrics["rollout_corr/is_mean"] = _masked_mean(weights, mask)
            metrics["rollout_corr/eff_sample_size"] = effective_sample_size(
                raw_importance_weights(log_r, mask, level), mask, threshold)
        token_fraction, sequence_fraction = rejected_fractions(keep, mask)
        metrics["rollout_corr/rejected_fraction"] = token_fraction
        metrics["rollout_corr/rejected_seq_fraction"] = sequence_fraction
        return metrics

    def _columns(self, context: LossContext, log_r: torch.Tensor, weights: torch.Tensor | None,
                 keep: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-token telemetry columns (``columns``): weight before rejection, rejected flag, K1 and K3."""
        mask = context.mask.to(log_r.dtype)
        k1, k3 = mismatch_per_token(log_r)
        return {"is_weight": mask if weights is None else weights, "rejected": mask * (1.0 - keep),
                "mismatch_k1": k1, "mismatch_k3": k3}

    def _inputs(self, context: LossContext, train_logps: torch.Tensor) -> torch.Tensor:
        if context.sampling_logps is None:
            raise ValueError(f"{self.registered_name()}: the batch carries no sampling log-probabilities (TRL's "
                             "sampling_per_token_logps); it needs vLLM generation.")
        return rollout_log_ratio(train_logps, context.sampling_logps, context.mask)


CORRECTION_PARAMS = ("rollout_rs", "rollout_rs_threshold", "rollout_rs_normalizer", "rollout_clip_ratio_c")


@register_strategy("rollout_correction")
class RolloutCorrection(_RolloutCorrection):
    """Decoupled rollout correction (verl's ``bypass_mode=False``, three policies): the PPO ratio stays
    ``pi_theta / pi_old``, each token's policy term is weighted by ``w(pi_old / pi_rollout)`` (``token_mask``) and
    the tokens the rejection bounds drop leave the loss and its normaliser (``loss_mask``, as verl's
    ``compute_rollout_correction_and_add_to_batch`` updates ``response_mask``). Composes with every weight, advantage
    and loss strategy."""

    params = ("rollout_is", "rollout_is_threshold", "rollout_is_handling", "rollout_is_batch_normalize",
              *CORRECTION_PARAMS)
    mode = "decoupled"
    sets = frozenset({"token_mask", "loss_mask", "loss_cap"})
    metrics = tuple(f"rollout_corr/{name}"
                    for name in (*DIAGNOSTICS, *REJECTION_METRICS, "is_mean", "eff_sample_size"))
    columns = {"is_weight": "the importance weight w(pi_old / pi_rollout) at rollout_is's level after truncation or "
               "masking (rollout_is_handling) and batch normalisation, before rejection (1 with rollout_is none)",
               **CORRECTION_COLUMNS}

    @property
    def removes_tokens_at_generation(self) -> bool:  # the rejection is of pi_old / pi_rollout, fixed per batch
        return rejection_setting(self.args) is not None and self.args.rollout_rs_normalizer == "excluded"

    def generation_loss_mask(self, old_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor
                             ) -> torch.Tensor:
        log_r = rollout_log_ratio(old_logps, sampling_logps, mask)
        return rejection_mask(log_r, mask, rejection_setting(self.args), self.args.rollout_rs_threshold)

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        log_r = self._inputs(context, context.old_logps)
        weights, keep = correction_factors(log_r, context.mask, self.args, self.mode)
        terms = self._terms(context, weights, keep, columns=self._columns(context, log_r, weights, keep))
        return terms, self._diagnostics(context, context.old_logps, log_r, weights, keep)


@register_strategy("rollout_correction_bypass")
class RolloutCorrectionBypass(_RolloutCorrection):
    """Bypass rollout correction (verl's ``bypass_mode=True`` with ``loss_type="ppo_clip"``, two policies): the PPO
    ratio becomes ``pi_theta / pi_rollout``, which is itself the importance weight (``rollout_is`` is not read), with
    rejection by ``rollout_rs`` on the statistic of ``pi_theta / pi_rollout`` at each pass (verl's
    ``compute_policy_loss_bypass_mode`` passes ``old_log_prob=log_prob``). With ``w = pi_old / pi_rollout``
    (detached), PPO's ``min(w r A, clip(w r, 1 - eps_low, 1 + eps_high) A)``
    ``= w min(r A, clip(r, (1 - eps_low) / w, (1 + eps_high) / w) A)``
    for ``r = pi_theta / pi_old``: the factor ``w`` (``token_mask``) and a per-token clip range; verl's dual clip on
    ``pi_theta / pi_rollout`` for A < 0 is the cap ``-A c`` (``loss_cap``)."""

    params = CORRECTION_PARAMS
    mode = "bypass"
    sets = frozenset({"token_mask", "loss_mask", "loss_cap", "clip_range"})
    metrics = tuple(f"rollout_corr/{name}" for name in (*DIAGNOSTICS, *REJECTION_METRICS, "bypass_ratio_mean"))
    columns = {"is_weight": "pi_old / pi_rollout, the factor bypass mode puts on the PPO ratio, before rejection",
               **CORRECTION_COLUMNS}
    loss_types = PPO_CLIP_LOSS_TYPES

    def loss_terms(self, context: LossContext) -> tuple[LossTerms, dict[str, torch.Tensor]]:
        theta_log_r = self._inputs(context, context.logps)  # the rejection's statistic: pi_theta / pi_rollout
        _, keep = correction_factors(theta_log_r, context.mask, self.args, self.mode)
        weights = torch.exp(self._inputs(context, context.old_logps).clamp(-SAFETY_BOUND, SAFETY_BOUND))
        terms = self._terms(context, weights, keep,
                            epsilon_low=1.0 - (1.0 - context.epsilon_low) / weights,
                            epsilon_high=(1.0 + context.epsilon_high) / weights - 1.0,
                            columns=self._columns(context, theta_log_r, weights, keep))
        metrics = self._diagnostics(context, context.logps, theta_log_r, None, keep)
        metrics["rollout_corr/bypass_ratio_mean"] = _masked_mean(weights, context.mask)
        return terms, metrics
