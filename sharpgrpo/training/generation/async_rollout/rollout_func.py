"""Which ``rollout_func`` asynchronous generation plugs into TRL: the rollout process (``client.AsyncRollouts``) or a
vLLM server asked by a thread (``server.ServerAsyncRollouts``)."""

from __future__ import annotations

import os
from typing import Any

from sharpgrpo.training.generation.async_rollout.client import AsyncRollouts
from sharpgrpo.training.generation.async_rollout.server import ServerAsyncRollouts


def async_rollout_kwargs(args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The trainer's keyword arguments with ``rollout_func`` set to a new ``AsyncRollouts`` (``client.py``; with
    ``use_vllm``, ``ServerAsyncRollouts``, ``server.py``) when ``args.async_generation`` is on (a ``rollout_func``
    of the caller's own is refused: one generation path)."""
    if not getattr(args, "async_generation", False):
        return kwargs
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # the rollout_func is sharpgrpo's, not the user's
    if kwargs.get("rollout_func") is not None:
        raise ValueError("async_generation: generation runs in sharpgrpo's rollout process, so a rollout_func of your "
                         "own cannot be used with it; drop one of them.")
    if kwargs.get("tools") or kwargs.get("environment_factory") is not None:
        raise ValueError("async_generation with tools or an environment_factory: the rollout process generates single "
                         "turns; multi-turn rollouts run synchronously.")
    if args.use_vllm:  # a vLLM server generates (the config refuses colocate)
        return {**kwargs, "rollout_func": ServerAsyncRollouts(args.max_staleness)}
    return {**kwargs, "rollout_func": AsyncRollouts(args.max_staleness)}
