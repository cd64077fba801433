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

from sharpgrpo.losses import LOSS_TYPES, RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.strategies.covariance import released_variant_conflict
from sharpgrpo.strategy_params import StrategyParams, _RuledField, param
from sharpgrpo.validation import (
    ConfigError,
    integer,
    one_of,
    parse_strategy_names,
    positive,
    validate_fields,
    validate_trl_fields,
)

WEIGHT_PLACEMENTS = ("ratio", "loss")
KL_WEIGHTINGS = ("loss", "inside", "none")
SUPPORTED_LOSS_TYPES = LOSS_TYPES  # all of TRL 1.16's
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
            "comma-separated string. Weight strategies: `grpo_sg`, `equal`, `random`, `reverse`. Advantage "
            "strategies: `ar`, `cw_grpo`, `thr`, `nthr`, `passk_mixed`. At most one weight strategy."
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
    # Advantage strategies' inputs and THR's score dump (docs/methods.md §3).
    thr_debug_dump: bool = param(
        False, "`thr`: write per-token scores with decoded tokens to `output_dir/thr_scores/` every generation.",
        one_of(False, True),
    )
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

    def __post_init__(self):
        # Every value first: TRL's own __post_init__ divides by some of them (num_generations, batch sizes).
        self.strategies = parse_strategy_names(self.strategies)
        validate_trl_fields(self)
        validate_fields(self, FIELD_RULES)
        super().__post_init__()
        self._validate()

    def _validate(self) -> None:
        from sharpgrpo.strategies import STRATEGIES

        try:
            strategy_classes = [STRATEGIES.get(name) for name in self.strategies]
        except ValueError as error:  # an unknown name or a dotted path that does not import
            raise ConfigError(f"strategies={self.strategies}: {error}") from None
        kinds = [getattr(cls, "kind", None) for cls in strategy_classes]
        for name, kind in zip(self.strategies, kinds, strict=True):
            if kind not in ("weight", "advantage"):
                raise ValueError(f"Strategy {name!r} has kind {kind!r}; expected 'weight' or 'advantage'.")
        if kinds.count("weight") > 1:
            raise ValueError(f"At most one token-weight strategy may be active; got {self.strategies}.")
        if self.sg_lower > self.sg_upper:
            raise ConfigError(f"sg_lower={self.sg_lower}: must not exceed sg_upper={self.sg_upper} (L <= U, Eq. 19).")
        if self.random_weight_low > self.random_weight_high:
            raise ConfigError(
                f"random_weight_low={self.random_weight_low}: must not exceed random_weight_high="
                f"{self.random_weight_high}."
            )
        if "passk_mixed" in self.strategies and not 1 <= self.passk_k <= self.num_generations:
            raise ConfigError(
                f"passk_k={self.passk_k}: must be an integer in [1, num_generations={self.num_generations}]."
            )
        if "cw_grpo" in self.strategies:
            self._validate_cw_variant()
        ratio_placed = self.weight_placement == "ratio" and "weight" in kinds
        if ratio_placed and self.loss_type not in RATIO_PLACEMENT_LOSS_TYPES:
            raise ConfigError(
                f"weight_placement=ratio: not defined for loss_type={self.loss_type} (its surrogate weights whole "
                "sequences by the sequence's importance ratio, with no per-token ratio for the token weight to "
                "scale); set weight_placement: loss or another loss_type."
            )
        if "grpo_sg" in self.strategies or "reverse" in self.strategies:
            self._warn_if_flat_weights()
        if self.weight_placement == "ratio" and "weight" in kinds:
            self._warn_ratio_placement()

    def _validate_cw_variant(self) -> None:
        """`cw_variant: released` only where the configuration computes the released loss (one line naming the
        setting that does); `cw_weight_gradient: true` only with it."""
        if self.cw_variant == "released":
            conflict = released_variant_conflict(self)
            if conflict:
                raise ConfigError(conflict)
        elif self.cw_weight_gradient:
            raise ConfigError(
                "cw_weight_gradient=True: needs cw_variant: released (the paper variant's weights come from the "
                "sampling policy at generation, without gradient)."
            )

    def _warn_ratio_placement(self) -> None:
        """`weight_placement: ratio` silences positive-advantage tokens with w > 1 + epsilon_high on-policy; say
        which (computed from the configured weights and epsilon_high, docs/methods.md §1)."""
        from sharpgrpo.strategies.probability_shaping import (
            probability_shaping_weights,
            ratio_silenced_range,
            reverse_probability_shaping_weights,
        )

        eps_high = self.epsilon_high if self.epsilon_high is not None else self.epsilon
        params = (self.sg_alpha, self.sg_mu, self.sg_tau, self.sg_lower, self.sg_upper)
        if "grpo_sg" in self.strategies or "reverse" in self.strategies:
            reverse = "reverse" in self.strategies
            shaping = reverse_probability_shaping_weights if reverse else probability_shaping_weights
            found = ratio_silenced_range(lambda p: shaping(p, *params), eps_high)
            if found is None:
                return  # w never exceeds 1 + epsilon_high: nothing is silenced
            if found == (0.0, 1.0):
                which = "every token probability p in [0, 1]"
            elif found[1] == 1.0:
                which = f"every token probability p > {found[0]:.3f}"
            else:
                which = f"every token probability p < {found[1]:.3f}"
        elif "random" in self.strategies:
            low, high = self.random_weight_low, self.random_weight_high
            span = max(high - low, 1e-12)
            fraction = min(max((high - (1 + eps_high)) / span, 0.0), 1.0)
            if fraction == 0.0:
                return
            which = f"a random {fraction:.1%} of tokens (w ~ U[{low}, {high}] > 1 + epsilon_high)"
        elif "equal" in self.strategies:
            return  # w = 1
        else:
            which = "every token whose weight exceeds 1 + epsilon_high"
        warnings.warn(
            f"weight_placement='ratio' (GRPO-SG Eq. 13 as printed): on-policy (r = 1) a positive-advantage token "
            f"with w * r > 1 + epsilon_high = {1 + eps_high:g} lands in the clipped branch and gets no gradient: here "
            f"{which}. Confident tokens of correct answers are then only pushed down. `weight_placement: loss` (the "
            "default) keeps GRPO's gradient times w (docs/methods.md §1).",
            UserWarning,
            stacklevel=3,
        )

    def _warn_if_flat_weights(self) -> None:
        import torch

        from sharpgrpo.strategies.probability_shaping import probability_shaping_weights

        grid = torch.linspace(0.0, 1.0, 1001, dtype=torch.float64)
        weights = probability_shaping_weights(grid, self.sg_alpha, self.sg_mu, self.sg_tau, self.sg_lower, self.sg_upper)
        low, high = weights.min().item(), weights.max().item()
        if high - low < 1e-6:
            warnings.warn(
                f"GRPO-SG weights are constant ({low:.4f}..{high:.4f}) for every token probability in [0, 1] with "
                f"sg_alpha={self.sg_alpha}, sg_mu={self.sg_mu}, sg_tau={self.sg_tau}, clip [{self.sg_lower}, "
                f"{self.sg_upper}]: this is plain GRPO. The papers print tau = 9, which does this; the default is "
                "tau = 1/9 (docs/methods.md §1).",
                UserWarning,
                stacklevel=3,
            )


# What each field of ours accepts, from the fields' own declarations, plus the values we add to two of TRL's fields
# (sharpgrpo.validation; relations between fields are checked in `SharpGRPOConfig._validate`; TRL's own fields:
# TRL_FIELD_RULES).
FIELD_RULES = {
    "loss_type": one_of(*SUPPORTED_LOSS_TYPES),
    "importance_sampling_level": one_of(*IMPORTANCE_SAMPLING_LEVELS),
    **{f.name: f.rule for f in fields(SharpGRPOConfig) if isinstance(f, _RuledField)},
}
