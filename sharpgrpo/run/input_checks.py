"""``train.py``'s checks of its inputs before a model loads (and before its output_dir is touched): the model source
(a name must be given), the reward functions (each entry a name or dotted path that resolves to a callable, each
function's columns, declared or read from its signature, exist, one weight per function, no column a function reads
is empty in every row), and the dataset (at least one batch of prompts)."""

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

    model_name = checked_model_name(model_args.model_name_or_path)
    check_model_source(model_name, revision=model_args.model_revision)
    reward_funcs = resolve_reward_functions(task.reward_funcs)
    check_dataset_source(task.dataset_name, task.dataset_kwargs)
    if not load_dataset:
        return TrainingInputs(model_name, reward_funcs, None)
    train_dataset = load_checked_dataset(task.dataset_name, task.dataset_kwargs)
    check_rewards(task.reward_funcs, reward_funcs, train_dataset, task.dataset_name, training_args.reward_weights)
    check_enough_prompts(train_dataset, task.dataset_name, training_args)
    return TrainingInputs(model_name, reward_funcs, train_dataset)


def checked_model_name(value: Any) -> str:
    """``model_name_or_path`` as given; an empty or null one is refused (it used to train the built-in toy model)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ConfigError(
            f"model_name_or_path={value!r}: no model given; name a model folder, a prepared name (sharpgrpo-tiny, "
            "sharpgrpo-smol) or a Hugging Face Hub id."
        )
    return str(value)


def check_enough_prompts(dataset, dataset_name: str, args) -> None:
    """At least one generation batch of prompts: TRL samples ``generation_batch_size / num_generations`` distinct
    prompts per batch and drops an incomplete one, so fewer prompts train 0 steps."""
    generation_batch = getattr(args, "generation_batch_size", None) or (
        args.per_device_train_batch_size * max(1, int(getattr(args, "world_size", 1) or 1))
    )
    needed = max(1, int(generation_batch) // int(args.num_generations))
    if len(dataset) < needed:
        raise ConfigError(
            f"dataset_name={dataset_name!r}: {len(dataset)} prompt(s), fewer than one batch needs ({needed} = "
            f"generation_batch_size {generation_batch} / num_generations {args.num_generations}): nothing would be "
            "trained; give more prompts or a smaller per_device_train_batch_size."
        )


# What TRL passes every reward function besides the dataset's columns (GRPOTrainer._calculate_rewards).
TRL_REWARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def reward_input_columns(fn) -> tuple[str, ...]:
    """The dataset columns ``fn`` reads: those it declared (``register_reward(columns=...)``), else the parameters
    of its signature without a default that TRL does not supply itself (:data:`TRL_REWARD_ARGUMENTS`) and no setting's
    rollout passes (``sharpgrpo.settings.rollout_reward_fields``: e.g. the search episode's ``search_turns``)."""
    import inspect

    from reward_fns import reward_columns

    from sharpgrpo.settings import rollout_reward_fields

    declared = reward_columns(fn)
    if declared is not None:
        return declared
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    supplied = {*TRL_REWARD_ARGUMENTS, *rollout_reward_fields()}
    return tuple(p.name for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty
                 and p.name not in supplied)  # fmt: skip


def input_paths(task, training_args, model_args, config_path: str | None = None) -> dict[str, Any]:
    """Every input of a training command that is a file or folder, by field (the output_dir guard refuses to remove
    any of them): the model, the data, the checkpoint resumed, the config file, user reward modules."""
    import inspect

    paths: dict[str, Any] = {
        "model_name_or_path": model_args.model_name_or_path,
        "dataset_name": task.dataset_name,
        "resume_from_checkpoint": training_args.resume_from_checkpoint,
        "config": config_path,
    }
    kwargs = task.dataset_kwargs if isinstance(task.dataset_kwargs, dict) else {}
    for key in ("data_files", "data_dir", "path"):
        value = kwargs.get(key)
        for index, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, str):
                paths[f"dataset_kwargs.{key}[{index}]"] = item
    for name in task.reward_funcs if isinstance(task.reward_funcs, (list, tuple)) else []:
        if isinstance(name, str) and ("." in name or ":" in name):
            from contextlib import suppress

            with suppress(Exception):
                paths[f"reward_funcs {name}"] = inspect.getsourcefile(resolve_reward_functions([name])[0])
    return paths


def resolve_reward_functions(names: list[str]) -> list:
    """The reward functions named in ``reward_funcs`` (registered names or dotted paths)."""
    from reward_fns import get_reward_function

    if isinstance(names, str) or not isinstance(names, (list, tuple)) or not names:
        raise ConfigError(f"reward_funcs={names!r}: must be a non-empty list of reward function names.")
    functions = []
    for index, name in enumerate(names):
        entry = f"reward_funcs[{index}]={name!r}"
        if not isinstance(name, str) or not name.strip():
            nested = " (a nested list: write the names in one flat list)" if isinstance(name, (list, tuple)) else ""
            raise ConfigError(f"{entry}: not a reward function name or dotted path{nested}.")
        try:
            fn = get_reward_function(name)
        except ValueError as error:
            raise ConfigError(f"{entry}: {' '.join(str(error).split())}") from None
        if not callable(fn):
            raise ConfigError(
                f"{entry}: is a {type(fn).__name__}, not a function; name a callable "
                "reward_fn(prompts, completions, **columns) -> list[float]."
            )
        functions.append(fn)
    return functions


def check_rewards(
    reward_names: list[str], reward_funcs: list, dataset, dataset_name: str, reward_weights=None
) -> None:
    """Each reward function's declared columns (``register_reward(columns=...)``) exist in the dataset, and
    ``reward_weights`` has one weight per function."""
    if reward_weights is not None and len(reward_weights) != len(reward_funcs):
        raise ConfigError(
            f"reward_weights={list(reward_weights)}: {len(reward_weights)} weight(s) for {len(reward_funcs)} reward "
            f"function(s) ({', '.join(reward_names)}); give one weight per function."
        )
    from sharpgrpo.data.row_checks import check_rows

    columns = list(dataset.column_names or [])
    read = {name: reward_input_columns(fn) for name, fn in zip(reward_names, reward_funcs, strict=True)}
    for name, fn in zip(reward_names, reward_funcs, strict=True):
        missing = [c for c in read[name] if c not in columns]
        if missing:
            raise ConfigError(
                f"reward_funcs={list(reward_names)}: {name!r} reads column(s) {', '.join(missing)} that "
                f"dataset_name={dataset_name!r} lacks (its columns: {', '.join(columns)}); rename one with "
                "dataset_kwargs column_mapping, or choose this data's reward."
            )
    check_rows(dataset, f"dataset_name={dataset_name!r}", read)  # every row's prompt; no reward column left empty
