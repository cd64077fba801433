"""What strategies and reward functions return during training, checked so that a wrong output stops the run with
the function's or strategy's name.

Token weights on every micro-batch (their :func:`bad_weight_count` is read with the weight metrics, so the check
costs no host synchronisation of its own), token advantages on every generation batch, and every reward function's
output on every batch (:func:`checked_reward_functions`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

from sharpgrpo.training.generation.dense_rewards import DenseRewardCollector, dense_rewards_read
from sharpgrpo.training.inert_fields import warn_fields_that_do_nothing
from sharpgrpo.validation import REWARD_LIMIT

# --------------------------------------------------------------------------------------------------------------
# Strategy outputs (checked by the trainer once per step)


def configured_name(strategy: Any, strategy_classes: Mapping[str, type]) -> str:
    """How the user named ``strategy`` in ``strategies`` (registered name or dotted path, each mapped to the class it
    resolves to), with its class."""
    cls = type(strategy)
    for name, configured in strategy_classes.items():
        if configured is cls:
            return f"{name!r} ({cls.__module__}.{cls.__qualname__})"
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_shape(what: str, label: str, value: Any, expected_shape) -> None:
    import torch

    if not isinstance(value, torch.Tensor):
        raise ValueError(f"Strategy {label} returned {what} of type {type(value).__name__}; expected a tensor.")
    if tuple(value.shape) != tuple(expected_shape):
        raise ValueError(
            f"Strategy {label} returned {what} of shape {tuple(value.shape)}; expected {tuple(expected_shape)} "
            "(one value per completion token)."
        )


def _check_values(what: str, label: str, value, mask, require_positive: bool, allow_zero: bool = False) -> None:
    import torch

    non_finite, non_positive = _invalid_values(value, mask, require_positive, allow_zero)
    any_non_finite, any_non_positive = torch.stack([non_finite.any(), non_positive.any()]).tolist()  # one read
    if any_non_finite:
        where = tuple(non_finite.nonzero()[0].tolist())
        raise ValueError(
            f"Strategy {label} returned {what} with {int(non_finite.sum())} non-finite value(s) (e.g. "
            f"{value[where].item()} at {where}); every value, padding included, must be finite."
        )
    if any_non_positive:
        where = tuple(non_positive.nonzero()[0].tolist())
        raise ValueError(
            f"Strategy {label} returned {what} with {int(non_positive.sum())} value(s) {'< 0' if allow_zero else '<= 0'} "
            f"on completion tokens (e.g. {value[where].item()} at {where}); token weights must be "
            f"{'>= 0' if allow_zero else '> 0'}."
        )


def _invalid_values(value, mask, require_positive: bool, allow_zero: bool = False):
    """Boolean tensors of the values a strategy must not return: non-finite (anywhere, padding included) and, with
    ``require_positive``, <= 0 on completion tokens (< 0 with ``allow_zero``)."""
    import torch

    non_finite = ~torch.isfinite(value)
    too_small = (value < 0) if allow_zero else (value <= 0)
    non_positive = (too_small & mask.bool()) if require_positive else torch.zeros_like(non_finite)
    return non_finite, non_positive


def bad_weight_count(weights, mask, allow_zero: bool = False):
    """Device scalar: how many token weights :func:`check_token_weights` would refuse. The trainer reads it with its
    weight metrics (no host synchronisation of its own) and calls :func:`check_token_weights`, which names the
    strategy and a bad value, when it is not 0. ``allow_zero``: the strategy's weights may be exactly 0
    (``TokenWeightStrategy.zero_weights``)."""
    non_finite, non_positive = _invalid_values(weights, mask, require_positive=True, allow_zero=allow_zero)
    return non_finite.sum() + non_positive.sum()


def check_token_weights(strategy: Any, strategy_classes: Mapping[str, type], weights: Any, logps, mask) -> None:
    """A weight strategy's output: a tensor shaped like ``logps``, finite, > 0 on completion tokens (>= 0 for a
    strategy whose weights may be exactly 0, ``TokenWeightStrategy.zero_weights``)."""
    label = configured_name(strategy, strategy_classes)
    _check_shape("token weights", label, weights, logps.shape)
    _check_values("token weights", label, weights, mask, require_positive=True,
                  allow_zero=getattr(strategy, "zero_weights", False))


class StrategyOutputChecker:
    """Checks strategy outputs for the trainer: the shape of token weights on every micro-batch (free; a (B, 1)
    output would broadcast silently) and their values through :func:`bad_weight_count`, read together with the
    weight metrics; advantages on every generation batch (once per generation). ``strategy_classes`` maps each
    configured name to its class, for the errors' labels."""

    def __init__(self, strategy_classes: Mapping[str, type]):
        self.strategy_classes = dict(strategy_classes)

    def count_bad_weights(self, strategy: Any, weights: Any, logps, mask) -> Any:
        """Refuses a wrongly shaped output now; returns :func:`bad_weight_count` of the values (a device scalar)."""
        if getattr(weights, "shape", None) != logps.shape:
            check_token_weights(strategy, self.strategy_classes, weights, logps, mask)
        return bad_weight_count(weights, mask, getattr(strategy, "zero_weights", False))

    def raise_for_weights(self, strategy: Any, weights: Any, logps, mask) -> None:
        """The error naming ``strategy`` for weights whose :func:`bad_weight_count` was not 0."""
        check_token_weights(strategy, self.strategy_classes, weights, logps, mask)

    def advantages(self, strategy: Any, output: Any, batch) -> None:
        check_token_advantages(strategy, self.strategy_classes, output, batch)
        self.metrics(strategy, output[1])

    def metrics(self, strategy: Any, metrics: Mapping[str, Any]) -> None:
        """The metrics a strategy returned are among those it declares (``Strategy.metrics``)."""
        check_declared_metrics(strategy, self.strategy_classes, metrics)


