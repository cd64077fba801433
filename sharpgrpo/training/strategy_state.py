"""Strategy state in checkpoints: what strategies need to continue exactly after a resume (e.g. the `random`
weight generator) and the generation count, one file per process beside transformers' ``rng_state_{i}.pth``."""

from __future__ import annotations

import os
import warnings

import torch

STRATEGY_STATE_NAME = "sharpgrpo_strategy_state.pt"


def strategy_state_path(checkpoint: str, world_size: int, process_index: int) -> str:
    """``sharpgrpo_strategy_state.pt``, or one ``sharpgrpo_strategy_state_{process}.pt`` per process (like
    transformers' ``rng_state_{process}.pth``): each process advances its own state, e.g. the `random` generator
    draws for that process's micro-batches only."""
    if world_size <= 1:
        return os.path.join(checkpoint, STRATEGY_STATE_NAME)
    return os.path.join(checkpoint, f"sharpgrpo_strategy_state_{process_index}.pt")


def save_strategy_state(path: str, strategies, generation_count: int) -> None:
    """Save ``strategies.state_dict()`` (a ``StrategySet``'s: one entry per strategy class) and the generation
    count."""
    torch.save({"strategies": strategies.state_dict(), "generation_count": generation_count}, path)


def load_strategy_state(path: str, strategies) -> int | None:
    """Load the state saved at ``path`` (or, when the checkpoint was saved by another number of processes, process
    0's, with a warning) into ``strategies`` (a ``StrategySet``); return the saved generation count (None when
    nothing was saved)."""
    if not os.path.exists(path):  # resumed with another number of processes: reuse process 0's state
        checkpoint = os.path.dirname(path)
        candidates = [os.path.join(checkpoint, n) for n in (STRATEGY_STATE_NAME, "sharpgrpo_strategy_state_0.pt")]
        found = [c for c in candidates if os.path.exists(c)]
        if not found:
            return None
        warnings.warn(
            f"{os.path.basename(path)} is not in {checkpoint}; loading {os.path.basename(found[0])} instead "
            "(the checkpoint was saved by another number of processes): strategy state such as the `random` "
            "weight generator will not continue exactly.",
            stacklevel=3,
        )
        path = found[0]
    try:  # weights_only: never unpickle code from a checkpoint (tensors, numbers, strings, lists, dicts only)
        state = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - damaged file or a refused type: reported with the path
        raise ValueError(
            f"Cannot load the strategy state {path}: {type(error).__name__}: {str(error).splitlines()[0]}. "
            "It is damaged, or a strategy's state_dict() holds objects other than tensors, numbers, strings, "
            "lists and dicts (refused: loading them would run code)."
        ) from None
    generation_count = None
    if "strategies" in state:
        generation_count = state.get("generation_count")
        state = state["strategies"]
    strategies.load_state_dict(state)
    return None if generation_count is None else int(generation_count)
