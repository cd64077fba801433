"""Front-end checks of ``train.py``: every input is refused with one line before a model is built or loaded.

The config's values are checked by ``SharpGRPOConfig`` itself (``sharpgrpo.validation``) while the command line is
parsed. This module checks what only the script knows: the model source (an existing directory, or a Hub id), the
dataset name and ``dataset_kwargs`` against the loader's arguments, local JSON-lines files line by line, the loaded
dataset (not empty, has a ``prompt`` column and every column the reward functions read), and the reward weights.

Errors are :class:`~sharpgrpo.validation.ConfigError` with one line; :func:`one_line_errors` prints any error of the
script as one line, and the full traceback with ``--debug`` or ``SHARPGRPO_DEBUG=1``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from sharpgrpo.validation import ConfigError, validate_arguments

DEBUG_FLAG = "--debug"
DEBUG_ENV = "SHARPGRPO_DEBUG"
# A Hugging Face Hub repo id: "name" or "org/name" (huggingface_hub's rule: letters, digits, "-", "_", ".").
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}(/[\w.-]{1,96})?$")
_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


# --------------------------------------------------------------------------------------------------------------
# One-line errors


@contextlib.contextmanager
def one_line_errors(argv: list[str] | None = None):
    """Run the script's body; an error prints ``error: <message>`` (one line) and exits with status 1.

    ``--debug`` (removed from ``argv``, ``sys.argv`` by default, before the parser sees it) or the environment
    variable ``SHARPGRPO_DEBUG=1`` lets the exception propagate with its full traceback instead.
    """
    argv = sys.argv if argv is None else argv
    debug = os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")
    while DEBUG_FLAG in argv:
        argv.remove(DEBUG_FLAG)
        debug = True
    try:
        yield
    except SystemExit as stop:  # a message given to SystemExit ("error: ..."): printed after the progress bars
        if isinstance(stop.code, str):
            close_progress_bars()
            print(stop.code if stop.code.startswith("error: ") else f"error: {stop.code}", file=sys.stderr)
            sys.exit(1)
        raise
    except Exception as error:
        if debug:
            close_progress_bars()
            raise
        message = " ".join(str(error).split()) or repr(error)
        prefix = "" if getattr(error, "names_itself", False) else f"{type(error).__name__}: "
        close_progress_bars()
        print(f"error: {prefix}{message} (full traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1)", file=sys.stderr)
        sys.exit(1)


def close_progress_bars() -> None:
    """Close every open tqdm bar (the training bar of an interrupted run) so the error is the last thing shown and
    no bar is redrawn after it."""
    tqdm_module = sys.modules.get("tqdm")  # not imported: no bar
    if tqdm_module is None:
        return
    for bar in list(getattr(tqdm_module.tqdm, "_instances", ())):
        with contextlib.suppress(Exception):  # a bar that cannot redraw (closed stream) must not hide the error
            bar.close()
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------------------
# Local paths versus Hub ids


def looks_like_local_path(name: str) -> bool:
    """Whether ``name`` is meant as a local path rather than a Hub id ``org/name``.

    True for absolute paths, ``./``, ``../`` and ``~`` prefixes, a trailing or doubled separator, backslashes,
    more than one ``/`` (Hub ids have at most one), a data-file suffix, and ``dir/name`` whose ``dir`` exists here.
    """
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\")) or os.path.isabs(name) or name in (".", ".."):
        return True
    if "\\" in name or name.endswith("/") or name.count("/") >= 2 or name.lower().endswith(_DATA_SUFFIXES):
        return True
    return "/" in name and Path(name).parent.is_dir()


def check_model_source(name: str, field: str = "model_name_or_path", revision: str | None = None) -> None:
    """Refuse a model that is neither an existing model directory nor a possible Hub id, naming what is wrong."""
    from sharpgrpo.prepared_models import prepared_model_names

    if name.startswith("sharpgrpo-") and name in prepared_model_names():  # built locally on first use
        return
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in ("config.json", "adapter_config.json")):
            raise ConfigError(
                f"{field}={name!r}: the directory {path.resolve()} has no config.json (not a saved model; "
                "a training run writes one into its output_dir at the end)."
            )
        return
    if path.exists():
        raise ConfigError(f"{field}={name!r}: {path.resolve()} is a file; give the model's directory or a Hub id.")
    if looks_like_local_path(name):
        raise ConfigError(
            f"{field}={name!r}: no such directory ({path.resolve()}), and it is not a Hugging Face Hub id "
            "(org/name)."
        )
    if not _HUB_ID.match(name):
        raise ConfigError(
            f"{field}={name!r}: neither an existing directory nor a valid Hugging Face Hub id (org/name: letters, "
            "digits, '-', '_', '.')."
        )
    if _offline() and not _in_hub_cache(name, revision):
        raise ConfigError(
            f"{field}={name!r}: no such directory ({path.resolve()}), and offline (HF_HUB_OFFLINE=1) the Hub "
            "cache has no model of that id; give a local model directory or download it first."
        )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(repo_id, f, revision=revision), str)
        for f in ("config.json", "adapter_config.json")
    )


# --------------------------------------------------------------------------------------------------------------
# Dataset


def parse_dataset_kwargs(value: Any) -> dict[str, Any]:
    """``dataset_kwargs`` as a dict: a mapping from the YAML, or JSON (or a YAML flow mapping) on the command line."""
    if value is None:
        return {}
    if isinstance(value, str):
        import yaml

        try:
            value = yaml.safe_load(value) if value.strip() else {}
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at column {mark.column + 1}" if mark is not None else ""
            raise ConfigError(
                f"dataset_kwargs={value!r}: not a valid JSON mapping{where} "
                f"({getattr(error, 'problem', None) or error}); e.g. --dataset_kwargs '{{\"num_prompts\": 512}}'."
            ) from None
        if value is None:
            value = {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"dataset_kwargs={value!r}: must be a mapping of keyword arguments, e.g. {{num_prompts: 512}}."
        )
    glued = [key for key, item in value.items() if item is None and isinstance(key, str) and ":" in key]
    if glued:
        raise ConfigError(
            f"dataset_kwargs={value!r}: {glued[0]!r} reads as a key without a value; put a space after ':' "
            "(YAML) or use JSON, e.g. '{\"num_prompts\": 512}'."
        )
    return value


def dataset_loader(dataset_name: str):
    """The function ``load_train_dataset`` hands ``dataset_kwargs`` to: a registered builder or the file/hub loader."""
    from sharpgrpo.data import DATASETS
    from sharpgrpo.data.loading import load_dataset_source

    return DATASETS.get(dataset_name) if dataset_name in DATASETS else load_dataset_source


def check_dataset_kwargs(dataset_name: str, kwargs: dict[str, Any]) -> None:
    """Refuse keys the loader does not take (e.g. the YAML's ``dataset_kwargs`` left over after ``--dataset_name``),
    and values outside the ranges its ``@argument_rules`` declare (``num_prompts: "abc"``)."""
    loader = dataset_loader(dataset_name)
    parameters = inspect.signature(loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if loader.__name__ == "load_dataset_source":
        accepted = accepted[1:]  # the path itself is dataset_name
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise ConfigError(
            f"dataset_kwargs={kwargs!r}: {', '.join(map(str, unknown))} not accepted by the loader of "
            f"dataset_name={dataset_name!r}, which takes {', '.join(accepted) or 'no arguments'} (a YAML config's "
            "dataset_kwargs stay when --dataset_name changes: set --dataset_kwargs too)."
        )
    required = [
        name
        for name in accepted
        if parameters[name].default is inspect.Parameter.empty and name not in kwargs
    ]
    if required:
        raise ConfigError(f"dataset_kwargs={kwargs!r}: dataset_name={dataset_name!r} needs {', '.join(required)}.")
    validate_arguments(loader, kwargs, "dataset_kwargs")  # the loader's @argument_rules: types and ranges


def check_data_file(path: str | os.PathLike, field: str = "dataset_name", check_prompts: bool = False) -> None:
    """A local ``.jsonl`` (or JSON-lines ``.json``) file: not empty, every non-blank line a JSON object, and with
    ``check_prompts`` (the rows are used as they are) every line's ``prompt`` one TRL can train on."""
    from sharpgrpo.data.row_checks import prompt_problem

    path = Path(path)
    suffix = path.suffix.lower()
    if not path.is_file() or suffix not in (".jsonl", ".json"):
        return
    with path.open(encoding="utf-8") as handle:
        text = handle.read()
    if not text.strip():
        raise ConfigError(f"{field}={str(path)!r}: the file is empty (expected one JSON object per line).")
    if suffix == ".json":
        try:
            json.loads(text)  # one JSON document (a list of rows or a mapping of columns)
            return
        except json.JSONDecodeError:
            pass  # maybe JSON lines in a .json file: check line by line
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{field}={str(path)!r}: line {number} is not valid JSON ({error.msg} at column {error.colno})."
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"{field}={str(path)!r}: line {number} is a JSON {type(row).__name__}, not an object (one row per "
                "line)."
            )
        if check_prompts and "prompt" in row:
            problem = prompt_problem(row.get("prompt"))
            if problem is not None:
                raise ConfigError(f"{field}={str(path)!r}: line {number}: prompt {problem}.")


