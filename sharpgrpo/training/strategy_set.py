"""The configured strategies as one object, built once from the config: which ones there are (by kind), what they
need at generation, which advantage strategy folds into the loss, how the loss strategies' terms combine, their
checkpoint state, and the rules for composing them (checked while the config is built).

Every question "which configured strategies need what" is answered here (``StrategySet.needs``), so the trainer's
hooks, the telemetry and the model card ask one object instead of re-deriving it from the strategy list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.strategies import STRATEGIES, AdvantageStrategy, LossContext, LossTerms, TokenWeightStrategy
from sharpgrpo.strategies.loss_types import RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.training.generation.entropy_inputs import strategy_loss_weights
from sharpgrpo.training.generation.inputs import GENERATION_INPUTS
from sharpgrpo.training.inert_fields import warn_fields_that_do_nothing
from sharpgrpo.training.loss.terms import collect_loss_terms
from sharpgrpo.training.output_checks import StrategyOutputChecker
from sharpgrpo.validation import ConfigError

KINDS = ("weight", "advantage", "loss")
# LossTerms fields that at most one selected loss strategy may set (the others combine: masks multiply, terms add).
EXCLUSIVE_LOSS_TERMS = ("clip_range", "sequence_loss")


@dataclass(frozen=True)
class GenerationNeeds:
    """What the advantage strategies run at generation read besides TRL's batch (``GenerationBatch`` fields).

    Attributes:
        old_logps: the sampling policy's log-probabilities (``needs_old_logps``).
        hidden_states: last hidden states and the unembedding (``needs_hidden_states``).
        entropies: the sampling policy's per-token entropy (``needs_entropies``).
        correctness: each completion's verdict (``needs_correctness``; runs the answer checks).
        inputs: names of extra per-token inputs (``needs_inputs``), each supplied by a registered generation input
            (`sharpgrpo.training.generation.inputs`) into ``GenerationBatch.extras``.
    """

    old_logps: bool = False
    hidden_states: bool = False
    entropies: bool = False
    correctness: bool = False
    inputs: tuple[str, ...] = ()

    @classmethod
    def of(cls, strategies: Sequence[Any]) -> GenerationNeeds:
        return cls(
            old_logps=any(getattr(s, "needs_old_logps", False) for s in strategies),
            hidden_states=any(getattr(s, "needs_hidden_states", False) for s in strategies),
            entropies=any(getattr(s, "needs_entropies", False) for s in strategies),
            correctness=any(getattr(s, "needs_correctness", False) for s in strategies),
            inputs=tuple(dict.fromkeys(name for s in strategies for name in getattr(s, "needs_inputs", ()))),
        )


class StrategySet:
    """The strategies named in ``args.strategies``, built once (``__init__``), in the configured order.

    Attributes:
        names: the configured names (registered names or dotted paths).
        classes: name -> class.
        weight: the token-weight strategy, or None (at most one: ``check_config``).
        advantage: the advantage strategies, in order.
        loss: (name, strategy) of each loss strategy, in order.
        checker: checks what the strategies return (``sharpgrpo.training.output_checks``).
    """

    def __init__(self, args: Any):
        self.names = list(args.strategies)
        self.classes = {name: STRATEGIES.get(name) for name in self.names}
        built = [(name, self.classes[name](args)) for name in self.names]
        self.weight: TokenWeightStrategy | None = next((s for _, s in built if s.kind == "weight"), None)
        self.advantage: list[AdvantageStrategy] = [s for _, s in built if s.kind == "advantage"]
        self.loss: list[tuple[str, Any]] = [(name, s) for name, s in built if s.kind == "loss"]
        self.checker = StrategyOutputChecker(self.classes)

    # --- what they are -------------------------------------------------------------------------------------------
    def all(self) -> list:
        """Every strategy object, weight first (the checkpoint's and the card's order)."""
        return ([self.weight] if self.weight else []) + list(self.advantage) + [s for _, s in self.loss]

    def names_of(self, kind: str) -> list[str]:
        return [name for name in self.names if self.classes[name].kind == kind]

    def split(self, trl_computes_old_logps: bool) -> tuple[list[AdvantageStrategy], AdvantageStrategy | None]:
        """``(advantage strategies run at generation, the one folded into the loss or None)``: the last strategy is
        applied in the loss instead when it ``folds_into_loss`` and training is on-policy (TRL computes no old
        log-probabilities): its factor of the loss's own detached probabilities then equals p_old exactly."""
        last = self.advantage[-1] if self.advantage else None
        if last is not None and last.folds_into_loss and not trl_computes_old_logps:
            return self.advantage[:-1], last
        return list(self.advantage), None

    def needs(self, trl_computes_old_logps: bool) -> GenerationNeeds:
        """What the strategies run at generation need (old log-probabilities only where TRL computes none)."""
        return GenerationNeeds.of(self.split(trl_computes_old_logps)[0])

    @staticmethod
    def head_readers(classes: dict[str, type]) -> list[str]:
        """The configured names whose strategy reads the hidden states and the LM head (the launch checks)."""
        return [name for name, cls in classes.items() if getattr(cls, "needs_hidden_states", False)]

    def loss_logps_temperature(self) -> float | None:
        return getattr(self.weight, "loss_logps_temperature", None)

    # --- in the loss ---------------------------------------------------------------------------------------------
    def token_weights(self, logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                      entropies: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight strategy's w for one micro-batch (detached unless its ``loss_weights`` lets gradient through;
        it sees the detached per-token entropies where it takes them) and the output checker's device count of
        invalid values."""
        weights = strategy_loss_weights(self.weight, logps, mask, advantages, entropies)
        return weights, self.checker.count_bad_weights(self.weight, weights, logps, mask)

    def loss_terms(self, context: LossContext
                   ) -> tuple[LossTerms | None, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The loss strategies' combined terms (None without loss strategies), their metrics (0-d device tensors)
        and each strategy's per-token terms, named ``<strategy>/<field>`` (the telemetry's columns)."""
        if not self.loss:
            return None, {}, {}
        return collect_loss_terms(self.loss, context, self.checker.metrics)

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, dict]:
        return {type(s).__name__: s.state_dict() for s in self.all()}

    def load_state_dict(self, state: dict[str, dict]) -> None:
        for strategy in self.all():
            if type(strategy).__name__ in state:
                strategy.load_state_dict(state[type(strategy).__name__])

    # --- composition rules (while the config is built) -----------------------------------------------------------
    @staticmethod
    def check_config(args: Any) -> None:
        """Relations between the config's fields and its strategies, before any model loads: the strategies resolve,
        at most one is a weight strategy, loss strategies compose (``check_loss_compositions``), a weight placed in
        the ratio has a per-token ratio to scale, every needed generation input is registered; then the strategies'
        own checks (``check_params`` of every registered one, ``check_config`` of each selected one), the one check
        that no selected strategy is inert with these parameters (``Strategy.inert``: the CLI and the Python API both
        build this config, so both refuse it), a warning for a strategy parameter that none of the selected strategies
        reads, and that the per-token telemetry asked for is delivered (``check_telemetry_request``)."""
        try:
            classes = [STRATEGIES.get(name) for name in args.strategies]
        except ValueError as error:  # an unknown name or a dotted path that does not import
            raise ConfigError(f"strategies={args.strategies}: {error}") from None
        kinds = [getattr(cls, "kind", None) for cls in classes]
        for name, kind in zip(args.strategies, kinds, strict=True):
            if kind not in KINDS:
                raise ValueError(f"Strategy {name!r} has kind {kind!r}; expected 'weight', 'advantage' or 'loss'.")
        if kinds.count("weight") > 1:
            raise ValueError(f"At most one token-weight strategy may be active; got {args.strategies}.")
        check_loss_compositions(args.strategies, classes)
        if args.weight_placement == "ratio" and "weight" in kinds and args.loss_type not in RATIO_PLACEMENT_LOSS_TYPES:
            raise ConfigError(
                f"weight_placement=ratio: not defined for loss_type={args.loss_type} (its surrogate weights whole "
                "sequences by the sequence's importance ratio, with no per-token ratio for the token weight to "
                "scale); set weight_placement: loss or another loss_type."
            )
        for name, cls in zip(args.strategies, classes, strict=True):
            if getattr(cls, "folds_into_loss", False) and cls.loss_factor_metric not in cls.metrics:
                raise ConfigError(f"strategies: {name} logs {cls.loss_factor_metric!r} in the loss but does not "
                                  "declare it in its `metrics`.")
            for needed in getattr(cls, "needs_inputs", ()):
                if needed not in GENERATION_INPUTS:
                    raise ConfigError(
                        f"strategies: {name} needs the generation input {needed!r}, which is not registered "
                        f"(registered: {', '.join(GENERATION_INPUTS.names()) or 'none'}; "
                        "sharpgrpo.training.generation.inputs.register_generation_input)."
                    )
        for name in STRATEGIES.names():
            STRATEGIES.get(name).check_params(args)
        for cls in classes:
            cls.check_config(args)
        check_strategies_act(args.strategies, classes, args)
        warn_fields_that_do_nothing(args, classes)
        check_telemetry_request(args)


