"""``StrategyParams``: the one home of every strategy parameter (its default, help and accepted values), and the
``param`` declaration that ``SharpGRPOConfig`` uses for its other fields too.

``SharpGRPOConfig`` inherits these fields and validates them (``FIELD_RULES``); a strategy reads them from its
``args`` without restating a default, and the values a field accepts (``VOCAB_MODES``, ``CW_VARIANTS``, ...) are
declared here for the strategy's own checks. This module imports nothing of sharpgrpo but ``sharpgrpo.validation``,
so both the config and the strategies import it. The decisions behind the defaults: docs/methods.md §9.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass, field

from sharpgrpo.validation import (
    between,
    in_tensor_range,
    integer,
    name,
    non_negative,
    number,
    one_of,
    positive,
    validate_fields,
)

CW_SCOPES = ("group", "batch")
CW_ADVANTAGE_MEANS = ("response", "token")
CW_VARIANTS = ("paper", "released")
DEFAULT_SIGMA_EPS = 1e-8  # docs/methods.md §2.2: below it a scope's weights are 1
VOCAB_MODES = ("full", "sampled")
ARCHER_KL_MEANS = ("split", "token")
GTPO_LEVELS = ("token", "sequence")
GTPO_NORMALIZATIONS = ("group", "separate")
ROLLOUT_IS_LEVELS = ("token", "sequence", "geometric", "none")
ROLLOUT_IS_HANDLING = ("truncate", "mask")


class _RuledField(dataclasses.Field):
    """A dataclass field that also carries the rule of the values it accepts (``FIELD_RULES`` collects them). Kept
    out of ``metadata``, which transformers' argument parser hands to argparse as keyword arguments."""

    __slots__ = ("rule", "acts_when")


@dataclasses.dataclass(frozen=True)
class ActsWhen:
    """The feature a field belongs to, declared with the field (``param(..., acts_when=ActsWhen(...))``): ``feature``
    says in words when the field acts (``"beta > 0 (the KL term)"``) and ``test(args)`` whether it does, or
    ``reward`` the reward function it belongs to. A field set away from its default while its feature is off is said
    once (``strategy_set.warn_fields_that_do_nothing``, with the reward functions when the trainer has them)."""

    feature: str
    test: Callable[[Any], bool] | None = None
    reward: str | None = None  # the field acts only with this reward function among reward_funcs (known at training)


def param(default, help: str, rule, acts_when: ActsWhen | None = None):
    """A field of ours: its default, what it does (``help``: a line or two, details in docs/methods.md) and the
    values it accepts (``rule``, sharpgrpo.validation), declared together. Every number is also held to the range
    of the tensors it meets (``validation.in_tensor_range``: |x| <= 1e30 for a real, int64 for an integer), so a
    value that passes the checks (a clip range of 1e300) cannot overflow later."""
    plain = field(default=default, metadata={"help": help})
    ruled = _RuledField.__new__(_RuledField)
    for slot in dataclasses.Field.__slots__:
        setattr(ruled, slot, getattr(plain, slot))
    ruled.rule = in_tensor_range(rule)
    ruled.acts_when = acts_when
    return ruled


