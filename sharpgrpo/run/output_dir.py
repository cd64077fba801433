"""The one rule every command that writes follows, and the guard of a training run's ``output_dir``.

**The rule** (:func:`check_output_target` before any work, :func:`claim_output_target` when writing starts): a command
writes into a folder that is new, empty, or was written by the same command; each folder the project writes carries
a marker, :data:`OUTPUT_MARKER` (``.sharpgrpo-output.json``: which command wrote it, when, with which command line
and settings). A folder that holds anything without the marker, or the marker of another command (or, for a command
that passes ``settings``, other settings), is refused naming what is there; nothing is removed or replaced that the
project did not write, and nothing is touched before every input is checked. The commands' reports (``sharpgrpo
compare``, ``plot``, ``tokens``) and training runs follow it. ``sharpgrpo eval`` writes named files into a folder
that may hold others (:func:`check_output_files`): it replaces only files the marker lists as its own, and refuses
samples written with other settings (``--overwrite`` to start over).

**A training run's output_dir.** Before anything loads, :func:`guard_output_dir` (``sharpgrpo train`` holds it for the
whole run):

* refuses an ``output_dir`` that is a file, lies below a file, or cannot be written (read-only filesystem, no
  permission): it creates the folder and takes a lock file in it, so every one of these fails there, in one line;
* refuses a second run on a folder another live run holds (an ``fcntl`` lock on :data:`LOCK_NAME`, released by the
  operating system when the process ends, however it ends);
* refuses a non-empty folder unless the run resumes (``resume_from_checkpoint``) or the user says to overwrite
  (``overwrite_output_dir``, as transformers named it). Overwriting replaces the whole earlier run: everything in the
  folder is removed before this run starts (its ``checkpoint-N`` folders, which ``--resume_from_checkpoint true``
  would take for this run's, and its ``completions/``, which ``sharpgrpo tokens`` would read as this run's). Only a
  folder that carries a training run's marker is emptied; any other non-empty folder is refused (so
  ``--output_dir . --overwrite_output_dir true`` cannot delete a project, nor a folder of a model's own files), and
  so is one that holds an input of the same command (the model, the data, the config, the checkpoint resumed):
  the caller checks every input first and names them in ``inputs``.

Only the main process (``RANK`` 0) checks and locks: the others start together with it and write nothing here first.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from sharpgrpo.validation import ConfigError

LOCK_NAME = ".sharpgrpo.lock"
OUTPUT_MARKER = ".sharpgrpo-output.json"  # what wrote the folder, when, with which command (module docstring)
TRAIN_COMMAND = "sharpgrpo train"  # train.py is the same command
_CHECKPOINT_PREFIX = "checkpoint-"
# Written into the run's folder, for this run, by the command that launches it before it starts (`sharpgrpo compare`
# logs each run to train.log there): neither an earlier run's file nor removed when the run replaces one.
LAUNCHER_FILES = ("train.log",)
_OWN_FILES = (LOCK_NAME, OUTPUT_MARKER)


def is_main_process() -> bool:
    """Whether this is the launch's main process (before accelerate is initialised: the launcher's ``RANK``)."""
    return os.environ.get("RANK", "0") == "0"


# ------------------------------------------------------------------------------------------------------------------
# The marker and the rule of every writing command
# ------------------------------------------------------------------------------------------------------------------
def read_output_marker(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The marker of a folder the project wrote, or None (no marker, or one that is not the project's JSON)."""
    path = Path(folder) / OUTPUT_MARKER
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and isinstance(marker.get("written_by"), str) else None


