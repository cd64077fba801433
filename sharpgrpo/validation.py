"""One validation layer for configuration values: declarative per-field rules and one-line errors.

A rule says what values a field accepts (finite, a range with open or closed ends, an integer from some minimum, a
set of choices, None or special values); a table maps field names to rules, so adding a field's check is one line::

    RULES = {"sg_tau": positive(), "thr_p": between(-1, 1), "passk_k": integer(1), "cw_scope": one_of("group")}
    validate_fields(config, RULES)   # raises ConfigError("sg_tau=nan: must be a finite number > 0")

``SharpGRPOConfig.__post_init__`` checks its own table (``sharpgrpo.config.FIELD_RULES``) and TRL's
(:data:`TRL_FIELD_RULES`) before anything else, so a bad value fails before any model or dataset is loaded. Any
other options dataclass (e.g. a task's) calls ``validate_fields(self, ITS_RULES)`` in its own ``__post_init__``.
A dataset builder declares what its ``dataset_kwargs`` accept with ``@argument_rules(num_prompts=integer(1))``;
``train.py`` checks them (:func:`validate_arguments`) before the model loads.

What strategies and reward functions return during training is checked by ``sharpgrpo.training.output_checks``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from numbers import Integral, Real
from typing import Any


class ConfigError(ValueError):
    """A configuration or input value that is refused; the message is one line naming the field and the value."""

    names_itself = True  # printed as is, without the class name


@dataclass(frozen=True)
class Rule:
    """What one field accepts. Build rules with :func:`number`, :func:`positive`, :func:`non_negative`,
    :func:`between`, :func:`integer` and :func:`one_of` rather than directly."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    choices: tuple[Any, ...] | None = None
    allow_none: bool = False
    extra: tuple[Any, ...] = ()  # values accepted besides the range (e.g. max_steps -1)
    note: str = ""  # why, appended to the error
    text: bool = False  # a non-empty string (a name checked where its choices are known)
    limit: float | None = None  # |value| <= limit: the range of the tensor type the value meets (in_tensor_range)

    def describe(self) -> str:
        if self.text:
            text = "a non-empty name"
        elif self.choices is not None:
            text = "one of " + ", ".join(str(c) for c in self.choices)
        else:
            text = "an integer" if self.integer else "a finite number"
            if self.low is not None and self.high is not None:
                left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
                text += f" in {left}{_fmt(self.low)}, {_fmt(self.high)}{right}"
            elif self.low is not None:
                text += f" {'>' if self.low_open else '>='} {_fmt(self.low)}"
            elif self.high is not None:
                text += f" {'<' if self.high_open else '<='} {_fmt(self.high)}"
        alternatives = [repr(v) for v in self.extra] + (["None"] if self.allow_none else [])
        if alternatives:
            text += " (or " + " or ".join(alternatives) + ")"
        text += self._describe_limit()
        return text + (f"; {self.note}" if self.note else "")

    def _describe_limit(self) -> str:
        """How :attr:`limit` narrows the range, where the range's own ends do not already keep within it."""
        if self.limit is None or self.text or self.choices is not None:
            return ""
        kind = "int64" if self.integer else "float32"
        if self.low is None and self.high is None:
            return f"; at most {_fmt(self.limit)} in magnitude ({kind} range)"
        if self.high is None:
            return f"; at most {_fmt(self.limit)} ({kind} range)" if self.low < self.limit else ""
        if self.low is None:
            return f"; at least {_fmt(-self.limit)} ({kind} range)" if self.high > -self.limit else ""
        return ""

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.allow_none
        if self.text:
            return isinstance(value, str) and value.strip() != ""
        if self.choices is not None:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, Real):
            return False
        if self.integer and not isinstance(value, Integral):
            return False
        if value in self.extra:
            return True
        if self.limit is not None and not abs(value) <= self.limit:  # before float(): a huge int overflows it
            return False
        value = float(value)
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return True

    def check(self, name: str, value: Any) -> None:
        if not self.accepts(value):
            raise ConfigError(f"{name}={_fmt(value)}: must be {self.describe()}.")


def did_you_mean(name: Any, choices, cutoff: float = 0.6) -> str:
    """`` (did you mean X?)`` naming the closest of ``choices`` to a mistyped ``name``, or "" when none is close: the
    one hint every mistyped name gets (options, config keys, strategies, rewards, configs, columns)."""
    import difflib

    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]}?)" if close else ""


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def number(**kwargs) -> Rule:
    """Any finite number."""
    return Rule(**kwargs)


def positive(**kwargs) -> Rule:
    """A finite number > 0."""
    return Rule(low=0.0, low_open=True, **kwargs)


def non_negative(**kwargs) -> Rule:
    """A finite number >= 0."""
    return Rule(low=0.0, **kwargs)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False, **kwargs) -> Rule:
    """A finite number in [low, high] (an end is excluded with ``low_open``/``high_open``)."""
    return Rule(low=low, high=high, low_open=low_open, high_open=high_open, **kwargs)


