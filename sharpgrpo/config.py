"""``SharpGRPOConfig``: TRL's ``GRPOConfig`` plus the token-level strategies and their parameters.

The strategies' parameters live in ``sharpgrpo.strategy_params.StrategyParams``, which the config inherits; the
fields below are the trainer's (which strategies, how weights enter the loss, diagnostics). Each field of ours
declares its default, help and accepted values together (``param``); the decisions behind the defaults are in
docs/methods.md. The config validates itself in ``__post_init__``, before any model is loaded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from sharpgrpo.strategies import strategy_names_help
from sharpgrpo.strategies.loss_types import LOSS_TYPES, RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.strategy_params import PARAM_RULES, StrategyParams, _RuledField, param
from sharpgrpo.validation import (
    ConfigError,
    integer,
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
        one_of(*KL_WEIGHTINGS),
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
        "`telemetry_steps`; read by `sharpgrpo tokens --telemetry`. README 'Token telemetry'.",
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
        self._validate()

    def _validate(self) -> None:
        """Relations between fields: the strategies resolve, at most one is a weight strategy, a weight placed in the
        ratio has a per-token ratio to scale; then the strategies' own checks (``check_params`` of every registered one,
        ``check_config`` of each selected one)."""
        from sharpgrpo.strategies import STRATEGIES

        try:
            strategy_classes = [STRATEGIES.get(name) for name in self.strategies]
        except ValueError as error:  # an unknown name or a dotted path that does not import
            raise ConfigError(f"strategies={self.strategies}: {error}") from None
        kinds = [getattr(cls, "kind", None) for cls in strategy_classes]
        for name, kind in zip(self.strategies, kinds, strict=True):
            if kind not in ("weight", "advantage", "loss"):
                raise ValueError(f"Strategy {name!r} has kind {kind!r}; expected 'weight', 'advantage' or 'loss'.")
        if kinds.count("weight") > 1:
            raise ValueError(f"At most one token-weight strategy may be active; got {self.strategies}.")
        check_loss_compositions(self.strategies, strategy_classes)
        ratio_placed = self.weight_placement == "ratio" and "weight" in kinds
        if ratio_placed and self.loss_type not in RATIO_PLACEMENT_LOSS_TYPES:
            raise ConfigError(
                f"weight_placement=ratio: not defined for loss_type={self.loss_type} (its surrogate weights whole "
                "sequences by the sequence's importance ratio, with no per-token ratio for the token weight to "
                "scale); set weight_placement: loss or another loss_type."
            )
        for name in STRATEGIES.names():
            STRATEGIES.get(name).check_params(self)
        for cls in strategy_classes:
            cls.check_config(self)
        self._warn_unread_strategy_params(strategy_classes)

    def _warn_unread_strategy_params(self, strategy_classes) -> None:
        """A strategy parameter set away from its default that none of the selected strategies reads (``params``)
        warns, naming the strategies it belongs to: ``thr_p: 0.1`` with ``strategies: grpo_sg`` does nothing."""
        from sharpgrpo.strategies import STRATEGIES

        read = {name for cls in strategy_classes for name in getattr(cls, "params", ())}
        owners: dict[str, list[str]] = {}
        for name in STRATEGIES.names():
            for parameter in getattr(STRATEGIES.get(name), "params", ()):
                owners.setdefault(parameter, []).append(name)
        for f in fields(StrategyParams):
            value = getattr(self, f.name)
            if f.name in read or f.name not in owners or value == f.default:
                continue
            warnings.warn(
                f"{f.name}={value!r} is not read by strategies={self.strategies}: it is a parameter of "
                f"{', '.join(owners[f.name])}; it has no effect in this run.",
                UserWarning,
                stacklevel=3,
            )


# LossTerms fields that at most one selected loss strategy may set (the others combine: masks multiply, terms add).
EXCLUSIVE_LOSS_TERMS = ("clip_range", "sequence_loss")


def check_loss_compositions(names: list[str], classes: list[type]) -> None:
    """Refuse, in one line naming both strategies, a composition the loss does not define: two loss strategies that
    set the same exclusive ``LossTerms`` field (the per-token clip range; a sequence objective), or a sequence-level
    objective (GMPO) beside any other strategy (a token weight, token advantages or a token mask have no place in a
    sequence's geometric mean)."""
    for i, (name, cls) in enumerate(zip(names, classes, strict=True)):
        sets = getattr(cls, "sets", frozenset()) if getattr(cls, "kind", None) == "loss" else frozenset()
        for other, other_cls in zip(names[i + 1:], classes[i + 1:], strict=True):
            other_sets = getattr(other_cls, "sets", frozenset()) if other_cls.kind == "loss" else frozenset()
            shared = [field for field in EXCLUSIVE_LOSS_TERMS if field in sets and field in other_sets]
            if shared:
                raise ConfigError(
                    f"strategies: {name} and {other} both set the loss's {shared[0].replace('_', ' ')}; the "
                    "composition is not defined, choose one."
                )
            for first, first_sets, second in ((name, sets, other), (other, other_sets, name)):
                if "sequence_loss" in first_sets:
                    raise ConfigError(
                        f"strategies: {first} (a sequence-level objective) cannot be combined with {second}: the "
                        f"composition is not defined (its per-token terms have no place in {first}'s sequence "
                        "ratio); use it alone."
                    )


# What each field of ours accepts, from the fields' own declarations, plus the values we add to two of TRL's fields
# (sharpgrpo.validation; relations between fields are checked in `SharpGRPOConfig._validate`; TRL's own fields:
# TRL_FIELD_RULES).
FIELD_RULES = {
    "loss_type": one_of(*LOSS_TYPES),
    "importance_sampling_level": one_of(*IMPORTANCE_SAMPLING_LEVELS),
    **{f.name: f.rule for f in fields(SharpGRPOConfig) if isinstance(f, _RuledField)},
}
# Those checked by SharpGRPOConfig.__post_init__ itself; the strategy parameters' (PARAM_RULES) by StrategyParams'.
OWN_FIELD_RULES = {name: rule for name, rule in FIELD_RULES.items() if name not in PARAM_RULES}
