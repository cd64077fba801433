"""Fields that do nothing in a run, said once each, by what the fields and strategies declare: a strategy parameter
that no selected strategy reads (the strategies' ``params``) and a field of a feature that is off (the field's
``param(..., acts_when=ActsWhen(...))``). No list is kept here."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategy_params import StrategyParams


def warn_fields_that_do_nothing(args: Any, classes: Sequence[type], reward_names: Sequence[str] | None = None
                                ) -> None:
    """Say once, naming it, each field set away from its default that does nothing in this run, by what the fields
    and strategies declare (no list kept here): a strategy parameter that none of the selected strategies reads
    (their ``params``: ``thr_p: 0.1`` with ``strategies: grpo_sg``), and a field of a feature that is off (its
    ``param(..., acts_when=ActsWhen(...))``: ``kl_estimator: k1`` with ``beta: 0``, ``dynamic_sampling_*`` without
    ``dynamic_sampling``; with ``reward_names``, when the trainer has the reward functions, only the fields of a
    reward function, ``overlong_*`` without ``overlong_penalty``). A strategy that cannot act with these settings is
    refused instead (``Strategy.inert``)."""
    read = {name for cls in classes for name in getattr(cls, "params", ())}
    owners: dict[str, list[str]] = {}
    for name in STRATEGIES.names():
        for parameter in getattr(STRATEGIES.get(name), "params", ()):
            owners.setdefault(parameter, []).append(name)
    for f in fields(args):
        value = getattr(args, f.name)
        if value == f.default:
            continue
        acts_when = getattr(f, "acts_when", None)
        of_reward = acts_when is not None and acts_when.reward is not None
        if reward_names is not None:  # the reward functions' fields only
            if not of_reward or acts_when.reward in reward_names:
                continue
            why = f"acts only with {acts_when.feature}, which is not among them"
        elif f.name in owners and f.name not in read and f.name in STRATEGY_PARAM_NAMES:
            why = f"is not read by strategies={args.strategies}: it is a parameter of {', '.join(owners[f.name])}"
        elif acts_when is not None and not of_reward and not acts_when.test(args):
            why = f"acts only with {acts_when.feature}, which is off"
        else:
            continue
        warnings.warn(f"{f.name}={value!r} {why}; it has no effect in this run.", UserWarning, stacklevel=3)


STRATEGY_PARAM_NAMES = frozenset(f.name for f in fields(StrategyParams))
