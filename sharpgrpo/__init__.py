"""sharpgrpo: token-level GRPO strategies (GRPO-SG, CW-GRPO, THR, ...) as a drop-in extension of TRL.

The trainer and config load lazily, so light modules (``sharpgrpo.registry``, ``sharpgrpo.data``, the reward
functions) import without torch or TRL.
"""

import warnings as _warnings
from typing import TYPE_CHECKING

# transformers 5 renamed gradient_checkpointing* to activation_checkpointing*; TRL 1.16's GRPOConfig default and its
# trainer still use the old names, so every run and every Python session warned three times, with transformers'
# source lines, about settings the user never wrote (the command line filtered it already; now the library does).
_warnings.filterwarnings("ignore", message=r"`\w*gradient_checkpointing\w*` is deprecated", category=FutureWarning)

__version__ = "0.1.0"
__all__ = ["STRATEGIES", "SharpGRPOConfig", "SharpGRPOTrainer", "register_strategy", "__version__"]

_LAZY = {
    "SharpGRPOConfig": "sharpgrpo.config",
    "SharpGRPOTrainer": "sharpgrpo.trainer",
    "STRATEGIES": "sharpgrpo.strategies",
    "register_strategy": "sharpgrpo.strategies",
}

if TYPE_CHECKING:
    from sharpgrpo.config import SharpGRPOConfig
    from sharpgrpo.strategies import STRATEGIES, register_strategy
    from sharpgrpo.trainer import SharpGRPOTrainer


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sharpgrpo' has no attribute {name!r}")
