"""Processes agree on a failure, so that they stop together and can save the last good state together.

With several processes, an error on one of them (a reward function that raises on its rows, a reward check that
fails there) leaves the others waiting in the next collective (TRL gathers the rewards right after computing them)
until the launcher kills them: no process can save, the healthy ones die by SIGTERM. Here a reward function's error
on a process is caught and recorded instead (its rows get no reward: ``None``, which TRL turns into NaN), the
process joins the gather as usual, and right after it every process takes part in ONE all-reduce of an error flag
(per generation batch, i.e. per step with the default ``steps_per_generation``). If any process failed, every
process raises the same :class:`ProcessFailure`, naming the process and its error, at the same point of the step,
so that all of them can save a checkpoint of the last finished step together
(``sharpgrpo.run.lifecycle.stop_after_error``). With one process nothing is caught: the error is raised as is.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


class ProcessFailure(RuntimeError):
    """An error on one process that every process raises together (``everywhere``)."""

    everywhere = True
    names_itself = True


class RankFailures:
    """Errors caught on this process between two agreements (the first one is kept)."""

    def __init__(self):
        self.active = False  # set once the trainer knows it runs on several processes
        self.error: BaseException | None = None
        self.where = ""

    def wrap(self, reward_funcs: Any) -> Any:
        """``reward_funcs`` with every callable wrapped: while ``active``, an exception is recorded and the rows get
        a placeholder 0 (discarded: :meth:`agree` raises right after the gather) instead of the exception leaving
        this process out of the next collective."""
        if reward_funcs is None:
            return None
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        wrapped = [self._wrap_one(fn) for fn in funcs]
        return wrapped if isinstance(reward_funcs, (list, tuple)) else wrapped[0]

    def _wrap_one(self, fn):
        if isinstance(fn, str) or not callable(fn) or hasattr(fn, "parameters"):
            return fn  # a Hub id or a reward model: no user code runs per process
        name = getattr(fn, "__name__", type(fn).__name__)
        failures = self

        def no_reward(kwargs, error):
            failures.record(error, f"reward function {name!r}")
            return [0.0] * len(kwargs["completions"])

        if inspect.iscoroutinefunction(fn):

            async def guarded(*args, **kwargs):
                if not failures.active:
                    return await fn(*args, **kwargs)
                try:
                    return await fn(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - recorded, raised on every process by agree()
                    return no_reward(kwargs, error)

        else:

            def guarded(*args, **kwargs):
                if not failures.active:
                    return fn(*args, **kwargs)
                try:
                    return fn(*args, **kwargs)
                except Exception as error:  # noqa: BLE001 - recorded, raised on every process by agree()
                    return no_reward(kwargs, error)

        # name, and attributes such as `__checked_reward__` or a registered answer check, as the wrapped function's
        functools.update_wrapper(guarded, fn, assigned=("__module__", "__name__", "__qualname__", "__doc__"))
        return guarded

    def record(self, error: BaseException, where: str) -> None:
        if self.error is None:
            self.error, self.where = error, where

    def agree(self, accelerator) -> None:
        """One all-reduce of this process's error flag; if any process failed, raise :class:`ProcessFailure` on
        every process, naming the first failing process and its error. Every process must call it together."""
        if not self.active:
            return
        flag = torch.tensor([0 if self.error is None else 1], device=accelerator.device)
        if int(accelerator.reduce(flag, reduction="sum").item()) == 0:
            return
        from accelerate.utils import gather_object

        mine = "" if self.error is None else (
            f"{self.where} raised {type(self.error).__name__}: {' '.join(str(self.error).split())}"
        )
        messages = gather_object([mine])
        self.error, self.where = None, ""
        failed = [(rank, message) for rank, message in enumerate(messages) if message]
        rank, message = failed[0]
        others = f" (and on processes {[r for r, _ in failed[1:]]})" if len(failed) > 1 else ""
        raise ProcessFailure(f"on process {rank} of {len(messages)}, {message}{others}")