def write_output_marker(folder: str | os.PathLike, command: str, settings: Mapping[str, Any] | None = None,
                        argv: Iterable[str] | None = None) -> None:  # fmt: skip
    """Mark ``folder`` as written by ``command`` (keeping the first writer's ``created`` time)."""
    folder = Path(folder)
    earlier = read_output_marker(folder) or {}
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    marker = {
        "written_by": command,
        "command_line": " ".join([command, *(sys.argv[1:] if argv is None else list(argv))]),
        "created": earlier.get("created", now) if earlier.get("written_by") == command else now,
        "updated": now,
        "settings": dict(settings) if settings is not None else earlier.get("settings"),
    }
    with contextlib.suppress(ImportError):
        from importlib.metadata import version

        with contextlib.suppress(Exception):
            marker["sharpgrpo_version"] = version("sharpgrpo")
    (folder / OUTPUT_MARKER).write_text(json.dumps(marker, indent=2, default=str) + "\n", encoding="utf-8")


def folder_entries(path: Path) -> list[str]:
    """What ``path`` holds besides the project's lock and marker (and a launcher's log, :data:`LAUNCHER_FILES`)."""
    if not path.is_dir():
        return []
    return sorted(entry.name for entry in path.iterdir() if entry.name not in (*_OWN_FILES, *LAUNCHER_FILES))


previous_run_files = folder_entries  # what an earlier run (or anything else) left in a run's output_dir


def _shown(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f", ... ({len(names)} entries)" if len(names) > 6 else "")


def _check_location(label: str, value: Any) -> Path:
    path = Path(str(value)).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                where = "is a file" if folder == path else f"lies below {folder}, which is a file"
                raise ConfigError(f"{label}={str(value)!r}: {where}; give a folder path.")
            break
    return path


def check_output_target(value: str | os.PathLike, *, command: str, label: str = "--output",
                        settings: Mapping[str, Any] | None = None) -> Path:  # fmt: skip
    """The rule (module docstring), checked before the command does any work: ``value`` may be written by
    ``command`` when it is new, empty, or carries ``command``'s marker (with the same ``settings`` where given).
    Nothing is created or changed here. Returns the folder."""
    path = _check_location(label, value)
    entries = folder_entries(path)
    if not entries:
        return path
    marker = read_output_marker(path)
    if marker is None:
        raise ConfigError(
            f"{label}={str(value)!r} holds files that {command} did not write ({_shown(entries)}; no {OUTPUT_MARKER} "
            "marker): it never writes over files it did not write; choose a new or empty folder."
        )
    if marker["written_by"] != command:
        raise ConfigError(
            f"{label}={str(value)!r} holds the output of `{marker['written_by']}` (written {marker.get('updated', '?')}"
            f"): {command} does not write over another command's output; choose a new or empty folder."
        )
    if settings is not None and marker.get("settings") is not None and marker["settings"] != _jsonable(settings):
        before, now = marker["settings"], _jsonable(settings)
        changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
        raise ConfigError(
            f"{label}={str(value)!r} holds the output of `{marker.get('command_line', command)}` with other settings "
            f"(differing: {', '.join(changed)}): it would be replaced; choose another folder, or run that command "
            "again to continue it."
        )
    return path


def _jsonable(settings: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(settings), default=str))


def claim_output_target(value: str | os.PathLike, *, command: str, settings: Mapping[str, Any] | None = None,
                        config: Mapping[str, Any] | None = None, argv: Iterable[str] | None = None) -> Path:  # fmt: skip
    """When ``command`` starts writing (after :func:`check_output_target` and every input's check): create the folder,
    mark it as ``command``'s and write its run record (`sharpgrpo.run.run_record`) of the resolved ``config`` (the
    command's options, every one) and ``argv``. Returns the folder."""
    from sharpgrpo.run.run_record import write_run_record

    path = Path(str(value)).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    write_output_marker(path, command, None if settings is None else _jsonable(settings))
    write_run_record(path, command, config or {}, argv=None if argv is None else list(argv))
    return path


