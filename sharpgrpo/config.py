"""``SharpGRPOConfig``: TRL's ``GRPOConfig`` plus the token-level strategies and their parameters.

The strategies' parameters live in ``sharpgrpo.strategy_params.StrategyParams``, which the config inherits; the
fields below are the trainer's (which strategies, how weights enter the loss, diagnostics). Each field of ours
declares its default, help and accepted values together (``param``); the decisions behind the defaults are in
docs/methods.md. The config validates itself in ``__post_init__``, before any model is loaded: each field's values
(``sharpgrpo.validation``), then the strategies and how they compose (``StrategySet.check_config``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from sharpgrpo.strategies import strategy_names_help
from sharpgrpo.strategies.kl_estimators import DEFAULT_KL_ESTIMATOR, KL_ESTIMATORS
from sharpgrpo.strategies.loss_types import LOSS_TYPES
from sharpgrpo.strategy_params import PARAM_RULES, ActsWhen, StrategyParams, _RuledField, param
from sharpgrpo.training.generation.async_rollout.checks import check_async_config
from sharpgrpo.training.generation.routing_replay import check_routing_replay_config
from sharpgrpo.training.strategy_set import StrategySet
from sharpgrpo.validation import (
    integer,
    name,
    non_negative,
    one_of,
    parse_strategy_names,
    positive,
    renamed,
    validate_fields,
    validate_trl_fields,
)

WEIGHT_PLACEMENTS = ("ratio", "loss")
KL_WEIGHTINGS = ("loss", "inside", "none")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")


# The features whose fields act only while they are on (`param(..., acts_when=...)`).
KL_TERM = ActsWhen("beta > 0 (the KL term; beta=0 computes no KL)", lambda args: args.beta != 0)
DYNAMIC_SAMPLING = ActsWhen("dynamic_sampling: true", lambda args: bool(args.dynamic_sampling))
OVERLONG_PENALTY = ActsWhen("the overlong_penalty reward in reward_funcs", reward="overlong_penalty")
ASYNC_GENERATION = ActsWhen("async_generation: true", lambda args: bool(args.async_generation))


@dataclass
class SharpGRPOConfig(StrategyParams, GRPOConfig):
    r"""Configuration for [`SharpGRPOTrainer`]: all of [`trl.GRPOConfig`], the strategies' parameters
    ([`sharpgrpo.strategy_params.StrategyParams`]) and the fields below.

    Strategies are chosen by name (``strategies``) and combine: token-weight strategies multiply, advantage
    strategies apply in list order. Parameters are flat so that YAML and the CLI set them directly. Each field's
    equation, paper and the decision behind its default: docs/methods.md.
    """

    strategies: list[str] | str = field(
        default_factory=lambda: ["grpo_sg"],
        metadata={
            "help": "Token-level strategies, by registered name or dotted import path; one name, a list, or a "
            f"comma-separated string. {strategy_names_help()} At most one weight strategy."
        },
    )
    # How a token weight enters the loss (docs/methods.md §1).
    weight_placement: str = param(
        "loss",
        "Where a token weight w enters the surrogate: `loss` (w times the clipped term) or `ratio` (GRPO-SG Eq. 13 "
        "as printed: w r inside the clip; warns with the probability above which positive tokens lose their "
        "gradient). docs/methods.md §1.",
        one_of(*WEIGHT_PLACEMENTS),
    )
    kl_weighting: str = param(
        "loss",
        "How w enters the k3 KL term (beta > 0): `loss` w*kl (GRPO-SG Lemma 3.4), `inside` k3 of w*pref/p (TR-GRPO "
        "Eq. 11), `none`.",
        one_of(*KL_WEIGHTINGS), acts_when=KL_TERM,
    )
    kl_estimator: str = param(
        DEFAULT_KL_ESTIMATOR,
        "Estimator of the per-token KL(pi || pi_ref) in the beta term (Schulman 2020, 'Approximating KL divergence'; "
        "verl's `kl_penalty`): `k3` (TRL's, the default), `k1`, `k2`, `low_var_kl` (verl's clamped k3), `k3_plus` "
        "(low_var_kl's value with k2's gradient, verl's `k3+`). docs/methods.md §15.3.",
        one_of(*KL_ESTIMATORS), acts_when=KL_TERM,
    )
    # Dynamic sampling (DAPO §3.2, verl's `filter_groups`; docs/methods.md §15.5).
    dynamic_sampling: bool = param(
        False,
        "Drop the groups that carry no signal (`dynamic_sampling_filter`) and generate groups from new prompts until "
        "the batch is full or `dynamic_sampling_max_rounds` extra rounds are spent (DAPO §3.2; verl "
        "`algorithm.filter_groups`). docs/methods.md §15.5.",
        one_of(False, True),
    )
    dynamic_sampling_filter: str = param(
        "reward_std",
        "What a group must vary in to be kept: `reward_std` (the total reward), `accuracy` (the answer checks: "
        "accuracy in (0, 1), DAPO's filter) or a reward function's name as logged (`rewards/<name>/mean`).",
        name(), acts_when=DYNAMIC_SAMPLING,
    )
    dynamic_sampling_max_rounds: int = param(
        9,
        "Extra generation rounds allowed per generation batch (verl's `max_num_gen_batches` 10 in all, minus the "
        "first); when spent, failing groups fill the batch (`dynamic_sampling/groups_unfilled`), and a step where no "
        "group passed stops training.",
        integer(0), acts_when=DYNAMIC_SAMPLING,
    )
    # The overlong penalty reward (`reward_funcs: [..., overlong_penalty]`; docs/methods.md §15.4).
    overlong_buffer_length: int | None = param(
        None,
        "`overlong_penalty`: DAPO's L_cache (Eq. 13), the last tokens of `max_completion_length` over which the "
        "penalty grows to `overlong_penalty_factor` (verl `overlong_buffer.len`); None: a fifth of "
        "max_completion_length (DAPO's 4096 of 20480).",
        integer(1, allow_none=True), acts_when=OVERLONG_PENALTY,
    )
    overlong_penalty_factor: float = param(
        1.0, "`overlong_penalty`: the penalty at max_completion_length (verl `overlong_buffer.penalty_factor`).",
        non_negative(), acts_when=OVERLONG_PENALTY,
    )
    # Advantage strategies' inputs and their per-token scores (docs/methods.md §3).
    dump_token_scores: bool = param(
        False,
        "Write the per-token scores of every advantage strategy that has them (THR's influence scores, ...) with the "
        "decoded tokens and token advantages to `output_dir/token_scores/` every generation.",
        one_of(False, True),
    )
    thr_debug_dump: bool | None = param(None, "Renamed `dump_token_scores`; refused.", renamed("dump_token_scores"))
    generation_capture: bool = param(
        True,
        "Read sampling log-probabilities and last hidden states from transformers' `generate` instead of a second "
        "forward (equal up to KV-cache rounding). False: always forward.",
        one_of(False, True),
    )

    # Mixture-of-experts routing replay (R3; docs/methods.md §23).
    routing_replay: bool = param(
        False,
        "Mixture-of-experts models: record the experts each token was routed to when it was sampled (every MoE "
        "layer's top-k, from transformers' `generate`) and make every training forward of that rollout (old and "
        "reference log-probabilities, the loss, every num_iterations pass) use them, with the gate weights "
        "recomputed from the live router so it keeps its gradient (rollout routing replay, R3, arXiv 2510.11370). "
        "Logs routing_replay/agreement. docs/methods.md §23, docs/moe.md.",
        one_of(False, True),
    )

    # Asynchronous generation (docs/methods.md §20).
    async_generation: bool = param(
        False,
        "Generate in a rollout process of its own (with `use_vllm` and `vllm_mode: server`, the vLLM server) while "
        "the trainer trains: the next generation batches (at most "
        "`max_staleness` ahead) are generated with weights published at each generation batch; the sampling "
        "log-probabilities reach the loss as `sampling_per_token_logps` for the rollout corrections. docs/methods.md "
        "§20.",
        one_of(False, True),
    )
    max_staleness: int = param(
        1,
        "`async_generation`: k, how many policy versions (generation batches) a batch may lag the trainer; it is "
        "submitted k generation batches ahead, so the bound holds and nothing is dropped; 0: the trainer waits for "
        "each batch, generated with its current weights and random state (equal to synchronous training).",
        integer(0), acts_when=ASYNC_GENERATION,
    )

    # Diagnostics.
    sharpness_probe_steps: int = param(
        0,
        "Every N optimizer steps, the loss increase after an ascent step of radius `sharpness_rho` along the "
        "normalised gradient (SAM's inner maximisation), logged as sharpness/*; 0: off.",
        integer(0),
    )
    sharpness_rho: float = param(0.05, "Radius of the sharpness probe's ascent step.", positive())
    token_telemetry: bool = param(
        False,
        "Write every completion token's loss inputs (log-p, ratio, clip flags, weights, token advantage after each "
        "strategy, KL, its share of the loss) to `output_dir/telemetry/telemetry_<step>.parquet` every "
        "`telemetry_steps`; read by `sharpgrpo tokens --telemetry`. docs/telemetry.md.",
        one_of(False, True),
    )
    telemetry_steps: int = param(
        0, "Steps between telemetry files (with `token_telemetry`); 0: the logging interval (`logging_steps`).",
        integer(0),
    )

    def __post_init__(self):
        # Every value first: TRL's own __post_init__ divides by some of them (num_generations, batch sizes).
        self.strategies = parse_strategy_names(self.strategies)
        validate_trl_fields(self)
        validate_fields(self, OWN_FIELD_RULES)
        super().__post_init__()  # StrategyParams checks the strategy parameters' rules, then TRL's __post_init__
        StrategySet.check_config(self)  # the strategies resolve and compose; their own checks
        check_async_config(self)  # what asynchronous generation cannot serve
        check_routing_replay_config(self)  # the generation paths that record no routes


# What each field of ours accepts, from the fields' own declarations, plus the values we add to two of TRL's fields
# (sharpgrpo.validation; relations between fields and the strategies are checked by `StrategySet.check_config`; TRL's own fields:
# TRL_FIELD_RULES).
FIELD_RULES = {
    "loss_type": one_of(*LOSS_TYPES),
    "importance_sampling_level": one_of(*IMPORTANCE_SAMPLING_LEVELS),
    **{f.name: f.rule for f in fields(SharpGRPOConfig) if isinstance(f, _RuledField)},
}
# Those checked by SharpGRPOConfig.__post_init__ itself; the strategy parameters' (PARAM_RULES) by StrategyParams'.
OWN_FIELD_RULES = {name: rule for name, rule in FIELD_RULES.items() if name not in PARAM_RULES}
