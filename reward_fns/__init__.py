"""Reward functions with TRL's signature ``f(prompts, completions, **columns) -> list[float | None]``.

Registered names (docs/methods.md §5): ``kk`` (Logic-RL Knights & Knaves reward), ``math`` (binary math-verify reward),
``qa_em`` (Search-R1 exact match), ``think_format`` (CW-GRPO's ``<think>`` format reward), ``search_format``
(Search-R1's multi-turn think/search/answer format), ``addition`` (the last number of
the reply equals a + b), ``overlong_penalty`` (DAPO's soft overlong punishment, docs/methods.md §15.4).
``get_reward_function`` also imports a dotted path (``my_package.my_module.my_reward``) so users can plug their
own. Every function accepts string or chat-message completions, reads its gold column from the keyword arguments TRL
passes, and never raises on model output. This package does not import torch.
"""

from __future__ import annotations

from sharpgrpo.registry import Registry
from sharpgrpo.settings import load_settings

REWARD_FUNCTIONS = Registry("reward function", load=load_settings)  # settings add theirs (sharpgrpo.settings)


def register_reward(name: str, *, columns: tuple[str, ...] = (), answer_check=None, configure=None):
    """Decorator: register a reward function by ``name`` and attach what trainer code may ask of it.

    Args:
        columns: the dataset columns the function reads from its keyword arguments (checked against a dataset
            before the model loads); read back with :func:`reward_columns`.
        answer_check: the task's answer check, a callable with the reward's signature returning one
            ``bool | None`` per completion (None: the row is not this task's), independent of format terms;
            read back with :func:`answer_check`. It defines "correct" for THR's positive set and pass@k.
        configure: for a reward with settings of its own (``overlong_penalty``), ``configure(args)`` returns the
            function bound to the training config's fields; applied by :func:`configured_reward`.
    """

    def decorator(fn):
        fn.reward_columns = tuple(columns)
        fn.answer_check = answer_check
        if configure is not None:
            fn.configure = configure
        return REWARD_FUNCTIONS.register(name)(fn)

    return decorator


def reward_columns(fn) -> tuple[str, ...] | None:
    """The dataset columns a reward function declared (``register_reward(columns=...)``), or None if undeclared."""
    columns = getattr(fn, "reward_columns", None)
    return None if columns is None else tuple(columns)


def answer_check(fn):
    """The answer check a reward function declared (``register_reward(answer_check=...)``), or None."""
    return getattr(fn, "answer_check", None)


def configured_reward(fn, args):
    """``fn`` bound to the training config ``args`` when it declared ``configure`` (``register_reward``), else
    ``fn``."""
    configure = getattr(fn, "configure", None)
    return fn if configure is None else configure(args)


def configured_rewards(reward_funcs, args):
    """``reward_funcs`` as ``GRPOTrainer`` takes them (one or a list), each bound by :func:`configured_reward`."""
    if isinstance(reward_funcs, (list, tuple)):
        return [configured_reward(fn, args) for fn in reward_funcs]
    return None if reward_funcs is None else configured_reward(reward_funcs, args)


def get_reward_function(name_or_path: str):
    """A registered reward function by name, or any callable by dotted import path."""
    return REWARD_FUNCTIONS.get(name_or_path)


# Importing the submodules registers their functions (they need register_reward, defined above).
from reward_fns.addition import addition_correct, addition_reward  # noqa: E402
from reward_fns.format import search_format_reward, think_format_reward  # noqa: E402
from reward_fns.kk import kk_correct, kk_reward  # noqa: E402
from reward_fns.math import math_correct, math_reward  # noqa: E402
from reward_fns.overlong import overlong_penalty, overlong_penalty_reward  # noqa: E402
from reward_fns.qa import qa_em_reward  # noqa: E402

__all__ = [
    "REWARD_FUNCTIONS",
    "addition_correct",
    "addition_reward",
    "answer_check",
    "reward_columns",
    "get_reward_function",
    "kk_correct",
    "kk_reward",
    "math_correct",
    "math_reward",
    "configured_reward",
    "configured_rewards",
    "overlong_penalty",
    "overlong_penalty_reward",
    "qa_em_reward",
    "register_reward",
    "search_format_reward",
    "think_format_reward",
]