def check_strategies_act(names: Sequence[str], classes: Sequence[type], args: Any) -> None:
    """Refuse a strategy whose parameters make it inert: each strategy may declare ``inert(args) -> reason | None``
    (``Strategy.inert``, e.g. ``ktae_scale: 0``), and this one check asks every selected strategy, so a run never
    trains a method that does nothing while its name says otherwise."""
    for name, cls in zip(names, classes, strict=True):
        declare = getattr(cls, "inert", None)
        reason = declare(args) if callable(declare) else None
        if reason:
            raise ConfigError(
                f"strategies={list(names)}: {name} would do nothing here ({reason}); change its parameters, or train "
                "without it (`equal` is plain GRPO)."
            )


def check_telemetry_request(args: Any) -> None:
    """Per-token telemetry asked for is delivered (docs/telemetry.md): ``telemetry_steps`` without
    ``token_telemetry`` writes nothing, and a telemetry interval longer than ``max_steps`` (without
    ``logging_first_step``) makes no step a telemetry step; both are refused naming the fields. With ``max_steps:
    -1`` the number of steps is known only when training starts and is not checked here."""
    from sharpgrpo.training.telemetry.recorder import telemetry_interval

    if not args.token_telemetry:
        if args.telemetry_steps:
            raise ConfigError(
                f"telemetry_steps={args.telemetry_steps} with token_telemetry=false: no telemetry is written; set "
                "token_telemetry: true, or remove telemetry_steps."
            )
        return
    interval = telemetry_interval(args)
    if 0 < args.max_steps < interval and not args.logging_first_step:
        field = (f"telemetry_steps={args.telemetry_steps}" if args.telemetry_steps else
                 f"logging_steps={args.logging_steps:g} (telemetry_steps: 0 takes the logging interval)")
        raise ConfigError(
            f"token_telemetry=true with {field} and max_steps={args.max_steps}: no step is a telemetry step, so no "
            "telemetry file would be written; set telemetry_steps <= max_steps (or logging_first_step: true for "
            "step 1)."
        )


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
