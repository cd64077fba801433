"""Settings that plug into the package by registration, such as the agentic search setting (``sharpgrpo.search``).

A setting is a module whose import registers what it brings into the package's registries: data sets
(``sharpgrpo.data.register_dataset``), evaluation tasks (``sharpgrpo.evaluation.EVAL_TASKS``; an ``EvalTask`` may
choose the evaluator's backend, complete the configuration and wrap the generator, e.g. into multi-turn episodes, through
its hooks ``backend``, ``prepare_config`` and ``wrap_generator``), prepared models
(``sharpgrpo.prepared_models.register_prepared_model``) and reward functions (``reward_fns.register_reward``). The
trainer takes a multi-turn rollout as TRL's ``rollout_func``. The modules in ``SETTING_MODULES`` are imported on the
first lookup in the data set, evaluation task or prepared model registry; ``add_setting("my_package.my_setting")``
adds another, so that neither the trainer nor the evaluation runner changes for it.
"""

from __future__ import annotations

import importlib

SETTING_MODULES: list[str] = ["sharpgrpo.search.setting"]
_imported: set[str] = set()


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