@dataclass
class StrategyParams:
    """The parameters the registered strategies read, each declared once. A strategy lists the ones it reads in its
    ``params`` (the model card's list). ``SharpGRPOConfig`` is the validated whole; a strategy that reads only its
    own parameters can also be built from ``StrategyParams(...)`` directly. Either way each value is checked here,
    once, by its field's rule (``PARAM_RULES``); the relations among a strategy's parameters are its ``check_params``.
    The strategies' constructors check nothing again."""

    # GRPO-SG / TR-GRPO probability shaping (docs/methods.md §1).
    sg_alpha: float = param(2.0, "alpha of GRPO-SG Eq. 19: scale of the sigmoid shaping.", positive())
    sg_mu: float = param(0.25, "mu of GRPO-SG Eq. 19: offset subtracted from the sigmoid.", number())
    sg_tau: float = param(
        1 / 9,
        "tau of GRPO-SG Eq. 19, w = clip(alpha (sigmoid(p/tau) - mu), L, U). 1/9, not the printed 9, which makes "
        "every w = 1 (docs/methods.md §1); a tau with constant weights warns.",
        positive(),
    )
    sg_lower: float = param(1.0, "L of GRPO-SG Eq. 19: lower clip of the weight.",
                            positive(note="weights scale ratios"))
    sg_upper: float = param(1.4, "U of GRPO-SG Eq. 19: upper clip of the weight.", positive())
    random_weight_low: float = param(0.5, "`random`: lower end of w ~ Uniform[low, high] (TR-GRPO Table 4).",
                                     positive())
    random_weight_high: float = param(1.5, "`random`: upper end of w ~ Uniform[low, high] (TR-GRPO Table 4).",
                                      positive())
    random_weight_seed: int | None = param(
        None, "`random`: generator seed (plus the process index); None uses `seed`.", integer(0, allow_none=True)
    )
    ar_alpha: float = param(0.3, "`ar` (AR-Lopti): A[i,t] = (alpha sg[p_old] + 1 - alpha) A[i].", between(0, 1))
    # CW-GRPO (docs/methods.md §2).
    cw_scope: str = param(
        "group", "`cw_grpo`: statistics over each prompt's `group` or the whole generation `batch`.",
        one_of(*CW_SCOPES),
    )
    cw_advantage_mean: str = param(
        "response",
        "`cw_grpo`: mean(A) in c = (logp - mean logp)(A - mean A) over `response`s (each once) or `token`s "
        "(length-weighted). docs/methods.md §2.",
        one_of(*CW_ADVANTAGE_MEANS),
    )
    cw_sigma_eps: float = param(DEFAULT_SIGMA_EPS, "`cw_grpo`: below this std of c, w = 1.", non_negative())
    cw_variant: str = param(
        "paper",
        "`cw_grpo`: `paper` (the paper's text: group statistics of the sampling policy, weights on the advantage) or "
        "`released` (the authors' released code: per-micro-batch weights in the loss from the current policy). "
        "docs/methods.md §2.3.",
        one_of(*CW_VARIANTS),
    )
    cw_weight_gradient: bool | None = param(
        None,
        "`cw_grpo`: gradient through the weights; None: the variant's own (true for `released`, false for `paper`, "
        "where true is refused).",
        one_of(False, True, allow_none=True),
    )
    # THR and NTHR (docs/methods.md §3).
    thr_p: float = param(
        0.1, "`thr`: p of THR Eq. 5; p > 0 favours exploitation (greedy accuracy), p < 0 exploration (pass@k).",
        between(-1, 1),
    )
    thr_beta: float = param(
        1.0,
        "`thr`/`nthr`: scale of the threshold tau (`thr`: beta times the smallest mean THR score of a correct "
        "response, THR App. E.5; `nthr`: Deng et al. 2025 Eq. 8). docs/methods.md §3.",
        non_negative(),
    )
    thr_keep_below_threshold: bool = param(
        False, "`thr`: tokens with |THR| <= tau get advantage 0 (False, the paper's setting) or keep A (True).",
        one_of(False, True),
    )
    thr_entropy_quantile: float = param(
        0.0, "`thr`: also keep the top-q-entropy tokens below the threshold (0 = off; the paper uses 0.2 for 0.5B).",
        between(0, 1, high_open=True),
    )
    thr_vocab: str = param(
        "full", "`thr`: `full` (exact) or `sampled` (the group's tokens only, not renormalised; NTHR App. 7.4).",
        one_of(*VOCAB_MODES),
    )
    thr_chunk_size: int = param(1024, "`thr`: tokens per chunk of the score computation (bounds its memory).",
                                integer(1))
    nthr_length_normalized: bool = param(
        False, "`nthr`: keep THR's 1/|y_i| in the score compared with tau (False: the threshold's own scale).",
        one_of(False, True),
    )
    # Pass@K (docs/methods.md §4).
    passk_k: int = param(4, "`passk_mixed`: K of the pass@K advantage (Chen et al. 2025).", integer(1))
    reinforce_pp_gamma: float = param(
        1.0,
        "`reinforce_pp`: discount gamma of the returns G_t = r_t + gamma G_(t+1) (REINFORCE++, Hu 2025; verl's "
        "`algorithm.gamma`, default 1: every loss token's return is the outcome reward). docs/methods.md §15.2.",
        between(0, 1),
    )
    kl_in_reward_coef: float = param(
        0.001,
        "`kl_in_reward`: beta_r, the coefficient of the KL charged to each completion's reward, r - beta_r sum_t KL_t, "
        "before GRPO's normalisation (verl's `algorithm.kl_ctrl.kl_coef` with `use_kl_in_reward`, default 0.001). "
        "docs/methods.md §15.7.",
        non_negative(),
    )
    kl_in_reward_estimator: str = param(
        "k1",
        "`kl_in_reward`: the per-token KL estimator of the charge (docs/methods.md §15.3; default `k1`, verl's "
        "`algorithm.kl_penalty: kl`). docs/methods.md §15.7.",
        one_of("k1", "k2", "k3", "k3_plus", "low_var_kl"),  # strategies.kl_estimators.KL_ESTIMATORS (a test checks)
    )
    dense_returns_unit: str = param(
        "turn",
        "`dense_returns`: the unit its leave-one-out baseline is aligned on: `turn` (the completion's model turns; a "
        "single-turn completion is one) or `token` (the position among the completion's sampled tokens). Either keeps "
        "the policy gradient unbiased (verl-project/verl#7244). docs/methods.md §15.6.",
        one_of("turn", "token"),
    )
    # Loss-side strategies (docs/methods.md §10). Defaults: verl's actor config (verl-project/verl
    # verl/trainer/config/actor/actor.yaml) and the methods' released scripts; each help says which.
    clip_cov_ratio: float = param(
        0.0002,
        "`clip_cov`: fraction r of a micro-batch's tokens (at least one) whose policy term is removed, drawn at random "
        "among those with lb < c < ub (Cui et al. 2025, Clip-Cov; verl `clip_cov_ratio`).",
        between(0, 1, low_open=True),
    )
    clip_cov_lb: float = param(
        1.0, "`clip_cov`: lower bound of the covariance c = (A - mean A)(log p - mean log p) of a selectable token "
        "(Clip-Cov omega_low; verl `clip_cov_lb`).", number(),
    )
    clip_cov_ub: float = param(
        5.0, "`clip_cov`: upper bound of c of a selectable token (Clip-Cov omega_high; verl `clip_cov_ub`).",
        number(),
    )
    clip_cov_keep_value: bool = param(
        False,
        "`clip_cov`: False (released code): a selected token's policy term is multiplied by 0 (value and gradient); "
        "True (the paper's 'detach'): its value stays, its gradient stops. Same gradient. docs/methods.md §10.",
        one_of(False, True),
    )
    kl_cov_ratio: float = param(
        0.0002,
        "`kl_cov`: fraction k of a micro-batch's tokens (at least one), those with the largest covariance c, that get "
        "the |log p - log p_old| penalty (Cui et al. 2025, KL-Cov; verl `kl_cov_ratio`; the authors' scripts use "
        "0.002 for 7B, 0.0002 for 32B).",
        between(0, 1, low_open=True),
    )
    kl_cov_coef: float = param(
        1.0,
        "`kl_cov`: coefficient of the |log p - log p_old| penalty (KL-Cov beta; the authors' scripts and verl's "
        "function default `ppo_kl_coef` = 1; verl's actor.yaml ships 0.1).",
        non_negative(),
    )
    kl_cov_keep_clip: bool = param(
        False,
        "`kl_cov`: False (released code): the surrogate is the unclipped -r A (the configured clip is removed); True: "
        "the penalty is added to the configured clipped surrogate.",
        one_of(False, True),
    )
    dppo_tv_low: float = param(
        0.15, "`dppo_tv`: delta_low, a negative-advantage token is masked when p - p_old < -delta_low (DPPO "
        "Binary-TV; verl examples/dppo_trainer: 0.15).", positive(),
    )
    dppo_tv_high: float = param(
        0.15, "`dppo_tv`: delta_high, a positive-advantage token is masked when p - p_old > delta_high.", positive(),
    )
    dppo_kl_low: float = param(
        0.05, "`dppo_kl`: delta_low, a negative-advantage token with p < p_old is masked when the binary KL "
        "D(p_old || p) > delta_low (DPPO Binary-KL; verl examples/dppo_trainer: 0.05).", positive(),
    )
    dppo_kl_high: float = param(
        0.05, "`dppo_kl`: delta_high, a positive-advantage token with p > p_old is masked when the binary KL "
        "D(p_old || p) > delta_high.", positive(),
    )
    dppo_keep_clip: bool = param(
        False,
        "`dppo_tv`/`dppo_kl`: False (released code): the trust-region mask replaces PPO's ratio clip (the surrogate "
        "becomes -r A; with loss_type cispo the truncation epsilon_high stays, verl's clip_ratio_c); True: the mask "
        "acts on top of the configured clip.",
        one_of(False, True),
    )
    gmpo_epsilon_low: float = param(
        0.4, "`gmpo`: log-space lower clip, log r >= -epsilon_low (GMPO's token clip; TRL GMPOConfig and verl's GMPO "
        "example: 0.4).", positive(),
    )
    gmpo_epsilon_high: float = param(
        0.4, "`gmpo`: log-space upper clip, log r <= epsilon_high (GMPO; TRL GMPOConfig and verl: 0.4).", positive(),
    )
    # Entropy-aware token credit (docs/methods.md §11). Defaults: the authors' configs (see each help).
    archer_entropy_quantile: float = param(
        0.8,
        "`archer`: per response, tokens with entropy above this quantile of the response's token entropies are "
        "high-entropy (ArcherCodeR `token_entropy_quantile=0.8`; Archer Sec. 3).",
        between(0, 1, low_open=True, high_open=True),
    )
    archer_low_entropy_clip_low: float = param(
        0.2, "`archer`: epsilon_low of low-entropy tokens (ArcherCodeR `low_entropy_clip_ratio_low=0.2`).",
        between(0, 1, high_open=True),
    )
    archer_low_entropy_clip_high: float = param(
        0.2, "`archer`: epsilon_high of low-entropy tokens (ArcherCodeR `low_entropy_clip_ratio_high=0.2`).",
        non_negative(),
    )
    archer_high_entropy_clip_low: float = param(
        0.5, "`archer`: epsilon_low of high-entropy tokens (ArcherCodeR `high_entropy_clip_ratio_low=0.5`).",
        between(0, 1, high_open=True),
    )
    archer_high_entropy_clip_high: float = param(
        0.5, "`archer`: epsilon_high of high-entropy tokens (ArcherCodeR `high_entropy_clip_ratio_high=0.5`).",
        non_negative(),
    )
    archer_high_entropy_kl_scale: float = param(
        0.0,
        "`archer`: coefficient of the high-entropy tokens' KL, used alone as the released "
        "`high_entropy_kl_loss_scale_coef` is (beta is the low-entropy tokens' kl_loss_coef); > 0 needs beta > 0. "
        "ArcherCodeR: 0, no KL on high-entropy tokens. docs/methods.md §11.5.",
        non_negative(),
    )
    archer_kl_mean: str = param(
        "split",
        "`archer`: `split` (ArcherCodeR dp_actor.py: the KL is averaged over low- and over high-entropy tokens "
        "separately, each set then weighted) or `token` (one mean over all tokens, the paper's Eq. as printed).",
        one_of(*ARCHER_KL_MEANS),
    )
    entropy_shaping_alpha: float = param(
        0.4,
        "`entropy_shaping`: alpha of Cheng et al. 2025, A' = A + min(alpha sg[H], |A| / kappa) (paper: 0.4).",
        non_negative(),
    )
    entropy_shaping_kappa: float = param(
        2.0, "`entropy_shaping`: kappa of Cheng et al. 2025: the bonus is at most |A| / kappa (paper: 2).",
        number(low=1.0, note="below 1 the bonus can turn a negative advantage positive"),
    )
    gtpo_alpha1: float = param(
        1.0, "`gtpo`: alpha_1 of GTPO Eq. 3/5, weight of the outcome reward (+1 correct, -1 incorrect) (paper: 1).",
        non_negative(),
    )
    gtpo_alpha2: float = param(
        0.1, "`gtpo`: alpha_2 of GTPO Eq. 3/5, weight of the entropy-share reward (paper: 0.1).", non_negative(),
    )
    gtpo_level: str = param(
        "token",
        "`gtpo`: `token` (GTPO, Eq. 3-6: per-token shaped rewards) or `sequence` (GRPO-S: each completion's mean "
        "entropy shapes its one reward).",
        one_of(*GTPO_LEVELS),
    )
    gtpo_normalization: str = param(
        "group",
        "`gtpo`: shaped rewards normalised over the group's tokens together (`group`) or over the correct and the "
        "incorrect completions' tokens separately (`separate`, Eq. 6 read per set). docs/methods.md §11.3.",
        one_of(*GTPO_NORMALIZATIONS),
    )
    ktae_alpha: float = param(
        1.0, "`ktae`: weight of the Fisher-exact-test term exp(-2p) (released compute_key_tokens.py `alpha`: 1.0).",
        non_negative(),
    )
    ktae_beta: float = param(
        1.0,
        "`ktae`: weight of the information-gain term. 1.0: the value the released code uses "
        "(core_algos.py passes beta_ig=1.0; the scripts' beta_ig=2.0 is not read).",
        non_negative(),
    )
    ktae_frequency: bool = param(
        True, "`ktae`: add the BM25-style frequency ratio to the Cohen's-h direction (released `gamma_tf=1.0`).",
        one_of(False, True),
    )
    ktae_scale: float = param(
        1.0, "`ktae`: the key-token score is (sigmoid(s) - 0.5) * 2 * scale, in (-scale, scale) (released `top`).",
        non_negative(),
    )

    # Optimal token baseline (docs/methods.md §14).
    otb_handle_zero_tail: bool = param(
        True, "`otb`, `tir_otb`: the one completion longer than every other of its group gets no baseline from the "
        "second-longest length on (verl's handle_zero_tail, default True).", one_of(False, True),
    )
    otb_vocab_chunk: int = param(
        8192, "`otb`, `tir_otb`: at most this many vocabulary entries per LM-head tile when sum_v p(v)^2 is computed "
        "(fewer at long context, where a tile holds at most 512 tokens' worth of logits; memory knob: the result does "
        "not depend on it beyond rounding).", integer(1),
    )
    # Distillation from a teacher (docs/methods.md §16).
    teacher_model: str | None = param(  # any path or Hub name: loaded and checked when the trainer is built
        None,
        "`opd`, `iw_opd`: the teacher whose per-token log-probability of the sampled token enters the advantage: "
        "`ref` (TRL's reference model, beta > 0; in a LoRA run the frozen base), `base` (a LoRA run's frozen base, "
        "the adapter disabled), `ema` (an exponential moving average of the policy's weights, `teacher_ema_decay`) or "
        "a model's path or Hub name sharing the policy's tokenizer. docs/methods.md §16.",
        name(allow_none=True),
    )
    teacher_ema_decay: float = param(
        0.95, "`teacher_model: ema`: after every optimizer step theta_T <- decay theta_T + (1 - decay) theta "
        "(TRL 1.16 SDPOConfig.teacher_update_rate = 1 - decay = 0.05, synced every step; docs/methods.md §16).",
        between(0, 1),
    )
    opd_coef: float = param(
        1.0, "`opd`: A' = A + coef * d, d = log pi_teacher - log pi_old at the sampled token (slime --opd-kl-coef, "
        "verl distillation_loss_coef: 1.0).", non_negative(),
    )
    opd_clip: float | None = param(
        10.0, "`opd`: d clamped to [-clip, clip] (verl's loss_max_clamp: 10.0); None: no clamp (slime).",
        positive(allow_none=True),
    )
    iw_opd_gamma: float = param(
        0.5, "`iw_opd`: w = 1 + gamma (1 - sum_{s<t} |d_s| / sum_s |d_s|), the prefix-discrepancy weight (TRL "
        "IWOPDConfig.iw_opd_gamma: 0.5).", non_negative(),
    )
    iw_opd_epsilon: float = param(
        1e-8, "`iw_opd`: floor of sum_s |d_s| in w (TRL IWOPDConfig.iw_opd_epsilon).", positive(),
    )
    iw_opd_weight: float = param(
        1.0, "`iw_opd`: A' = (1 - weight) A + weight * w * d; 1.0 is TRL's IW-OPD trainer (distillation only).",
        between(0, 1),
    )
    sdpo_weight: float = param(
        1.0, "`sdpo`: A' = (1 - weight) A + weight * s_i d, TRL SDPOConfig.distillation_weight (1.0: "
        "self-distillation only, as SDPO's paper trains).", between(0, 1),
    )
    sdpo_teacher: str = param(
        "live", "`sdpo`: the self-teacher's weights: `live` (the current policy; TRL SDPOConfig.teacher_model_kind "
        "'live') or `ema` (an exponential moving average of the policy, `teacher_ema_decay`: TRL's and the SDPO "
        "authors' default, shared with `teacher_model: ema`). docs/methods.md §16.3.", one_of("live", "ema"),
    )
    sdpo_success_threshold: float = param(
        1.0, "`sdpo`: a sibling whose reward reaches it is a demonstration (TRL success_reward_threshold: 1.0).",
        number(),
    )
    sdpo_feedback: bool = param(
        False, "`sdpo`: put the dataset's `privileged_context` text in the self-teacher's prompt where a row has it "
        "(TRL include_environment_feedback: False).", one_of(False, True),
    )
    sdpo_max_reprompt_length: int = param(
        10240, "`sdpo`: the self-teacher's prompt keeps its last this many tokens (TRL max_reprompt_len: 10240).",
        integer(1),
    )
    # RLSD (docs/methods.md §18.4).
    rlsd_teacher: str = param(
        "self", "`rlsd`: the teacher whose log-probability gap sets each token's weight: `self` (SDPO's self-teacher: "
        "the policy reprompted with a successful sibling and, with `sdpo_feedback`, the row's `privileged_context`, "
        "e.g. the reference answer as RLSD's released runs give it; `sdpo_teacher`, `sdpo_success_threshold`) or "
        "`teacher_model` (the teacher `teacher_model` names). docs/methods.md §18.4.",
        one_of("self", "teacher_model"),
    )
    rlsd_lambda: float = param(
        0.5, "`rlsd`: A' = A ((1 - lambda) + lambda clip(w, 1 +- rlsd_clip)); 0.5 as the authors' code and configs "
        "(iie-ycx/RLSD opsd_config.py rlsd_lambda, rlsd_config.yaml); the paper's equation A clip(w) is 1.",
        between(0, 1),
    )
    rlsd_clip: float = param(
        0.2, "`rlsd`: eps_w of clip(w, 1 - eps_w, 1 + eps_w), w = exp(sign(A) (log pi_T - log pi_S)) (RLSD's "
        "rlsd_reweight_clip_range: 0.2 in its config, else the actor's clip_ratio_low, 0.2).",
        between(0, 1),
    )
    rlsd_lambda_warmup_steps: int = param(
        0, "`rlsd`: lambda rises linearly from 0 to rlsd_lambda over this many optimizer steps (rlsd_lambda * s / "
        "warmup at step s); 0: none (iie-ycx/RLSD opsd_config.py rlsd_lambda_warmup_steps 0, its training script "
        "too). A generation batch takes the lambda of the first step it trains. docs/methods.md §18.5.",
        integer(0),
    )
    rlsd_lambda_decay_steps: int = param(
        0, "`rlsd`: after the warm-up, lambda falls linearly to 0 over this many optimizer steps (rlsd_lambda * max(1 "
        "- (s - warmup) / decay, 0) at step s) and stays 0; 0: none (opsd_config.py's default; the released "
        "training script rlsd_train.sh sets 60). docs/methods.md §18.5.",
        integer(0),
    )
    rlsd_negative_only: bool = param(
        False, "`rlsd`: reweight only completions whose advantage sums to < 0 (the teacher redistributes blame); the "
        "others keep A (iie-ycx/RLSD rlsd_negative_only: False).", one_of(False, True),
    )
    rlsd_thought_only: bool = param(
        False, "`rlsd`: reweight only the tokens between `rlsd_thought_tags`' opening and closing tags, the others "
        "keep A (iie-ycx/RLSD rlsd_thought_only: False).", one_of(False, True),
    )
    rlsd_thought_tags: str = param(
        "<thought> </thought>", "`rlsd`: the opening and closing tags of `rlsd_thought_only`'s span, separated by a "
        "space, each matched as the tokens the tokenizer gives it alone (RLSD's `<thought> </thought>`; R1-style "
        "prompts use `<think> </think>`).", name(),
        acts_when=ActsWhen("rlsd_thought_only: true", lambda args: bool(args.rlsd_thought_only)),
    )
    # ECHO (docs/methods.md §18.7).
    echo_coef: float = param(
        0.1, "`echo`: alpha of ECHO's cross-entropy alpha * (-log p) on the environment's tokens (tool results, "
        "retrieved passages; TRL's tool_mask 0), averaged over them beside the policy loss (prime-rl EchoRoleConfig."
        "alpha: 0.1 for the tool role; rllm's ECHO uses 0.05 as the paper's); the alpha of every role in "
        "`echo_roles` given without its own. docs/methods.md §18.7.",
        positive(),
    )
    echo_roles: str = param(  # parsed by the strategy's check_params
        "tool", "`echo`: the roles whose environment tokens train and their alphas, comma separated: `role` (alpha "
        "echo_coef) or `role=alpha`, roles system, user, assistant, tool (prime-rl's role table; its default: tool "
        "at 0.1). The search setting's passages are tool, its retry message user; TRL's tool results are tool. "
        "docs/methods.md §18.8.", name(),
    )
    echo_filter: str | None = param(
        None, "`echo`: import path (`package.module:function`) of a filter narrowing the role-selected tokens: "
        "called with each completion's token ids (a list of ints), it returns one keep flag per token (prime-rl's "
        "echo filter); None: none. docs/methods.md §18.8.", name(allow_none=True),
    )

    # Rollout correction between the sampling engine (vLLM) and the trainer (docs/methods.md, "Rollout correction").
    # Defaults: verl's RolloutCorrectionConfig (verl/trainer/config/algorithm.py) and its decoupled_seq_is preset.
    rollout_is: str = param(
        "sequence",
        "`rollout_correction`: importance-weight level of pi_old / pi_rollout: `token`, `sequence` (product over the "
        "completion), `geometric` (its geometric mean) or `none` (rejection and diagnostics only). verl: sequence.",
        one_of(*ROLLOUT_IS_LEVELS),
    )
    rollout_is_threshold: float = param(
        2.0, "`rollout_correction`: C, the weights' cap (truncate) or cut-off (mask). verl: 2.0.", positive(),
    )
    rollout_is_handling: str = param(
        "truncate", "`rollout_correction`: `truncate` (TIS, min(w, C); verl) or `mask` (MIS, w 1[w <= C]).",
        one_of(*ROLLOUT_IS_HANDLING),
    )
    rollout_is_batch_normalize: bool = param(
        False, "`rollout_correction`: divide the weights by their batch mean (verl's rollout_is_batch_normalize).",
        one_of(False, True),
    )
    rollout_rs: str = param(  # the options are parsed by the strategy's check_params, as verl parses them
        "none",
        "`rollout_correction`/`rollout_correction_bypass`: rejection options, comma separated (token_k1..3, "
        "seq_sum_k1..3, seq_mean_k1..3, seq_max_k2/k3; verl's rollout_rs), or `none`.",
        name(),
    )
    rollout_rs_threshold: str | None = param(  # the bounds are parsed by the strategy's check_params
        None,
        "`rollout_correction`/`rollout_correction_bypass`: bounds of `rollout_rs`, one or one per option: K1 "
        "'lower_upper' ratio bounds (one number: upper, lower its reciprocal), K2/K3 an upper bound (verl).",
        name(allow_none=True),
    )

    rollout_rs_normalizer: str = param(
        "excluded",
        "`rollout_correction`/`rollout_correction_bypass`: what rejection does to the loss's normaliser: `excluded` "
        "(verl: rejected tokens leave response_mask, so each sequence's and the batch's token counts drop them) or "
        "`kept` (their term is zeroed and they still count, as TRL's masks do).",
        one_of("excluded", "kept"),
    )
    rollout_clip_ratio_c: float = param(
        3.0,
        "`rollout_correction`/`rollout_correction_bypass`: verl's clip_ratio_c, dual-clip PPO (Ye et al. 2020): for "
        "A < 0 a token's policy term is capped at -A c (times its IS weight in decoupled mode), no gradient beyond; "
        "verl's default 3, above 1; 0 turns it off (TRL's losses have none).",
        non_negative(),
    )

    def __post_init__(self):
        validate_fields(self, PARAM_RULES)
        parent = getattr(super(), "__post_init__", None)  # SharpGRPOConfig: TRL's GRPOConfig comes next
        if parent is not None:
            parent()


# What each strategy parameter accepts, from the fields' own declarations (checked in StrategyParams.__post_init__).
PARAM_RULES = {f.name: f.rule for f in dataclasses.fields(StrategyParams) if isinstance(f, _RuledField)}
