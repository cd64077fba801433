"""Settings that plug into the package by registration, such as the agentic search setting (``sharpgrpo.search``).

A setting is a module whose import registers what it brings into the package's registries: data sets
(``sharpgrpo.data.register_dataset``), evaluation tasks (``sharpgrpo.evaluation.EVAL_TASKS``; an ``EvalTask`` may
declare options of its own (``arguments``: a dataclass ``sharpgrpo eval`` parses as flags, e.g. the setting's training
arguments), choose the evaluator's backend, complete the configuration and wrap the generator, e.g. into multi-turn
episodes, through its hooks ``backend``, ``prepare_config`` and ``wrap_generator``), training options and their rollout
(``register_training_setting``), prepared models
(``sharpgrpo.models.prepared.register_prepared_model``) and reward functions (``reward_fns.register_reward``). The
trainer takes a multi-turn rollout as TRL's ``rollout_func``. The modules in ``SETTING_MODULES`` (search and the offline tasks) are
imported on the first lookup in the data set, reward function, evaluation task or prepared model registry; ``add_setting("my_package.my_setting")``
adds another, so that neither the trainer nor the evaluation runner changes for it.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

SETTING_MODULES: list[str] = ["sharpgrpo.search.setting", "sharpgrpo.tasks.setting"]
_imported: set[str] = set()
# Training hooks of settings: (arguments dataclass parsed by train.py, rollout context). The context is called with
# the parsed arguments and the run's output_dir; it yields a TRL ``rollout_func``, or None when the setting is off.
_TRAINING: list[tuple[type, Callable[..., Any]]] = []
_ROLLOUT_REWARD_FIELDS: set[str] = set()  # per-completion fields a setting's rollout passes to reward functions


def register_training_setting(arguments: type, rollout_context: Callable[..., Any],
                              reward_fields: tuple[str, ...] = ()) -> None:
    """Add a setting's options to ``train.py`` (a dataclass whose fields become YAML keys and flags) and the context
    manager that turns them into the run's ``rollout_func`` (and keeps e.g. a retrieval server up while it runs).
    ``reward_fields``: the per-completion fields its rollout returns beside the completions, which TRL passes to the
    reward functions (e.g. the search episode's ``search_turns``); the dataset check does not look for them."""
    if all(arguments is not registered for registered, _ in _TRAINING):
        _TRAINING.append((arguments, rollout_context))
    _ROLLOUT_REWARD_FIELDS.update(reward_fields)


def rollout_reward_fields() -> frozenset[str]:
    """Every field a registered setting's rollout passes to reward functions (:func:`register_training_setting`)."""
    load_settings()
    return frozenset(_ROLLOUT_REWARD_FIELDS)


def training_setting_arguments() -> tuple[type, ...]:
    """The argument dataclasses of every setting with a training hook, in registration order."""
    load_settings()
    return tuple(arguments for arguments, _ in _TRAINING)


@contextlib.contextmanager
def training_rollout(setting_arguments, output_dir: str):
    """Enter the rollout context of each parsed setting's arguments; yield the one ``rollout_func`` that is on
    (None when none is; two at once are refused)."""
    load_settings()
    contexts = {arguments: context for arguments, context in _TRAINING}
    with contextlib.ExitStack() as stack:
        rollouts = []
        for parsed in setting_arguments:
            rollout = stack.enter_context(contexts[type(parsed)](parsed, output_dir))
            if rollout is not None:
                rollouts.append((type(parsed).__name__, rollout))
        if len(rollouts) > 1:
            raise ValueError(f"Two settings want to run the rollout: {', '.join(n for n, _ in rollouts)}.")
        yield rollouts[0][1] if rollouts else None


def add_setting(module: str) -> None:
    """Register the setting module ``module`` (imported with the others on the next registry lookup)."""
    if module not in SETTING_MODULES:
        SETTING_MODULES.append(module)


def load_settings() -> None:
    """Import every setting module not imported yet (each once, also when a lookup happens during an import)."""
    for module in list(SETTING_MODULES):  # noqa: PERF101 (a setting may add another while it is imported)
        if module not in _imported:
            _imported.add(module)
            importlib.import_module(module)
