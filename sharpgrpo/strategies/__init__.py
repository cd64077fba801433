"""Token-level strategies, registered by name (see ``base`` for the two kinds)."""

from sharpgrpo.strategies.base import (
    STRATEGIES,
    AdvantageStrategy,
    GenerationBatch,
    TokenWeightStrategy,
    register_strategy,
)
from sharpgrpo.strategies import probability_shaping  # noqa: F401  (registers grpo_sg, equal, random, reverse, ar)

for _module in ("covariance", "thr", "passk"):  # registered as they land; each is optional during development
    try:
        __import__(f"sharpgrpo.strategies.{_module}")
    except ModuleNotFoundError as _error:
        if _error.name != f"sharpgrpo.strategies.{_module}":
            raise

__all__ = ["STRATEGIES", "AdvantageStrategy", "GenerationBatch", "TokenWeightStrategy", "register_strategy"]