def integer(minimum: int = 0, maximum: int | None = None, **kwargs) -> Rule:
    """An integer >= ``minimum`` (and <= ``maximum``)."""
    return Rule(low=minimum, high=maximum, integer=True, **kwargs)


def name(**kwargs) -> Rule:
    """A non-empty string (a name whose choices are checked where they are known)."""
    return Rule(text=True, **kwargs)


def one_of(*choices: Any, **kwargs) -> Rule:
    """One of the given values."""
    return Rule(choices=tuple(choices), **kwargs)


@dataclass(frozen=True)
class Renamed(Rule):
    """A field that was renamed: any value but None is refused with one line naming the new field."""

    new_name: str = ""

    def accepts(self, value: Any) -> bool:
        return value is None

    def check(self, name: str, value: Any) -> None:
        if value is not None:
            raise ConfigError(f"{name}={_fmt(value)}: {name} was renamed {self.new_name}; set {self.new_name} instead.")


def in_tensor_range(rule: Rule) -> Rule:
    """``rule`` with the magnitude limit of the tensors the value meets: a real number at most :data:`FLOAT32_SAFE`
    (it becomes a float32 or bf16 scalar beside the model's tensors, where 1e300 cannot be converted and overflows
    at the first step), an integer at most :data:`INT64_MAX` (seeds, sizes and counts become int64). Every field of
    ours is declared through it (``sharpgrpo.strategy_params.param``), so a value that passes the checks does not
    overflow later. Names, choices and rules with a limit of their own are returned as they are."""
    if type(rule) is not Rule or rule.text or rule.choices is not None or rule.limit is not None:
        return rule
    return replace(rule, limit=INT64_MAX if rule.integer else FLOAT32_SAFE)


def renamed(new_name: str) -> Rule:
    """The rule of an old field name kept only to say what it became."""
    return Renamed(new_name=new_name, allow_none=True)


def validate_fields(obj: Any, rules: Mapping[str, Rule]) -> None:
    """Check every field of ``obj`` named in ``rules`` (fields ``obj`` lacks are skipped); raise the first error."""
    for name, rule in rules.items():
        if hasattr(obj, name):
            rule.check(name, getattr(obj, name))


def argument_rules(**rules: Rule):
    """Decorator: what a function's keyword arguments accept when a config supplies them (a dataset builder's
    ``dataset_kwargs``), e.g. ``@argument_rules(num_prompts=integer(1))``; checked by :func:`validate_arguments`."""

    def decorator(fn):
        fn.argument_rules = dict(rules)
        return fn

    return decorator


def validate_arguments(fn: Any, kwargs: Mapping[str, Any], label: str) -> None:
    """Check ``kwargs`` against ``fn``'s :func:`argument_rules`; an error names ``label.key``, the value and the
    range."""
    for name, rule in getattr(fn, "argument_rules", {}).items():
        if name in kwargs:
            rule.check(f"{label}.{name}", kwargs[name])


# Clip ranges are applied to float32 (or bf16) ratios: a bound beyond float32's range (3.4e38) cannot be converted and
# fails at the first step; far below it a range already clips nothing. Every real-valued field of ours is held to it
# too (in_tensor_range), and every integer field to int64's range.
FLOAT32_SAFE = 1e30
INT64_MAX = 2**63 - 1
# The largest |reward * weight| of one reward function (reward_weights entries are held to it as well): TRL sums the
# weighted rewards in float32 and normalises them by their group's (or batch's) std, whose variance sums n squared
# deviations; with K functions each within REWARD_LIMIT a deviation is at most 2 K 1e9, so the sum stays finite in
# float32 (3.4e38) for any n K^2 < 8e19. A reward of 1e308 passes a finiteness check, becomes inf in float32, and
# trains nothing (zero or NaN advantages).
REWARD_LIMIT = 1e9
_REWARD_NOTE = "a reward times its weight must stay within +-1e9 (rewards are summed and normalised in float32)"
_CLIP_NOTE = "the ratio is clipped in float32, whose largest value is 3.4e38 (1e3 already clips nothing)"

