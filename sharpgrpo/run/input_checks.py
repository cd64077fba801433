"""``train.py``'s checks of the reward functions against the dataset: the names resolve, each function's declared
columns exist, one weight per function, and no column a function reads is empty in every row."""

from __future__ import annotations

from sharpgrpo.validation import ConfigError


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
