"""``train.py``'s checks of its inputs before a model loads: the model source, the reward functions (the names
resolve, each function's declared columns exist, one weight per function, no column a function reads is empty in
every row) and the dataset."""

from __future__ import annotations

from typing import Any, NamedTuple

from sharpgrpo.validation import ConfigError


class TrainingInputs(NamedTuple):
    model_name: str  # as the user gave it (a prepared name, a folder or a Hub id)
    reward_funcs: list
    train_dataset: Any  # None when it was not loaded (load_dataset=False)


def check_training_inputs(task, training_args, model_args, load_dataset: bool = True) -> TrainingInputs:
    """What ``train.py`` checks after parsing and before any model loads, in its order: the model folder (or prepared
    name, or Hub id), the reward functions, the dataset's name and arguments, then (``load_dataset``) the loaded
    dataset and the rewards against its columns. ``load_dataset=False`` stops before anything is downloaded."""
    from sharpgrpo.data.checks import check_dataset_source, load_checked_dataset
    from sharpgrpo.models.source import check_model_source

    model_name = model_args.model_name_or_path or "sharpgrpo-tiny"
    check_model_source(model_name, revision=model_args.model_revision)
    reward_funcs = resolve_reward_functions(task.reward_funcs)
    check_dataset_source(task.dataset_name, task.dataset_kwargs)
    if not load_dataset:
        return TrainingInputs(model_name, reward_funcs, None)
    train_dataset = load_checked_dataset(task.dataset_name, task.dataset_kwargs)
    check_rewards(task.reward_funcs, reward_funcs, train_dataset, task.dataset_name, training_args.reward_weights)
    return TrainingInputs(model_name, reward_funcs, train_dataset)


def resolve_reward_functions(names: list[str]) -> list:
    """The reward functions named in ``reward_funcs`` (registered names or dotted paths)."""
    from reward_fns import get_reward_function

    if isinstance(names, str) or not names:
        raise ConfigError(f"reward_funcs={names!r}: must be a non-empty list of reward function names.")
    try:
        return [get_reward_function(name) for name in names]
    except ValueError as error:
        raise ConfigError(f"reward_funcs={list(names)}: {error}") from None


def check_rewards(
    reward_names: list[str], reward_funcs: list, dataset, dataset_name: str, reward_weights=None
) -> None:
    """Each reward function's declared columns (``register_reward(columns=...)``) exist in the dataset, and
    ``reward_weights`` has one weight per function."""
    from reward_fns import reward_columns

    if reward_weights is not None and len(reward_weights) != len(reward_funcs):
        raise ConfigError(
            f"reward_weights={list(reward_weights)}: {len(reward_weights)} weight(s) for {len(reward_funcs)} reward "
            f"function(s) ({', '.join(reward_names)}); give one weight per function."
        )
    from sharpgrpo.data.row_checks import check_rows

    columns = list(dataset.column_names or [])
    read = {name: tuple(reward_columns(fn) or ()) for name, fn in zip(reward_names, reward_funcs, strict=True)}
    for name, fn in zip(reward_names, reward_funcs, strict=True):
        missing = [c for c in (reward_columns(fn) or ()) if c not in columns]
        if missing:
            raise ConfigError(
                f"reward_funcs={list(reward_names)}: {name!r} reads column(s) {', '.join(missing)} that "
                f"dataset_name={dataset_name!r} lacks (its columns: {', '.join(columns)}); rename one with "
                "dataset_kwargs column_mapping, or choose this data's reward."
            )
    check_rows(dataset, f"dataset_name={dataset_name!r}", read)  # every row's prompt; no reward column left empty
