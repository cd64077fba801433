"""Token credit from a teacher: on-policy distillation (``opd``) and importance-weighted OPD (``iw_opd``) as
advantage strategies, and the self-distillation advantage of SDPO (docs/methods.md §16).

Every one adds to the advantage the teacher's per-token log-probability gap at the sampled token,

    d[i, t] = log pi_teacher(y[i, t] | x, y[i, <t]) - log pi_old(y[i, t] | x, y[i, <t])      (on the loss mask)

the negative of the single-sample reverse KL (the "k1" estimator) that the references turn into a reward:

* ``opd``: A' = A + coef * clip(d, -c, c). slime adds ``-opd_kl_coef * (student - teacher)`` to the advantage of any
  estimator (THUDM/slime@624b824 ``slime/backends/megatron_utils/loss.py`` ``apply_opd_kl_to_advantages`` L663-701,
  no clip); verl uses ``-k1`` as the advantage of a second PPO term, its k1 clamped to [-10, 10] (``loss_max_clamp``,
  verl-project/verl@1dda039 ``verl/trainer/distillation/losses.py`` L258-260 and L269-287) and weighted by
  ``distillation_loss_coef``. On-policy (ratio 1, PPO clip inactive) the sum of verl's two PPO terms with the same
  aggregation is the PPO term of the summed advantage, so both are this one advantage.
* ``iw_opd``: A' = (1 - lambda) A + lambda * w * d with the prefix-discrepancy weight
  w[i, t] = 1 + gamma (1 - sum_{s<t} |d[i, s]| / max(sum_s |d[i, s]|, eps)) (TRL 1.16
  ``trl/experimental/iw_opd/iw_opd_trainer.py`` ``_compute_iw_opd_loss`` L1212-1267). lambda = 1 is TRL's trainer.
* ``sdpo_advantages``: A' = (1 - lambda) A + lambda * s_i * d, with s_i = 1 for completions that have a self-teacher
  (a successful sibling, or feedback) and d from the policy itself conditioned on that demonstration (TRL 1.16
  ``trl/experimental/sdpo/sdpo_trainer.py`` ``compute_loss`` L1114-1143 with ``distillation_mode="sampled_token"``,
  ``loss_utils.compute_sampled_token_self_distillation_loss``; lasgroup/SDPO@0e6d510
  ``verl/trainer/ppo/core_algos.py`` ``compute_self_distillation_loss`` L1085-1183, non-full-logit branch). Their
  sampled-token loss (log p - log q).detach() * log p has the gradient of -d * log p: the policy gradient of advantage
  d, which is why it is an advantage here.

* ``rlsd`` (RLSD, arXiv 2604.03128; docs/methods.md §18.4): the teacher sets each token's magnitude, the reward its
  direction: A' = A ((1 - lambda) + lambda clip(exp(sign(A) d), 1 - eps, 1 + eps)) (iie-ycx/RLSD@93e46f7
  ``verl/workers/actor/dp_opsd_actor.py`` ``_build_stgca_advantages`` L209-239, called from
  ``update_policy_grpo_opsd`` L426-567 with lambda ``rlsd_lambda`` 0.5 and eps the clip range 0.2). The weight is
  detached and positive, so it never flips A's sign: an advantage, like the others here.

Pure tensor code; the teacher's log-probabilities come from the generation inputs ``teacher_logps`` and
``self_teacher_logps`` (``sharpgrpo.training.generation.teacher``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from sharpgrpo.strategies.base import AdvantageStrategy, GenerationBatch, StrategyPaper, masked_mean, register_strategy


def distillation_gap(teacher_logps: torch.Tensor, sampling_logps: torch.Tensor, mask: torch.Tensor,
                     clip: float | None = None) -> torch.Tensor:
    """d = log pi_teacher - log pi_old at the sampled tokens, clamped to [-clip, clip] (verl's ``loss_max_clamp``;
    None: no clamp, as slime), 0 off the mask. Shapes: (B, T) each -> (B, T)."""
    mask = mask.to(sampling_logps.dtype)
    gap = torch.where(mask.bool(), teacher_logps.to(sampling_logps.dtype) - sampling_logps, 0.0)
    if clip is not None:
        gap = gap.clamp(-clip, clip)
    return gap * mask


def opd_advantages(advantages: torch.Tensor, gap: torch.Tensor, coef: float) -> torch.Tensor:
    """A + coef * d (slime ``apply_opd_kl_to_advantages``: A - coef * (log pi_student - log pi_teacher)).
    (B, T) each -> (B, T)."""
    return advantages + coef * gap


def iw_opd_weights(gap: torch.Tensor, mask: torch.Tensor, gamma: float, epsilon: float = 1e-8) -> torch.Tensor:
    """IW-OPD's prefix-discrepancy weights w = 1 + gamma (1 - P_t / max(S, eps)), P_t = sum_{s<t} |d_s| (exclusive
    prefix), S = sum_s |d_s| over the completion (TRL ``_compute_iw_opd_loss`` L1239-1243). (B, T) -> (B, T)."""
    magnitude = (gap * mask.to(gap.dtype)).abs()
    prefix = magnitude.cumsum(dim=1) - magnitude
    total = magnitude.sum(dim=1, keepdim=True).clamp_min(epsilon)
    return 1.0 + gamma * (1.0 - prefix / total)


def iw_opd_advantages(advantages: torch.Tensor, gap: torch.Tensor, mask: torch.Tensor, gamma: float,
                      epsilon: float, weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """((1 - weight) A + weight * w * d, w) with w :func:`iw_opd_weights`. (B, T) each -> ((B, T), (B, T))."""
    w = iw_opd_weights(gap, mask, gamma, epsilon)
    return (1.0 - weight) * advantages + weight * w * gap, w


def sdpo_advantages(advantages: torch.Tensor, gap: torch.Tensor, teacher_rows: torch.Tensor,
                    weight: float) -> torch.Tensor:
    """(1 - weight) A + weight * s_i * d: SDPO's sampled-token self-distillation as an advantage, mixed with the
    incoming one as TRL's ``distillation_weight`` mixes the two losses. ``teacher_rows`` (B,) {0, 1}: the completions
    that have a self-teacher (TRL's ``self_distillation_mask``). (B, T), (B, T), (B,) -> (B, T)."""
    return (1.0 - weight) * advantages + weight * gap * teacher_rows.to(gap.dtype)[:, None]


def rlsd_advantages(advantages: torch.Tensor, teacher_logps: torch.Tensor, student_logps: torch.Tensor,
                    mask: torch.Tensor, lam: float, clip: float, negative_only: bool = False,
                    span: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RLSD's reweighted advantage (arXiv 2604.03128; iie-ycx/RLSD@93e46f7 ``dp_opsd_actor.py`` L219-239):
    w = exp(sign(A) (log pi_T - log pi_S)) on the mask, r = (1 - lam) + lam clip(w, 1 - clip, 1 + clip) on the mask
    (0 off it), A' = A r. The paper's A clip(w, 1 +- eps) is ``lam`` = 1. ``negative_only`` (L230-232): r = 1 on the
    mask in rows whose advantages sum to >= 0 over it; ``span`` (B, T) {0, 1} (``rlsd_thought_only``, L234-237): r = 1
    on the mask outside it. Returns (A', w, r); (B, T) each."""
    mask = mask.to(advantages.dtype)
    delta = (teacher_logps.to(advantages.dtype) - student_logps.to(advantages.dtype)) * mask
    weights = torch.exp(torch.sign(advantages) * delta) * mask
    reweight = ((1.0 - lam) + lam * weights.clamp(1.0 - clip, 1.0 + clip)) * mask
    if negative_only:
        reweight = torch.where((advantages * mask).sum(dim=1, keepdim=True) < 0, reweight, mask)
    if span is not None:
        reweight = torch.where(span.bool(), reweight, mask)
    return advantages * reweight, weights, reweight


def rlsd_lambda_at(step: int, lam: float, warmup_steps: int, decay_steps: int) -> float:
    """RLSD's lambda at optimizer step ``step`` (1-based) (iie-ycx/RLSD@93e46f7 ``verl/trainer/opsd_trainer.py``
    L1951-1961, ``global_step`` 1 at the first step): ``lam * step / warmup`` during the warm-up, then, with a decay,
    ``lam * max(1 - (step - warmup) / decay, 0)``, else ``lam``."""
    if warmup_steps > 0 and step < warmup_steps:
        return lam * step / warmup_steps
    if decay_steps > 0:
        return lam * max(1.0 - (step - warmup_steps) / decay_steps, 0.0)
    return lam


def tag_span_mask(completion_ids: torch.Tensor, mask: torch.Tensor, opening: list[int], closing: list[int]
                  ) -> torch.Tensor:
    """1 on the tokens strictly between an ``opening`` and the next ``closing`` token sequence (the tags themselves 0;
    an unclosed span runs to the end), times ``mask``: RLSD's thought-span mask (``opsd_trainer.py``
    ``_build_thought_span_mask`` L1879-1908, tags matched token for token). (B, T) long, (B, T) -> (B, T)."""
    span = torch.zeros(completion_ids.shape, dtype=mask.dtype)
    for row, ids in enumerate(completion_ids.tolist()):
        inside, t = False, 0
        while t < len(ids):
            tag = closing if inside else opening
            if tag and ids[t:t + len(tag)] == tag:
                inside, t = not inside, t + len(tag)
                continue
            span[row, t] = float(inside)
            t += 1
    return span.to(mask.device) * mask


def _teacher_gap(batch: GenerationBatch, name: str, clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher log-probabilities, d) of a generation batch, d clamped to [-clip, clip]."""
    teacher = batch.extras.get("teacher_logps")
    if teacher is None or batch.old_logps is None:
        raise ValueError(f"{name} needs GenerationBatch.extras['teacher_logps'] and old_logps (the trainer fills them "
                         "for needs_inputs / needs_old_logps).")
    mask = batch.completion_mask.float()
    return teacher.float(), distillation_gap(teacher.float(), batch.old_logps.float(), mask, clip)


class _TeacherStrategy(AdvantageStrategy):
    """What the teacher-gap strategies share: the generation input, the teacher check, the per-token scores."""

    needs_old_logps = True
    needs_inputs = ("teacher_logps",)

    @classmethod
    def check_config(cls, args: Any) -> None:
        from sharpgrpo.validation import ConfigError

        if not args.teacher_model:
            raise ConfigError(f"strategies: {cls.registered_name()} needs teacher_model (`ref`, `base` in a LoRA run, "
                              "`ema`, or the teacher's path or Hub name).")

    def __init__(self, args: Any):
        super().__init__(args)
        self._scores: torch.Tensor | None = None
        self._columns: dict[str, torch.Tensor] = {}
        self._teacher_state = None

    def uses_ema_teacher(self) -> bool:
        """The strategy's teacher is the EMA of the policy (``sharpgrpo.training.generation.teacher.EmaTeacher``)."""
        return False

    # With an EMA teacher the first strategy of the run that uses it carries its weights in its checkpoint state
    # (handed over by ``sharpgrpo.training.generation.teacher.ema_teacher``), so a resumed run continues with the
    # same teacher.
    def keep_teacher_state(self, teacher) -> None:
        """Carry ``teacher``'s ``state_dict()`` (tensors by name) in this strategy's checkpoint state."""
        self._teacher_state = teacher

    def state_dict(self) -> dict:
        return {} if self._teacher_state is None else self._teacher_state.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self._teacher_state is not None:
            self._teacher_state.load_state_dict(state)
        elif state:
            raise ValueError(f"The checkpoint holds an EMA teacher's weights for {self.registered_name()}, but this "
                             "run's teacher is not the EMA: resume with teacher_model: ema (opd, iw_opd) or "
                             "sdpo_teacher: ema (sdpo).")

    def token_scores(self) -> torch.Tensor | None:
        """The distillation term d of the last batch (B, T), for ``dump_token_scores``."""
        return self._scores

    def token_columns(self) -> dict[str, torch.Tensor]:
        """The last batch's teacher log-probabilities and distillation terms (``columns``; the telemetry's
        ``<strategy>/teacher_logp`` and ``<strategy>/term``)."""
        return self._columns

    def _teacher_metrics(self, prefix: str, teacher: torch.Tensor, gap: torch.Tensor, mask: torch.Tensor
                         ) -> dict[str, float]:
        return {f"{prefix}/teacher_logp_mean": float(masked_mean(teacher, mask)),
                f"{prefix}/gap_mean": float(masked_mean(gap, mask)),
                f"{prefix}/gap_abs_mean": float(masked_mean(gap.abs(), mask))}


class _NamedTeacherStrategy(_TeacherStrategy):
    """``opd``, ``iw_opd``: the teacher ``teacher_model`` names."""

    def uses_ema_teacher(self) -> bool:
        return self.args.teacher_model == "ema"


@register_strategy("opd")
class OnPolicyDistillationStrategy(_NamedTeacherStrategy):
    """``opd``: A' = A + ``opd_coef`` * clip(log pi_teacher - log pi_old, +-``opd_clip``) (module docstring)."""

    params = ("teacher_model", "teacher_ema_decay", "opd_coef", "opd_clip")
    metrics = ("opd/teacher_logp_mean", "opd/gap_mean", "opd/gap_abs_mean", "opd/frac_clipped")
    columns = {"teacher_logp": "the teacher's log-probability of the sampled token at the sampling temperature",
               "term": "what opd adds to the token's advantage: opd_coef * clip(teacher_logp - old_logp, +-opd_clip)"}
    paper = StrategyPaper(
        "On-Policy Distillation",
        "Lu and Thinking Machines Lab 2025, On-Policy Distillation (thinkingmachines.ai/blog/on-policy-distillation); "
        "Agarwal et al. 2024, On-Policy Distillation of Language Models (arXiv:2306.13649)",
        "2306.13649",
    )

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        clip = self.args.opd_clip
        teacher, gap = _teacher_gap(batch, "opd", clip)
        mask = batch.completion_mask.float()
        self._scores = gap
        metrics = self._teacher_metrics("opd", teacher, gap, mask)
        raw = (teacher - batch.old_logps.float()).abs()
        metrics["opd/frac_clipped"] = 0.0 if clip is None else float(masked_mean((raw > clip).float(), mask))
        self._columns = {"teacher_logp": teacher, "term": self.args.opd_coef * gap}
        return opd_advantages(batch.advantages, gap.to(batch.advantages.dtype), self.args.opd_coef), metrics


@register_strategy("iw_opd")
class ImportanceWeightedOPDStrategy(_NamedTeacherStrategy):
    """``iw_opd``: A' = (1 - ``iw_opd_weight``) A + ``iw_opd_weight`` * w * d, w the prefix-discrepancy weight
    (``iw_opd_gamma``, ``iw_opd_epsilon``; TRL 1.16 ``trl.experimental.iw_opd``)."""

    params = ("teacher_model", "teacher_ema_decay", "iw_opd_gamma", "iw_opd_epsilon", "iw_opd_weight")
    metrics = ("iw_opd/teacher_logp_mean", "iw_opd/gap_mean", "iw_opd/gap_abs_mean", "iw_opd/mean_weight",
               "iw_opd/min_weight", "iw_opd/max_weight", "iw_opd/mean_advantage")
    columns = {"teacher_logp": "the teacher's log-probability of the sampled token at the sampling temperature",
               "weight": "IW-OPD's prefix-discrepancy weight w of the token",
               "term": "the distillation part of the token's advantage: iw_opd_weight * w * (teacher_logp - "
               "old_logp)"}
    paper = StrategyPaper(
        "Importance-Weighted On-Policy Distillation",
        "TRL 1.16 trl.experimental.iw_opd (IWOPDTrainer, distillation_objective='iw_opd')",
    )

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        teacher, gap = _teacher_gap(batch, "iw_opd", None)
        mask = batch.completion_mask.float()
        advantages, w = iw_opd_advantages(batch.advantages.float(), gap, mask, self.args.iw_opd_gamma,
                                          self.args.iw_opd_epsilon, self.args.iw_opd_weight)
        self._scores = w * gap
        self._columns = {"teacher_logp": teacher, "weight": w, "term": self.args.iw_opd_weight * w * gap}
        valid = mask.bool()
        metrics = self._teacher_metrics("iw_opd", teacher, gap, mask)
        metrics.update({"iw_opd/mean_weight": float(w[valid].mean()) if valid.any() else 1.0,
                        "iw_opd/min_weight": float(w[valid].min()) if valid.any() else 1.0,
                        "iw_opd/max_weight": float(w[valid].max()) if valid.any() else 1.0,
                        "iw_opd/mean_advantage": float(masked_mean(w * gap, mask))})
        return advantages.to(batch.advantages.dtype), metrics


@register_strategy("sdpo")
class SelfDistillationStrategy(_TeacherStrategy):
    """``sdpo``: A' = (1 - ``sdpo_weight``) A + ``sdpo_weight`` * s_i * d, d the gap between the policy conditioned on
    a successful sibling's completion (and feedback) and the policy itself; s_i = 0 for completions with neither
    (TRL 1.16 ``trl.experimental.sdpo``, sampled-token mode; docs/methods.md §16.3)."""

    needs_inputs = ("self_teacher_logps",)
    params = ("sdpo_weight", "sdpo_teacher", "teacher_ema_decay", "sdpo_success_threshold", "sdpo_feedback",
              "sdpo_max_reprompt_length")
    metrics = ("sdpo/teacher_logp_mean", "sdpo/gap_mean", "sdpo/gap_abs_mean", "sdpo/reprompt_fraction")
    columns = {"teacher_logp": "the self-teacher's (the policy reprompted with a successful sibling or feedback) "
               "log-probability of the sampled token; NaN in completions without a self-teacher",
               "term": "the distillation part of the token's advantage: sdpo_weight * s_i * (teacher_logp - old_logp)"}
    paper = StrategyPaper(
        "Reinforcement Learning via Self-Distillation",
        "Hübotter et al. 2026, Reinforcement Learning via Self-Distillation (arXiv:2601.20802)",
        "2601.20802",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        """No external teacher: the policy (``sdpo_teacher: live``) or its EMA (``ema``) is its own teacher."""

    def __init__(self, args: Any):
        super().__init__(args)
        self._warned_no_teacher = False

    def uses_ema_teacher(self) -> bool:
        return self.args.sdpo_teacher == "ema"

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        teacher = batch.extras.get("self_teacher_logps")
        if teacher is None or batch.old_logps is None:
            raise ValueError("sdpo needs GenerationBatch.extras['self_teacher_logps'] and old_logps.")
        raw_teacher = teacher.float()
        rows = torch.isfinite(teacher).any(dim=1)
        mask = batch.completion_mask.float() * rows[:, None]
        teacher = torch.nan_to_num(teacher.float(), nan=0.0)
        gap = distillation_gap(teacher, batch.old_logps.float(), mask)
        self._scores = gap
        metrics = self._teacher_metrics("sdpo", teacher, gap, mask)
        metrics["sdpo/reprompt_fraction"] = float(rows.float().mean())
        if not rows.any() and not self._warned_no_teacher:
            self._warned_no_teacher = True
            weight = self.args.sdpo_weight
            consequence = ("its advantage is 0 everywhere (sdpo_weight=1): the batch teaches nothing" if weight == 1
                           else f"only (1 - sdpo_weight) A = {1 - weight:g} A trains")
            warnings.warn(
                f"sdpo: no completion of this batch has a successful sibling (reward >= sdpo_success_threshold="
                f"{self.args.sdpo_success_threshold:g}) or feedback, so none has a self-teacher and {consequence}. "
                "Set sdpo_success_threshold to a reward the task reaches, or sdpo_weight < 1 to keep GRPO's advantage "
                "(sdpo/reprompt_fraction logs the share with a self-teacher; warned once).",
                stacklevel=2,
            )
        advantages = sdpo_advantages(batch.advantages.float(), gap, rows, self.args.sdpo_weight)
        self._columns = {"teacher_logp": raw_teacher, "term": self.args.sdpo_weight * gap * rows[:, None].float()}
        return advantages.to(batch.advantages.dtype), metrics


RLSD_TEACHER_INPUTS = {"self": "self_teacher_logps", "teacher_model": "teacher_logps"}
RLSD_SPAN_INPUT = "rlsd_thought_span"  # ``rlsd_thought_only``'s (B, T) span mask (``training.generation.teacher``)


@register_strategy("rlsd")
class RLSDStrategy(_TeacherStrategy):
    """``rlsd``: A' = A ((1 - ``rlsd_lambda``) + ``rlsd_lambda`` clip(exp(sign(A) (log pi_T - log pi_old)), 1 +-
    ``rlsd_clip``)), the teacher ``rlsd_teacher``: SDPO's self-teacher (``self``: the policy reprompted with a
    successful sibling and, with ``sdpo_feedback``, the row's ``privileged_context``) or ``teacher_model``. Completions
    without a self-teacher keep A (weight 1). docs/methods.md §18.4."""

    params = ("rlsd_teacher", "rlsd_lambda", "rlsd_clip", "rlsd_lambda_warmup_steps", "rlsd_lambda_decay_steps",
              "rlsd_negative_only", "rlsd_thought_only", "rlsd_thought_tags", "teacher_model", "teacher_ema_decay",
              "sdpo_teacher", "sdpo_success_threshold", "sdpo_feedback", "sdpo_max_reprompt_length")
    # Every input is registered; an instance needs its teacher's and, with rlsd_thought_only, the span (``__init__``).
    needs_inputs = (*RLSD_TEACHER_INPUTS.values(), RLSD_SPAN_INPUT)
    metrics = ("rlsd/teacher_logp_mean", "rlsd/delta_mean", "rlsd/weight_mean", "rlsd/reweight_mean",
               "rlsd/clip_low_ratio", "rlsd/clip_high_ratio", "rlsd/teacher_fraction", "rlsd/lambda")
    columns = {"teacher_logp": "the teacher's log-probability of the sampled token (rlsd_teacher); NaN in completions "
               "without a self-teacher",
               "weight": "RLSD's factor on the token's advantage: (1 - rlsd_lambda) + rlsd_lambda * clip(exp(sign(A) "
               "(teacher_logp - old_logp)), 1 +- rlsd_clip)"}
    paper = StrategyPaper(
        "Self-Distilled RLVR",
        "Yang et al. 2026, Self-Distilled RLVR (arXiv:2604.03128)",
        "2604.03128",
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        if args.rlsd_teacher == "teacher_model":
            super().check_config(args)

    @classmethod
    def check_params(cls, args: Any) -> None:
        from sharpgrpo.validation import ConfigError

        if len(str(args.rlsd_thought_tags).split()) != 2:
            raise ConfigError(f"rlsd_thought_tags={args.rlsd_thought_tags!r}: give the opening and the closing tag "
                              "separated by a space, e.g. '<thought> </thought>'.")

    def __init__(self, args: Any):
        super().__init__(args)
        self.needs_inputs = (RLSD_TEACHER_INPUTS[args.rlsd_teacher],) + ((RLSD_SPAN_INPUT,) if args.rlsd_thought_only
                                                                         else ())
        self._said_decayed = False

    def uses_ema_teacher(self) -> bool:
        if self.args.rlsd_teacher == "self":
            return self.args.sdpo_teacher == "ema"
        return self.args.teacher_model == "ema"

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        name = self.needs_inputs[0]
        teacher = batch.extras.get(name)
        if teacher is None or batch.old_logps is None:
            raise ValueError(f"rlsd needs GenerationBatch.extras[{name!r}] and old_logps.")
        rows = torch.isfinite(teacher).any(dim=1)  # the self-teacher is NaN on completions that have none
        mask = batch.completion_mask.double() * rows[:, None]
        teacher64 = torch.nan_to_num(teacher.double(), nan=0.0)
        a = self.args
        lam = rlsd_lambda_at(batch.step + 1, a.rlsd_lambda, a.rlsd_lambda_warmup_steps, a.rlsd_lambda_decay_steps)
        span = batch.extras[RLSD_SPAN_INPUT].double() if a.rlsd_thought_only else None
        if lam == 0 and a.rlsd_lambda > 0 and not self._said_decayed:
            self._said_decayed = True
            warnings.warn(f"rlsd: lambda has decayed to 0 at step {batch.step + 1} (rlsd_lambda_decay_steps="
                          f"{a.rlsd_lambda_decay_steps}): from here on every token keeps its advantage, plain GRPO, as "
                          "the released schedule trains (said once).", UserWarning, stacklevel=2)
        advantages, weights, reweight = rlsd_advantages(batch.advantages.double(), teacher64,
                                                        batch.old_logps.double(), mask, lam, a.rlsd_clip,
                                                        a.rlsd_negative_only, span)
        advantages = torch.where(rows[:, None], advantages, batch.advantages.double())
        reweight = torch.where(rows[:, None], reweight, 1.0)
        self._scores = reweight.float()
        self._columns = {"teacher_logp": teacher.float(), "weight": reweight.float()}
        clip = self.args.rlsd_clip
        metrics = {"rlsd/teacher_logp_mean": float(masked_mean(teacher64, mask)),
                   "rlsd/delta_mean": float(masked_mean((teacher64 - batch.old_logps.double()) * mask, mask)),
                   "rlsd/weight_mean": float(masked_mean(weights, mask)),
                   "rlsd/reweight_mean": float(masked_mean(reweight, batch.completion_mask.double())),
                   "rlsd/clip_low_ratio": float(masked_mean((weights < 1 - clip).double(), mask)),
                   "rlsd/clip_high_ratio": float(masked_mean((weights > 1 + clip).double(), mask)),
                   "rlsd/teacher_fraction": float(rows.double().mean()), "rlsd/lambda": lam}
        return advantages.to(batch.advantages.dtype), metrics
