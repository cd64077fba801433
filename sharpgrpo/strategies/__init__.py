"""Token-level strategies, registered by name (see ``base`` for the kinds: weight, advantage, loss)."""

from sharpgrpo.strategies.base import (
    STRATEGIES,
    AdvantageStrategy,
    GenerationBatch,
    LossContext,
    LossTerms,
    Strategy,
    StrategyPaper,
    TokenLossStrategy,
    TokenWeightStrategy,
    group_slices,
    register_strategy,
)

# Importing the modules registers their strategies.
from sharpgrpo.strategies import covariance, passk, probability_shaping, thr  # noqa: E402,F401  isort: skip
from sharpgrpo.strategies import entropy_covariance, geometric_mean, trust_region  # noqa: E402,F401  isort: skip
from sharpgrpo.strategies import archer, entropy_credit, ktae  # noqa: E402,F401  isort: skip
from sharpgrpo.strategies import baselines  # noqa: E402,F401  isort: skip

__all__ = [
    "STRATEGIES", "AdvantageStrategy", "GenerationBatch", "LossContext", "LossTerms", "Strategy", "StrategyPaper",
    "TokenLossStrategy", "TokenWeightStrategy", "group_slices", "register_strategy", "strategy_names_help",
]


def strategy_names_help() -> str:
    """The registered strategies by kind, for help texts: "Weight strategies: `grpo_sg`, .... Advantage ..."."""
    kinds: dict[str, list[str]] = {}
    for name in STRATEGIES.names():
        kinds.setdefault(STRATEGIES.get(name).kind, []).append(f"`{name}`")
    return " ".join(f"{kind.capitalize()} strategies: {', '.join(names)}." for kind, names in kinds.items())
