"""CW-GRPO: covariance Gaussian-kernel advantage weights (docs/methods.md §2).

Wang, Liu, Zhou and Chen, "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage
Reweighting" (ACL 2026 short, arXiv:2605.11538), §2.3. The paper's displays carry no equation numbers, so they
are cited by the symbol they define:

* §2.3 ``c_{i,t}``:  c[i,t] = (logp[i,t] - mean(logp)) * (A[i] - mean(A))   (token covariance)
* §2.3 ``w_{i,t}``:  w[i,t] = exp(-c[i,t]^2 / (2 sigma^2)), sigma = std of {c[i,t]}   (Gaussian kernel)
* §2.3 ``w~_{i,t}``: w~[i,t] = w[i,t] * N / sum_{j,k} w[j,k], N = sum_j |o_j|   (renormalisation)
* §2.3 ``l~_{i,t}``: l~[i,t] = r[i,t] * (w~[i,t] * A[i]) - beta * KL[i,t]   (the loss is otherwise GRPO's)

Decisions (docs/methods.md §2, where the paper is silent or loose):

* The statistics are taken over a *scope*: the group (default, the paper's sums run over the G responses of one
  prompt) or the whole generation batch. The caller passes whole scopes; under multi-process training it must
  gather the groups first so that a 2-process run gives the weights of a 1-process run.
* ``mean(logp)`` is the masked **token** mean over the scope and ``sigma`` the population standard deviation
  (divide by N) of ``c`` over the scope's valid tokens. ``mean(A)`` (docs/methods.md §2; the paper: "computed over
  responses") counts each response once by default (``advantage_mean="response"``: the mean over the scope's
  responses with a valid token of each response's advantage, its masked token mean; 0 for group-normalised A), so
  a group's weights do not depend on how long its wrong answers are. ``advantage_mean="token"`` (the earlier
  default) takes the masked token mean, the completion-length-weighted ``sum_i |o_i| A[i] / sum_i |o_i|``; it
  moves the centre towards the longer completions' advantage (a group whose wrong answers were 6x longer gave its
  correct-answer tokens mean weight 0.60 instead of 1.07).
* ``logp`` is the detached log-probability of the policy that sampled the tokens (equal to the current policy
  on-policy; the paper writes log pi_theta). Weights are computed once per generation batch, without gradient.
* If ``sigma < sigma_eps`` (default 1e-8; e.g. a group whose rewards are all equal, so A = 0 and c = 0) the
  scope's weights are 1, where the paper's formula would divide 0 by 0.

The authors' released code (github WangCheng0116/CW-GRPO, ``compute_loss`` with ``use_ours``), which their
reported runs used, computes the weights differently: inside the loss of every micro-batch, from the current
policy's log-probabilities with gradient, centring logp per response and A over the micro-batch, and renormalising
by B x T including padding. ``cw_variant: released`` selects it (``released_covariance_weights``,
``ReleasedCovarianceWeights``, a token-weight strategy); ``paper`` (default) is the reading above.

Numerics: reductions are done in float64. Because w~ is invariant to multiplying a scope's ``w`` by a constant,
the kernel is evaluated as ``exp(log w - max_scope log w)``: mathematically identical to §2.3, but the sum in the
denominator is always >= 1, so w~ is finite even where every ``w`` of a scope would underflow to 0 (e.g. all
``c`` nearly equal and far from 0). Masked positions get weight 1 (the token advantage there stays the input
advantage, which the loss masks out anyway); they never enter any statistic.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sharpgrpo.strategies.base import (
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    TokenWeightStrategy,
    register_strategy,
)
from sharpgrpo.strategy_params import CW_ADVANTAGE_MEANS, DEFAULT_SIGMA_EPS
from sharpgrpo.validation import ConfigError


def _scope_sum(values: torch.Tensor, inverse: torch.Tensor, num_scopes: int) -> torch.Tensor:
    """Sum (B, T) masked values (zeros on masked positions) per scope: -> (S,)."""
    out = torch.zeros(num_scopes, dtype=values.dtype, device=values.device)
    return out.index_add_(0, inverse, values.sum(dim=1))


def covariance_gaussian_weights(
    logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    scope_ids: torch.Tensor,
    sigma_eps: float = DEFAULT_SIGMA_EPS,
    advantage_mean: str = "response",
) -> tuple[torch.Tensor, dict[str, float]]:
    """CW-GRPO §2.3 (c_{i,t}, w_{i,t}, w~_{i,t}); docs/methods.md §2. Token weights w~ that multiply the advantages.

    For every scope (the rows sharing a ``scope_ids`` value), over its valid tokens (``mask`` = 1), N of them:

        c[i,t]  = (logp[i,t] - mean(logp)) * (A[i,t] - mean(A))     mean(logp): masked token mean over the scope;
                                                                     mean(A): see ``advantage_mean``
        sigma   = sqrt(mean((c - mean(c))^2))                        population std over the scope
        w[i,t]  = exp(-c[i,t]^2 / (2 sigma^2))                       w = 1 where sigma < sigma_eps
        w~[i,t] = w[i,t] * N / sum(w)

    Shapes: logps (B, T) float; advantages (B, T) float token advantages (a (B,) per-completion advantage is
    broadcast over T); mask (B, T) {0, 1} or bool; scope_ids (B,) integer, any values (rows of a scope need not
    be consecutive) -> w_tilde (B, T) in the result dtype of ``logps`` and ``advantages``, 1 on masked positions.

    ``advantage_mean``: ``"response"`` (default) averages the responses' advantages (each row's masked token mean,
    i.e. A[i] for TRL's broadcast advantages) over the scope's rows that have a valid token, each counted once;
    ``"token"`` takes the masked token mean (length-weighted; see the module docstring). Values on masked positions are ignored (they may be anything, even non-finite).
    No gradient flows: the result never requires grad.

    Returns ``(w_tilde, stats)``, ``stats`` plain floats over the whole batch passed in (call it on the gathered
    batch; nothing needs averaging across processes afterwards):

    * ``cw/weight_mean``: mean of w~ over valid tokens (1 by construction, up to rounding: a check);
    * ``cw/weight_min``: minimum of w~ over valid tokens;
    * ``cw/frac_below_0.5``: fraction of valid tokens with w~ < 0.5;
    * ``cw/sigma``: mean of sigma over the scopes that have valid tokens;
    * ``cw/kernel_mean``: mean of the unnormalised kernel w over valid tokens (how much mass is suppressed);
    * ``cw/frac_scopes_degenerate``: fraction of scopes with valid tokens whose sigma < sigma_eps (w = 1).

    A batch without valid tokens gives weight_mean = weight_min = kernel_mean = 1 and the other stats 0.
    """
    if logps.dim() != 2:
        raise ValueError(f"logps must be (B, T); got shape {tuple(logps.shape)}.")
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logps)
    if advantages.shape != logps.shape or mask.shape != logps.shape:
        raise ValueError(
            f"logps, advantages and mask must all be (B, T); got {tuple(logps.shape)}, "
            f"{tuple(advantages.shape)}, {tuple(mask.shape)}."
        )
    if scope_ids.shape != logps.shape[:1]:
        raise ValueError(f"scope_ids must be (B,) = ({logps.shape[0]},); got {tuple(scope_ids.shape)}.")
    if sigma_eps < 0:
        raise ValueError(f"sigma_eps must be >= 0; got {sigma_eps}.")
    if advantage_mean not in CW_ADVANTAGE_MEANS:
        raise ValueError(f"advantage_mean must be one of {CW_ADVANTAGE_MEANS}; got {advantage_mean!r}.")

    out_dtype = torch.result_type(logps, advantages)
    if not out_dtype.is_floating_point:
        out_dtype = torch.get_default_dtype()
    f64 = torch.float64

    with torch.no_grad():
        valid = mask.detach().bool()
        validf = valid.to(f64)
        # torch.where, not multiplication, so that garbage (inf/nan) on padded positions cannot leak in.
        logp = torch.where(valid, logps.detach().to(f64), 0.0)
        adv = torch.where(valid, advantages.detach().to(f64), 0.0)

        _, inverse = torch.unique(scope_ids.detach(), return_inverse=True)
        inverse = inverse.to(logps.device)
        num_scopes = int(inverse.max().item()) + 1 if inverse.numel() else 0

        count = _scope_sum(validf, inverse, num_scopes)  # (S,) valid tokens N per scope
        safe_count = count.clamp(min=1.0)
        mean_logp = _scope_sum(logp, inverse, num_scopes) / safe_count  # (S,)
        if advantage_mean == "token":
            mean_adv = _scope_sum(adv, inverse, num_scopes) / safe_count  # (S,)
        else:  # each response once: the mean over rows with a valid token of the row's masked mean advantage
            row_count = validf.sum(dim=1)
            has_tokens = (row_count > 0).to(f64)
            row_adv = adv.sum(dim=1) / row_count.clamp(min=1.0)
            zeros = torch.zeros(num_scopes, dtype=f64, device=logps.device)
            rows_per_scope = zeros.clone().index_add_(0, inverse, has_tokens)
            adv_sum = zeros.clone().index_add_(0, inverse, row_adv * has_tokens)
            mean_adv = adv_sum / rows_per_scope.clamp(min=1.0)  # (S,)

        cov = (logp - mean_logp[inverse, None]) * (adv - mean_adv[inverse, None])  # (B, T) c[i,t]
        cov = torch.where(valid, cov, 0.0)
        mean_cov = _scope_sum(cov, inverse, num_scopes) / safe_count
        centred = torch.where(valid, cov - mean_cov[inverse, None], 0.0)
        sigma = (_scope_sum(centred * centred, inverse, num_scopes) / safe_count).sqrt()  # (S,)

        degenerate = sigma < sigma_eps  # includes scopes without valid tokens (sigma = 0)
        safe_sigma = torch.where(degenerate, 1.0, sigma)
        log_kernel = -(cov * cov) / (2.0 * safe_sigma[inverse, None] ** 2)  # (B, T) log w[i,t]
        log_kernel = torch.where(degenerate[inverse, None], 0.0, log_kernel)

        # Per-scope max of log w over valid tokens; subtracting it leaves w~ unchanged and keeps sum(w) >= 1.
        masked_log_kernel = torch.where(valid, log_kernel, -torch.inf)
        if masked_log_kernel.shape[1] > 0:
            row_max = masked_log_kernel.amax(dim=1)  # (B,), -inf for rows without valid tokens
        else:
            row_max = torch.full(masked_log_kernel.shape[:1], -torch.inf, dtype=f64, device=logps.device)
        scope_max = torch.full((num_scopes,), -torch.inf, dtype=f64, device=logps.device)
        scope_max = scope_max.scatter_reduce(0, inverse, row_max, reduce="amax", include_self=True)
        scope_max = torch.where(count > 0, scope_max, 0.0)
        shifted = torch.where(valid, torch.exp(log_kernel - scope_max[inverse, None]), 0.0)
        shifted_sum = _scope_sum(shifted, inverse, num_scopes)  # (S,) >= 1 where count > 0
        scale = torch.where(count > 0, count / shifted_sum.clamp(min=1.0), 1.0)
        w_tilde = torch.where(valid, shifted * scale[inverse, None], 1.0)

        stats = _weight_stats(w_tilde, torch.exp(log_kernel), valid, sigma, count, degenerate)
    return w_tilde.to(out_dtype), stats


def _weight_stats(
    w_tilde: torch.Tensor,
    kernel: torch.Tensor,
    valid: torch.Tensor,
    sigma: torch.Tensor,
    count: torch.Tensor,
    degenerate: torch.Tensor,
) -> dict[str, float]:
    """Batch metrics of ``covariance_gaussian_weights`` (see its docstring); (B, T) and (S,) float64 inputs."""
    num_valid = int(valid.sum().item())
    if num_valid == 0:
        return {
            "cw/weight_mean": 1.0,
            "cw/weight_min": 1.0,
            "cw/frac_below_0.5": 0.0,
            "cw/sigma": 0.0,
            "cw/kernel_mean": 1.0,
            "cw/frac_scopes_degenerate": 0.0,
        }
    valid_weights = w_tilde[valid]
    nonempty = count > 0
    return {
        "cw/weight_mean": valid_weights.mean().item(),
        "cw/weight_min": valid_weights.min().item(),
        "cw/frac_below_0.5": (valid_weights < 0.5).to(torch.float64).mean().item(),
        "cw/sigma": sigma[nonempty].mean().item(),
        "cw/kernel_mean": kernel[valid].mean().item(),
        "cw/frac_scopes_degenerate": degenerate[nonempty].to(torch.float64).mean().item(),
    }


@register_strategy("cw_grpo")
class CovarianceWeighting(AdvantageStrategy):
    """CW-GRPO advantage strategy (docs/methods.md §2): token advantages ``A[i,t] = w~[i,t] * A[i,t]``.

    Config attributes read from ``args`` (declared, with their defaults, in ``sharpgrpo.strategy_params``):

    * ``cw_scope``: ``"group"`` (statistics per prompt group, as the paper's sums over G responses) or ``"batch"``
      (one scope: every completion of the generation batch handed to the strategy, which the trainer gathers from
      all processes);
    * ``cw_sigma_eps``: below this std of c a scope's weights are 1 (docs/methods.md §2);
    * ``cw_advantage_mean``: ``"response"`` or ``"token"``, how mean(A) is taken (docs/methods.md §2);
    * ``cw_variant``: ``"paper"`` (this class) or ``"released"``: constructing the class then returns a
      :class:`ReleasedCovarianceWeights`, the authors' released loss (a token-weight strategy, see there).

    ``logp`` is ``batch.old_logps``: the detached log-probabilities of the sampling policy (docs/methods.md §2), so the
    weights are computed once per generation batch and reused by every optimisation step on it.
    """

    metrics = (
        "cw/weight_mean", "cw/weight_min", "cw/frac_below_0.5", "cw/sigma", "cw/kernel_mean",
        "cw/frac_scopes_degenerate",
    )
    params = ("cw_variant", "cw_weight_gradient", "cw_scope", "cw_advantage_mean", "cw_sigma_eps")
    paper = StrategyPaper(
        "Taming Extreme Tokens: Covariance-Aware GRPO with Gaussian-Kernel Advantage Reweighting",
        "Cheng Wang, Qin Liu, Wenxuan Zhou, Muhao Chen. Taming Extreme Tokens: Covariance-Aware GRPO with "
        "Gaussian-Kernel Advantage Reweighting. arXiv:2605.11538.",
        "2605.11538",
    )

    @classmethod
    def check_params(cls, args: Any) -> None:
        """`cw_weight_gradient: true` only with `cw_variant: released`."""
        if args.cw_variant != "released" and args.cw_weight_gradient:
            raise ConfigError(
                "cw_weight_gradient=True: needs cw_variant: released (the paper variant's weights come from the "
                "sampling policy at generation, without gradient)."
            )

    @classmethod
    def check_config(cls, args: Any) -> None:
        """`cw_variant: released` only where the configuration computes the released loss (one line naming the
        setting that does)."""
        if args.cw_variant == "released":
            conflict = released_variant_conflict(args)
            if conflict:
                raise ConfigError(conflict)

    def __new__(cls, args: Any):
        # `cw_variant: released` computes its weights in the loss instead (a token-weight strategy).
        if args.cw_variant == "released":
            return ReleasedCovarianceWeights(args)
        return super().__new__(cls)

    def __init__(self, args: Any):
        super().__init__(args)
        self.scope = args.cw_scope
        self.sigma_eps = float(args.cw_sigma_eps)
        self.advantage_mean = args.cw_advantage_mean

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Whole groups -> ((B, T) token advantages w~ * batch.advantages, ``cw/*`` metrics of the batch)."""
        if self.scope == "group":
            scope_ids = batch.group_ids
        else:
            scope_ids = torch.zeros(batch.advantages.shape[0], dtype=torch.long, device=batch.advantages.device)
        w_tilde, metrics = covariance_gaussian_weights(
            batch.old_logps, batch.advantages, batch.completion_mask, scope_ids, sigma_eps=self.sigma_eps,
            advantage_mean=self.advantage_mean,
        )
        return w_tilde.to(batch.advantages.dtype) * batch.advantages.detach(), metrics


# ----------------------------------------------------------------------------------------------------------------
# The authors' released variant (`cw_variant: released`)
# ----------------------------------------------------------------------------------------------------------------
RELEASED_EPS = 1e-8  # the released code's constant: added to each response's token count and to sigma


def released_covariance_weights(logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """CW-GRPO weights as the authors' released code computes them inside the loss (github WangCheng0116/CW-GRPO,
    ``src/open_r1/trl/trainer/grpo_trainer.py``, ``compute_loss`` with ``use_ours``), over one micro-batch:

        dlogp[i,t] = logp[i,t] - sum_t m[i,t] logp[i,t] / (|o_i| + 1e-8)      each response's own token mean
        dA[i]      = A[i] - mean_i A[i]                                          over the micro-batch's rows
        c[i,t]     = m[i,t] dlogp[i,t] dA[i]
        sigma      = sqrt(mean over valid tokens of (c - mean c)^2) + 1e-8       population std, one for the batch
        w[i,t]     = m[i,t] exp(-c[i,t]^2 / (2 sigma^2))
        w~[i,t]    = w[i,t] B T / sum w          (if sum w > 0)                  B x T counts padded positions too

    so the mean of w~ over valid tokens is B T / sum_i |o_i| >= 1 (above 1 whenever a completion is padded).
    Differs from §2.3 as read by ``covariance_gaussian_weights`` in the centring of logp (per response, not the
    group's), of A (the micro-batch, not the group), sigma (+1e-8, no degenerate case: equal advantages give w = 1
    before renormalisation) and the renormalisation (B T, not the valid tokens).

    Shapes: logps (B, T) float, the current policy's log-probabilities; gradient flows through every step above
    when ``logps`` requires grad (detach it for weights without gradient); advantages (B,) or (B, 1), one per
    completion; mask (B, T) {0, 1} or bool -> w~ (B, T) float, 0 on masked positions, in ``logps``' dtype
    (computed in float64). No host synchronisation: the trainer's ``token_weight/*`` metrics describe w~.
    """
    if logps.dim() != 2 or mask.shape != logps.shape:
        raise ValueError(f"logps and mask must both be (B, T); got {tuple(logps.shape)} and {tuple(mask.shape)}.")
    if advantages.dim() == 2 and advantages.shape[1] == 1:
        advantages = advantages[:, 0]
    if advantages.shape != logps.shape[:1]:
        raise ValueError(
            f"advantages must be one per completion, (B,) or (B, 1) with B = {logps.shape[0]}; got "
            f"{tuple(advantages.shape)} (the released variant centres sequence advantages)."
        )
    f64 = torch.float64
    valid = mask.bool()
    validf = valid.to(f64)
    logp = torch.where(valid, logps.to(f64), 0.0)
    lengths = validf.sum(dim=1, keepdim=True)
    centred_logp = (logp - logp.sum(dim=1, keepdim=True) / (lengths + RELEASED_EPS)) * validf
    adv = advantages.to(f64)
    centred_adv = adv - adv.mean() if adv.numel() else adv
    cov = centred_logp * centred_adv[:, None]  # 0 on masked positions
    num_valid = validf.sum()
    mean_cov = cov.sum() / num_valid.clamp(min=1.0)
    variance = (torch.where(valid, cov - mean_cov, 0.0) ** 2).sum() / num_valid.clamp(min=1.0)
    # sqrt has an infinite derivative at 0 (every c equal, e.g. equal advantages): keep the gradient finite there.
    positive = variance > 0
    sigma = torch.where(positive, torch.where(positive, variance, 1.0).sqrt(), 0.0) + RELEASED_EPS
    kernel = torch.exp(-(cov * cov) / (2.0 * sigma * sigma)) * validf
    total = kernel.sum()
    scale = torch.where(total > 0, kernel.numel() / torch.where(total > 0, total, 1.0), 1.0)
    return (kernel * scale).to(logps.dtype)


def released_variant_conflict(args: Any) -> str | None:
    """One line naming the first setting under which ``cw_variant='released'`` would not compute the released loss,
    and the value that does; None when the configuration expresses it. The released loss is on-policy GRPO with
    w~ on the policy term only: -(w~ r A) + beta k3 per token (r = 1 in value), averaged over each completion's
    tokens, then over the completions. ``args`` is a ``SharpGRPOConfig``: TRL's fields are read too."""
    strategies = list(args.strategies)
    if strategies != ["cw_grpo"]:
        return f"strategies={strategies}: cw_variant=released is the authors' loss alone; set strategies: cw_grpo."
    required = (
        ("loss_type", "grpo", "each completion's tokens averaged, then the completions"),
        ("num_iterations", 1, "one optimisation step per generation: the ratio is 1 and no clip acts"),
        ("steps_per_generation", 1, ("each micro-batch generated on its own, as in the released trainer; with more, "
                                     "TRL shuffles the rows of several micro-batches together and the centring of A "
                                     "would mix their groups")),
        ("weight_placement", "loss", "w~ multiplies the policy term"),
        ("importance_sampling_level", "token", "a per-token ratio, whose gradient is each token's own"),
        ("top_entropy_quantile", 1.0, "every token enters the loss"),
        ("off_policy_mask_threshold", None, "every completion enters the loss"),
        ("entropy_coef", 0.0, "no entropy bonus"),
        ("use_adaptive_entropy", False, "no entropy bonus"),
    )
    if args.beta:
        required += (("kl_weighting", "none", "the KL term is not weighted by w~"),
                     ("use_bias_correction_kl", False, "the plain k3 KL"))
    if args.use_vllm:
        required += (("vllm_importance_sampling_correction", False, "no importance-sampling factor on the loss"),)
    if released_weight_gradient(args):
        required += (("sharpness_probe_steps", 0, "the probe reuses detached weights; gradient flows through w~"),)
    for name, value, why in required:
        if getattr(args, name) != value:
            return (f"{name}={getattr(args, name)!r}: cw_variant=released needs {name}: {value} ({why}); it also "
                    "needs loss_type grpo, num_iterations 1, steps_per_generation 1, weight_placement loss and, with "
                    "beta > 0, kl_weighting none.")
    return None


def released_weight_gradient(args: Any) -> bool:
    """``cw_weight_gradient``, with None meaning the variant's own: True for ``released`` (the released code does not
    detach w~), False for ``paper``."""
    value = args.cw_weight_gradient
    return (args.cw_variant == "released") if value is None else bool(value)


class ReleasedCovarianceWeights(TokenWeightStrategy):
    """``cw_grpo`` with ``cw_variant: released``: a token-weight strategy computed in the loss of every micro-batch
    from the current policy's log-probabilities and the micro-batch's advantages (``released_covariance_weights``),
    with gradient through w~ unless ``cw_weight_gradient`` is false. Under several processes each process's
    micro-batch is centred and normalised on its own rows, as in the released trainer (nothing is gathered)."""

    # exp(-z^2 / 2) underflows to exactly 0 in float32 for |z| > about 14: on SmolLM2-135M the smallest weight of a
    # micro-batch was 1e-43 to 1e-9 on most steps, and exactly 0 on 2 of 3 seeds within 12 steps (docs/methods.md
    # §2.3). The released code trains on with such a weight (the token gets no gradient), and so does this one.
    zero_weights = True
    # The released trainer (a TRL before temperature scaling reached the loss) computes every log-probability of its
    # loss, and the reference's, from logits not divided by the sampling temperature (docs/methods.md §2.3).
    loss_logps_temperature = 1.0

    def __init__(self, args: Any):
        super().__init__(args)
        self.gradient = released_weight_gradient(args)

    def weights(self, logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise ValueError("cw_variant=released weights need the micro-batch's advantages; the trainer calls "
                         "`loss_weights`.")

    def loss_weights(self, logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, *,
                     entropies: torch.Tensor | None = None) -> torch.Tensor:
        return released_covariance_weights(logps if self.gradient else logps.detach(), advantages.detach(), mask)

    def bounds(self) -> tuple[float, float]:
        return 0.0, math.inf