def load_checked_dataset(dataset_name: str, dataset_kwargs: Any):
    """Check the dataset's name, arguments and file, load it, and refuse an empty one or one without prompts."""
    from sharpgrpo.data import DATASETS, load_train_dataset

    kwargs = parse_dataset_kwargs(dataset_kwargs)
    registered = dataset_name in DATASETS
    if not registered and not Path(dataset_name).expanduser().exists() and looks_like_local_path(dataset_name):
        raise ConfigError(
            f"dataset_name={dataset_name!r}: no such file or directory ({Path(dataset_name).expanduser().resolve()}); "
            f"registered datasets: {', '.join(DATASETS.names())}, or a Hub id."
        )
    check_dataset_kwargs(dataset_name, kwargs)
    if not registered:
        as_is = not any(kwargs.get(key) for key in ("column_mapping", "prompt_template"))
        check_data_file(Path(dataset_name).expanduser(), check_prompts=as_is)
    described = f"dataset_name={dataset_name!r}" + (f" with dataset_kwargs={kwargs!r}" if kwargs else "")
    try:
        dataset = load_train_dataset(dataset_name, **kwargs)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 - one line naming the dataset (and the registered names)
        cause = f"{type(error).__name__}: {' '.join(str(error).split())}"
        if not registered and not Path(dataset_name).expanduser().exists():
            raise ConfigError(
                f"dataset_name={dataset_name!r}: not a registered dataset ({', '.join(DATASETS.names())}), not a "
                f"local file or folder, and the Hugging Face Hub could not load it ({cause})."
            ) from None
        raise ConfigError(f"{described}: could not be loaded ({cause}).") from None
    if hasattr(dataset, "__len__") and len(dataset) == 0:
        raise ConfigError(f"{described}: 0 prompts, nothing to train on.")
    if "prompt" not in (dataset.column_names or []):
        raise ConfigError(f"{described}: no 'prompt' column (columns: {', '.join(dataset.column_names or [])}).")
    return dataset


# --------------------------------------------------------------------------------------------------------------
# Rewards against the dataset


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
