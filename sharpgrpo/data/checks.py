"""The dataset checks of ``train.py``: the dataset name and ``dataset_kwargs`` against the loader's arguments and their
declared ranges, local JSON-lines files line by line, and the loaded dataset, each refused with one line naming the
field, the file and its line or the row, before the model loads."""

from __future__ import annotations

import inspect
import json
import os
import re
from pathlib import Path
from typing import Any

from sharpgrpo.paths import looks_like_local_path
from sharpgrpo.validation import ConfigError, validate_arguments


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
    """A local ``.parquet`` file readable as Parquet; a local ``.jsonl`` (or JSON-lines ``.json``) file: UTF-8, not
    empty, every non-blank line a JSON object, and with ``check_prompts`` (the rows are used as they are) every line's ``prompt`` one TRL can train on."""
    from sharpgrpo.data.row_checks import prompt_problem

    path = Path(path)
    suffix = path.suffix.lower()
    if path.is_file() and suffix == ".parquet":
        import pyarrow.parquet

        try:
            pyarrow.parquet.read_schema(path)
        except Exception as error:  # noqa: BLE001 - any reason the file is not readable Parquet, named with it
            raise ConfigError(
                f"{field}={str(path)!r}: not a readable Parquet file ({type(error).__name__}: "
                f"{' '.join(str(error).split())})."
            ) from None
        return
    if not path.is_file() or suffix not in (".jsonl", ".json"):
        return
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        raise ConfigError(
            f"{field}={str(path)!r}: line {line} is not UTF-8 text (byte {raw[error.start]:#04x} at column {column}); "
            "save the file as UTF-8."
        ) from None
    if not text.strip():
        raise ConfigError(f"{field}={str(path)!r}: the file is empty (expected one JSON object per line).")
    if suffix == ".json":
        try:
            document = json.loads(text)  # one JSON document (a list of rows or a mapping of columns)
        except json.JSONDecodeError:
            pass  # maybe JSON lines in a .json file: check line by line
        else:
            surrogate = _lone_surrogate(document)
            if surrogate is None:
                return
            found = re.search(rf"\\u{ord(surrogate[1]):04x}", text, flags=re.IGNORECASE)
            number = text[: found.start()].count("\n") + 1 if found else "?"
            raise ConfigError(f"{field}={str(path)!r}: line {number}: {_SURROGATE.format(ord(surrogate[1]))}")
    # Python's json accepts a lone surrogate escape (half of a UTF-16 pair, e.g. a string cut mid-emoji); Arrow, which
    # datasets reads the file with, refuses the whole file naming no line: name it here.
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
        if (surrogate := _lone_surrogate(row)) is not None:
            raise ConfigError(f"{field}={str(path)!r}: line {number}: {surrogate[0]} holds "
                              f"{_SURROGATE.format(ord(surrogate[1]))}")  # fmt: skip
        if check_prompts and "prompt" in row:
            problem = prompt_problem(row.get("prompt"))
            if problem is not None:
                raise ConfigError(f"{field}={str(path)!r}: line {number}: prompt {problem}.")


_SURROGATE = ("a lone surrogate escape (\\u{:04x}): half of a UTF-16 pair, as a string cut in the middle of an emoji "
              "leaves it; it is not a character and the data cannot be read: fix or drop the line.")


def _lone_surrogate(value: Any, where: str = "the row") -> tuple[str, str] | None:
    """``(where, character)`` of the first lone surrogate in a parsed JSON value's strings (``field 'prompt'``,
    ``field 'turns'[2]``), or None."""
    if isinstance(value, str):
        return next(((where, ch) for ch in value if "\ud800" <= ch <= "\udfff"), None)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _lone_surrogate(item, f"field {key!r}" if where == "the row" else f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def check_dataset_source(dataset_name: str, dataset_kwargs: Any) -> dict[str, Any]:
    """Everything about the dataset that is known without loading (or downloading) it: the name (a registered
    dataset, an existing file or folder, or a Hub id), ``dataset_kwargs`` against the loader, and a local JSON-lines
    file line by line. Returns ``dataset_kwargs`` as a dict."""
    from sharpgrpo.data import DATASETS

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
    return kwargs


def dataset_is_local(dataset_name: str) -> bool:
    """A registered dataset or an existing file or folder: loading it downloads nothing."""
    from sharpgrpo.data import DATASETS

    return dataset_name in DATASETS or Path(dataset_name).expanduser().exists()


def load_checked_dataset(dataset_name: str, dataset_kwargs: Any):
    """Check the dataset's name, arguments and file, load it, and refuse an empty one or one without prompts."""
    from sharpgrpo.data import DATASETS, load_train_dataset

    kwargs = check_dataset_source(dataset_name, dataset_kwargs)
    registered = dataset_name in DATASETS
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
