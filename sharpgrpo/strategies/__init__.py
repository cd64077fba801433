"""Token-level strategies, registered by name (see ``base`` for the two kinds)."""

from sharpgrpo.strategies.base import (
    STRATEGIES,
    AdvantageStrategy,
    GenerationBatch,
    TokenWeightStrategy,
    register_strategy,
)

# Importing the modules registers their strategies.
from sharpgrpo.strategies import covariance, passk, probability_shaping, thr  # noqa: E402,F401  isort: skip
from sharpgrpo.strategies import archer, entropy_credit, ktae  # noqa: E402,F401  isort: skip

__all__ = ["STRATEGIES", "AdvantageStrategy", "GenerationBatch", "TokenWeightStrategy", "register_strategy"]