def check_declared_metrics(strategy: Any, strategy_classes: Mapping[str, type], metrics: Mapping[str, Any]) -> None:
    """Refuse, naming the strategy, a metric it logs without declaring it in ``metrics`` (so that the logged names
    are documented where the strategy is, and a typo does not start a new curve)."""
    declared = set(getattr(strategy, "metrics", ()))
    undeclared = sorted(name for name in metrics if name not in declared)
    if undeclared:
        raise ValueError(
            f"Strategy {configured_name(strategy, strategy_classes)} logged {', '.join(undeclared)}, which its "
            f"class does not declare; add {'them' if len(undeclared) > 1 else 'it'} to its `metrics` "
            f"(declared: {', '.join(sorted(declared)) or 'none'})."
        )


def check_token_advantages(strategy: Any, strategy_classes: Mapping[str, type], output: Any, batch) -> None:
    """An advantage strategy's output: ``(advantages, metrics)`` with advantages shaped like ``batch.advantages``
    and finite."""
    label = configured_name(strategy, strategy_classes)
    if not (isinstance(output, tuple) and len(output) == 2 and isinstance(output[1], Mapping)):
        raise ValueError(
            f"Strategy {label} returned {type(output).__name__}; `token_advantages` must return "
            "(advantages, metrics dict)."
        )
    _check_shape("token advantages", label, output[0], batch.advantages.shape)
    _check_values("token advantages", label, output[0], batch.completion_mask, require_positive=False)


# --------------------------------------------------------------------------------------------------------------
# Reward outputs: every batch, every reward function


class RewardOutputError(ValueError):
    """A reward function returned something other than one finite number (or None) per completion."""