def _files_written_by(folder: Path) -> dict[str, str]:
    """``{file name: command}`` of the files a command wrote by name into ``folder`` (:func:`claim_output_files`)."""
    try:
        marker = json.loads((folder / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = marker.get("files") if isinstance(marker, dict) else None
    return files if isinstance(files, dict) else {}


def check_output_files(paths: Iterable[str | os.PathLike], *, command: str, label: str = "--output") -> None:
    """The rule for a command that writes named files into a folder that may hold other things (``sharpgrpo eval``:
    ``x.json``, ``x.md``, ``x.samples.jsonl`` beside a user's files): each may be written when it does not exist or
    the folder's marker records it as written by ``command``; a file of the same name that the command did not write
    is refused naming it. Checked before any work; nothing is created or changed here."""
    for path in map(Path, paths):
        _check_location(label, path.parent)
        if (path.exists() or path.is_symlink()) and _files_written_by(path.parent).get(path.name) != command:
            raise ConfigError(
                f"{label}: {path} exists and {command} did not write it (it is not listed in "
                f"{path.parent / OUTPUT_MARKER}); {command} never replaces a file it did not write: choose another "
                f"{label}, or move that file."
            )


def claim_output_files(paths: Iterable[str | os.PathLike], *, command: str) -> None:
    """When ``command`` starts writing the files of :func:`check_output_files`: create their folder and record them
    in its marker as ``command``'s (a new or empty folder becomes ``command``'s; another command's marker keeps its
    owner, a folder of other files gets a marker that lists only these files)."""
    paths = [Path(p) for p in paths]
    folder = paths[0].parent
    folder.mkdir(parents=True, exist_ok=True)
    if read_output_marker(folder) is None and not folder_entries(folder):
        write_output_marker(folder, command)
    try:
        marker = json.loads((folder / OUTPUT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        marker = {}
    marker = marker if isinstance(marker, dict) else {}
    marker["files"] = {**_files_written_by(folder), **{path.name: command for path in paths}}
    (folder / OUTPUT_MARKER).write_text(json.dumps(marker, indent=2, default=str) + "\n", encoding="utf-8")


def _inputs_inside(path: Path, inputs: Mapping[str, Any]) -> list[str]:
    """``label='value'`` of each input that is ``path`` or lies inside it."""
    inside = []
    root = path.resolve()
    for label, value in inputs.items():
        if value is None or value is False or value is True or str(value) == "":
            continue
        candidate = Path(str(value)).expanduser()
        if not candidate.exists():
            continue
        resolved = candidate.resolve()
        if resolved == root or root in resolved.parents:
            inside.append(f"{label}={str(value)!r}")
    return inside


# ------------------------------------------------------------------------------------------------------------------
# A training run's output_dir
# ------------------------------------------------------------------------------------------------------------------
def check_output_dir_location(output_dir: str | os.PathLike, field: str = "output_dir") -> Path:
    """Refuse a path that is a file or below one; create the folder and check it can be written. Returns it."""
    path = _check_location(field, output_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".sharpgrpo-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"{field}={str(output_dir)!r}: cannot be written ({error.strerror or error}); choose a writable folder."
        ) from None
    return path


def check_run_folder(output_dir: str | os.PathLike, *, resuming: bool, overwrite: bool, field: str = "output_dir",
                     inputs: Mapping[str, Any] | None = None) -> list[str]:  # fmt: skip
    """What :func:`guard_output_dir` refuses in a folder (nothing is changed here); returns the entries an overwrite
    removes (empty when nothing is to be removed)."""
    path = Path(output_dir).expanduser()
    used = folder_entries(path)
    if not used or resuming:
        return []
    marker = read_output_marker(path)
    ours = marker is not None and marker["written_by"] == TRAIN_COMMAND
    if not overwrite:
        has_checkpoint = any(name.startswith(_CHECKPOINT_PREFIX) and (path / name).is_dir() for name in used)
        if has_checkpoint:
            ways = "Continue that run with --resume_from_checkpoint true, " + (
                "replace it with --overwrite_output_dir true, " if ours else "") + "or choose another output_dir."
        elif ours:
            ways = ("That run saved no checkpoint to resume from: replace it with --overwrite_output_dir true, or "
                    "choose another output_dir.")
        else:
            ways = (f"sharpgrpo train did not write them (no {OUTPUT_MARKER}), so it replaces none of them: choose "
                    "another output_dir.")
        raise ConfigError(
            f"{field}={str(output_dir)!r} is not empty ({_shown(used)}): a run there would overwrite those files. {ways}"
        )
    if not ours:
        whose = "no training run's marker" if marker is None else f"it is the output of `{marker['written_by']}`"
        raise ConfigError(
            f"{field}={str(output_dir)!r} holds files that sharpgrpo train did not write ({_shown(used)}; "
            f"{whose}, {OUTPUT_MARKER}): overwrite_output_dir replaces an earlier run's folder only; choose another "
            "output_dir."
        )
    inside = _inputs_inside(path, inputs or {})
    if inside:
        raise ConfigError(
            f"{field}={str(output_dir)!r}: overwrite_output_dir would delete an input of this run ({', '.join(inside)}"
            "), which lies in it; copy it elsewhere first, or choose another output_dir."
        )
    return used


@contextlib.contextmanager
def guard_output_dir(
    output_dir: str | os.PathLike, *, resuming: bool, overwrite: bool, field: str = "output_dir",
    inputs: Mapping[str, Any] | None = None,
) -> Iterator[None]:
    """Hold ``output_dir`` for one run (see the module docstring); the lock is released when the block ends.
    ``inputs``: the command's inputs by field (checked before this is entered), none of which may be removed."""
    if not is_main_process():
        yield
        return
    existed = Path(output_dir).expanduser().exists()
    check_run_folder(output_dir, resuming=resuming, overwrite=overwrite, field=field, inputs=inputs)  # before mkdir
    path = check_output_dir_location(output_dir, field)
    handle = _acquire_lock(path, field)
    had_marker = read_output_marker(path) is not None
    failed = True
    try:
        used = check_run_folder(path, resuming=resuming, overwrite=overwrite, field=field, inputs=inputs)  # locked
        for name in used:  # the whole earlier run: nothing of it is read as this run's
            entry = path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        write_output_marker(path, TRAIN_COMMAND)
        yield
        failed = False
    finally:
        _release_lock(handle)
        if failed and folder_entries(path) == []:  # a refused run leaves the folder as it found it
            if not existed:
                shutil.rmtree(path, ignore_errors=True)
            elif not had_marker:
                (path / OUTPUT_MARKER).unlink(missing_ok=True)


def hold_output_folder(path: str | os.PathLike, field: str, holder: str):
    """Create ``path`` and hold its lock for the rest of this process (``sharpgrpo compare``: one owner per output
    folder, as a training run holds its output_dir); a folder another live process holds is refused naming it."""
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return _acquire_lock(path, field, holder)


def refuse_if_held(path: str | os.PathLike, field: str, holder: str) -> None:
    """Refuse at once a folder whose lock a live process holds, creating nothing (its lock is only tried)."""
    lock = Path(path).expanduser() / LOCK_NAME
    if lock.is_file():
        handle = _acquire_lock(lock.parent, field, holder, create=False)
        if handle is not None:
            handle.close()  # closing the only descriptor releases the lock; the file is left as it was


def _acquire_lock(path: Path, field: str, holder: str = "training run", create: bool = True):
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): the non-empty check still applies
        return None
    # held until _release_lock, or the process's end
    handle = open(path / LOCK_NAME, "a+" if create else "r+", encoding="utf-8")  # noqa: SIM115
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"{field}={str(path)!r} is in use by another running {holder} (process {owner}); wait for it to "
            f"end or choose another {field.lstrip('-')}."
        ) from None
    if not create:
        return handle
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _release_lock(handle) -> None:
    if handle is None:
        return
    import fcntl

    with contextlib.suppress(OSError):
        handle.truncate(0)
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    handle.close()
