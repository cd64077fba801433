"""Token-level strategies, registered by name (see ``base`` for the three kinds: weight, advantage, loss)."""

from sharpgrpo.strategies.base import (
    STRATEGIES,
    AdvantageStrategy,
    GenerationBatch,
    LossContext,
    LossTerms,
    TokenLossStrategy,
    TokenWeightStrategy,
    register_strategy,
)

# Importing the modules registers their strategies.
from sharpgrpo.strategies import covariance, passk, probability_shaping, thr  # noqa: E402,F401  isort: skip
from sharpgrpo.strategies import entropy_covariance, geometric_mean, trust_region  # noqa: E402,F401  isort: skip

__all__ = ["STRATEGIES", "AdvantageStrategy", "GenerationBatch", "LossContext", "LossTerms", "TokenLossStrategy",
           "TokenWeightStrategy", "register_strategy"]