def check_reward_output(name: str, output: Any, expected: int, one_of_several: bool, weight: float = 1.0) -> list:
    """``output`` of reward function ``name`` for ``expected`` completions, as a list, or the error naming the
    function and its first bad value: a list (or 1-d array) of ``expected`` finite numbers or None, each within
    +-``REWARD_LIMIT`` once multiplied by the function's ``weight`` (its ``reward_weights`` entry; TRL sums the
    weighted rewards in float32, where 1e308 is inf: ``sharpgrpo.validation.REWARD_LIMIT`` says why 1e9); None for
    every completion only when other reward functions score the batch (otherwise it has no training signal)."""
    if hasattr(output, "tolist") and not isinstance(output, (str, bytes)):
        output = output.tolist()  # a numpy array or tensor
    if not isinstance(output, (list, tuple)):
        raise RewardOutputError(
            f"Reward function {name!r} returned a {type(output).__name__}; it must return a list with one reward "
            f"(a finite number, or None) per completion ({expected})."
        )
    if len(output) != expected:
        raise RewardOutputError(
            f"Reward function {name!r} returned {len(output)} rewards for {expected} completions; it must return "
            "one per completion."
        )
    values = list(output)
    for index, value in enumerate(values):
        if value is None:
            continue
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = values[index] = value.item()  # a 0-d tensor or numpy scalar
        if not isinstance(value, Real) or not _finite(value):
            raise RewardOutputError(
                f"Reward function {name!r} returned {value!r} for completion {index} of {expected}; a reward must be "
                "a finite number, or None for a completion the function does not score."
            )
        if abs(float(value) * weight) > REWARD_LIMIT:  # float(): finite, so an int converts
            weighted = "" if weight == 1 else (f" (times its reward_weights entry {weight:g}: "
                                               f"{float(value) * weight:g})")
            raise RewardOutputError(
                f"Reward function {name!r} returned {value!r} for completion {index} of {expected}{weighted}; a "
                f"reward times its weight must be within +-{REWARD_LIMIT:g}: TRL sums and normalises rewards in "
                "float32, where larger values overflow and train nothing."
            )
    if not one_of_several and expected and all(value is None for value in values):
        raise RewardOutputError(
            f"Reward function {name!r} returned None for all {expected} completions of the batch; with no other "
            "reward function there is no training signal (None means the function does not score a completion)."
        )
    return values


def _finite(value: Real) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float's range
        return False


def checked_reward_functions(reward_funcs: Any, args: Any = None) -> Any:
    """``reward_funcs`` as ``GRPOTrainer`` takes them, each callable wrapped so that its output is checked by
    :func:`check_reward_output` on every batch (same name, attributes and sync/async kind; reward models and Hub
    ids are left as they are). With ``args``, a reward with settings of its own (``overlong_penalty``) is first bound
    to the config (``reward_fns.configured_rewards``), and each function's rewards times its own ``reward_weights``
    entry are held to +-``REWARD_LIMIT``."""
    import functools

    from trl.trainer.utils import get_callable_name, is_async_callable

    if args is not None:
        from reward_fns import configured_rewards

        reward_funcs = configured_rewards(reward_funcs, args)

    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if args is not None:  # a field of a reward function not among these (overlong_* without overlong_penalty)
        warn_fields_that_do_nothing(args, (), [get_callable_name(f) for f in funcs if callable(f)])
    several = len(funcs) > 1
    dense_allowed = args is not None and dense_rewards_read(args)
    weights = list(getattr(args, "reward_weights", None) or [1.0] * len(funcs))
    weights = weights if len(weights) == len(funcs) else [1.0] * len(funcs)  # a wrong count: TRL refuses it

    def wrap(fn, weight: float = 1.0):
        if isinstance(fn, str) or not callable(fn) or hasattr(fn, "parameters") or hasattr(fn, "__checked_reward__"):
            return fn  # a Hub id, a reward model (nn.Module), or wrapped already
        name = get_callable_name(fn)
        dense = DenseRewardCollector(name, dense_allowed)  # per-token / per-turn rewards -> their sums (dense_rewards)

        if is_async_callable(fn):

            async def checked(*args, **kwargs):
                output = dense.convert(await fn(*args, **kwargs), kwargs.get("completion_ids"))
                return check_reward_output(name, output, len(kwargs["completions"]), several, weight)

        else:

            def checked(*args, **kwargs):
                output = dense.convert(fn(*args, **kwargs), kwargs.get("completion_ids"))
                return check_reward_output(name, output, len(kwargs["completions"]), several, weight)

        functools.update_wrapper(checked, fn, assigned=("__module__", "__qualname__", "__doc__"))
        checked.__name__ = name
        checked.__checked_reward__ = True
        checked.__dense_rewards__ = dense
        return checked

    if reward_funcs is None:
        return None
    if isinstance(reward_funcs, (list, tuple)):
        return [wrap(fn, float(weight)) for fn, weight in zip(funcs, weights, strict=True)]
    return wrap(reward_funcs, float(weights[0]))
