"""Token-level strategies, registered by name (see ``base`` for the kinds: weight, advantage, loss). Every public
module of the package is imported here, which registers its strategies."""

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



def _import_strategy_modules() -> None:
    """Import every public module of this package: importing a module registers its strategies, so a new method is
    its module alone (no list of imports to keep). Private modules (``_name``: kernels, optional backends) are
    imported by the modules that use them."""
    import importlib
    import pkgutil

    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_import_strategy_modules()

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
