"""sharpgrpo: token-level GRPO strategies (GRPO-SG, CW-GRPO, THR, ...) as a drop-in extension of TRL."""

from sharpgrpo.config import SharpGRPOConfig
from sharpgrpo.strategies import STRATEGIES, register_strategy
from sharpgrpo.trainer import SharpGRPOTrainer

__version__ = "0.1.0"
__all__ = ["STRATEGIES", "SharpGRPOConfig", "SharpGRPOTrainer", "register_strategy", "__version__"]