# TRL / transformers fields whose bad values would otherwise surface only after the model loads (or never).
# Where a rule is stricter than TRL 1.16's config (which accepts any value of the field's type), the README's
# "Stricter than TRL" list says why; tests/test_validation.py keeps that list and these rules in step.
TRL_FIELD_RULES: dict[str, Rule] = {
    "learning_rate": non_negative(),
    "weight_decay": non_negative(),
    "max_grad_norm": number(allow_none=True, note="<= 0 disables clipping, as in transformers"),
    "num_train_epochs": non_negative(),
    "max_steps": integer(1, extra=(-1,), note="-1 trains for num_train_epochs"),
    "per_device_train_batch_size": integer(1),
    "gradient_accumulation_steps": integer(1),
    "seed": integer(0),
    "temperature": positive(),
    "top_p": between(0, 1, low_open=True),
    "top_k": integer(0, allow_none=True, note="0 disables top-k filtering"),
    "min_p": between(0, 1, allow_none=True),
    "repetition_penalty": positive(),
    "max_completion_length": integer(1),
    "num_generations": integer(2, note="GRPO compares completions within a group"),
    "num_generations_eval": integer(1, allow_none=True),
    "generation_batch_size": integer(1, allow_none=True),
    "steps_per_generation": integer(1, allow_none=True),
    "num_iterations": integer(1),
    "beta": non_negative(),
    "epsilon": between(0, FLOAT32_SAFE, note=_CLIP_NOTE),
    "epsilon_high": between(0, FLOAT32_SAFE, allow_none=True, note=_CLIP_NOTE),
    "delta": between(0, FLOAT32_SAFE, low_open=True, allow_none=True, note=_CLIP_NOTE),
    "save_steps": positive(note="a number of steps, or a fraction in (0, 1) of the run's steps; 0 never saves"),
    "logging_steps": positive(note="a number of steps, or a fraction in (0, 1) of the run's steps"),
    "top_entropy_quantile": between(0, 1),
    "off_policy_mask_threshold": non_negative(allow_none=True),
}


def validate_trl_fields(config: Any) -> None:
    """TRL's fields (:data:`TRL_FIELD_RULES`), with ``reward_weights`` checked element by element and ``report_to``
    by :func:`check_report_to`."""
    validate_fields(config, TRL_FIELD_RULES)
    check_report_to(getattr(config, "report_to", None))
    if getattr(config, "num_train_epochs", None) == 0 and getattr(config, "max_steps", None) == -1:
        raise ConfigError("num_train_epochs=0 with max_steps=-1: nothing to train; set max_steps or num_train_epochs.")
    weights = getattr(config, "reward_weights", None)
    if weights is not None:
        if isinstance(weights, (str, bytes)) or not hasattr(weights, "__iter__"):
            raise ConfigError(f"reward_weights={weights!r}: must be a list of finite numbers, one per reward.")
        for index, weight in enumerate(weights):
            between(-REWARD_LIMIT, REWARD_LIMIT, note=_REWARD_NOTE).check(f"reward_weights[{index}]", weight)


# The package to install for a ``report_to`` name whose package is named otherwise (the others: the name itself).
TRACKER_PACKAGES = {"azure_ml": "azureml-core", "flyte": "flytekit"}


def check_report_to(value: Any) -> None:
    """Each tracker ``report_to`` names (a name or a list, ``all`` and ``none`` as in transformers) is one
    transformers integrates and is installed: otherwise one line naming the package to install, before any model
    loads (transformers itself refuses a missing one only when the trainer is built)."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    names = [value] if isinstance(value, str) else list(value or [])
    available = get_available_reporting_integrations()
    for name in names:
        if name in ("all", "none", ""):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise ConfigError(f"report_to={name!r}: not a tracker transformers integrates"
                              f"{did_you_mean(name, list(INTEGRATION_TO_CALLBACK))}; the trackers: "
                              f"{', '.join(INTEGRATION_TO_CALLBACK)}, or none.")  # fmt: skip
        if name not in available:
            package = TRACKER_PACKAGES.get(name, name)
            raise ConfigError(f"report_to={name!r}: the {package} package is not installed; `pip install {package}`, "
                              "or report_to none.")  # fmt: skip


# --------------------------------------------------------------------------------------------------------------
# `strategies`: the forms YAML and the command line produce


def parse_strategy_names(value: Any) -> list[str]:
    """``strategies`` as a list of names, from every form the YAML or the command line gives.

    Accepts one name (``grpo_sg``), a list (``[grpo_sg, cw_grpo]`` in YAML), a comma-separated string
    (``--strategies grpo_sg,cw_grpo``; spaces also separate), a bracketed string
    (``--strategies '[grpo_sg, cw_grpo]'``) and what the shell makes of those (``['[grpo_sg,', 'cw_grpo]']``).
    Anything else (a number, a mapping) is refused with one line.
    """
    usage = "a strategy name, a list of names, or a comma-separated string such as grpo_sg,cw_grpo"
    if isinstance(value, str):
        parts = [value]
    elif isinstance(value, (list, tuple)):
        bad = [item for item in value if not isinstance(item, str)]
        if bad:
            raise ConfigError(f"strategies={value!r}: {bad[0]!r} is not a strategy name; must be {usage}.")
        parts = list(value)
    else:
        raise ConfigError(f"strategies={value!r}: must be {usage}.")
    text = ",".join(parts).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    names = [name.strip("'\"") for name in re.split(r"[,\s]+", text)]
    names = [name for name in names if name]
    if not names:
        raise ConfigError(
            f"strategies={value!r}: empty; give at least one strategy name (e.g. `equal` for plain GRPO)."
        )
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ConfigError(f"strategies={names}: {', '.join(twice)} listed twice; list each strategy once.")
    return names
