"""One guard for a run's ``output_dir``: a run never destroys another run's results.

Before anything loads, :func:`guard_output_dir` (``train.py`` holds it for the whole run):

* refuses an ``output_dir`` that is a file, lies below a file, or cannot be written (read-only filesystem, no
  permission): it creates the folder and takes a lock file in it, so every one of these fails there, in one line;
* refuses a second run on a folder another live run holds (an ``fcntl`` lock on :data:`LOCK_NAME`, released by the
  operating system when the process ends, however it ends);
* refuses a non-empty folder unless the run resumes (``resume_from_checkpoint``) or the user says to overwrite
  (``overwrite_output_dir``, as transformers named it). Overwriting replaces the whole earlier run: everything in the
  folder is removed before this run starts (its ``checkpoint-N`` folders, which ``--resume_from_checkpoint true``
  would take for this run's, and its ``completions/``, which ``sharpgrpo tokens`` would read as this run's). Only a
  folder that holds a training run is emptied (:func:`is_run_folder`); any other non-empty folder is refused, so
  ``--output_dir . --overwrite_output_dir true`` cannot delete a project.

Only the main process (``RANK`` 0) checks and locks: the others start together with it and write nothing here first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from sharpgrpo.validation import ConfigError

LOCK_NAME = ".sharpgrpo.lock"
_CHECKPOINT_PREFIX = "checkpoint-"
# What a training run writes into its output_dir (transformers, TRL, sharpgrpo); any one marks the folder as a run's.
RUN_FILES = ("trainer_state.json", "training_args.bin", "training_args.json", "completions", "config.json",
             "adapter_config.json",
             "training_curves.png", "model.safetensors", "adapter_model.safetensors")


def is_main_process() -> bool:
    """Whether this is the launch's main process (before accelerate is initialised: the launcher's ``RANK``)."""
    return os.environ.get("RANK", "0") == "0"


def check_output_dir_location(output_dir: str | os.PathLike, field: str = "output_dir") -> Path:
    """Refuse a path that is a file or below one; create the folder and check it can be written. Returns it."""
    path = Path(output_dir).expanduser()
    for folder in (path, *path.parents):
        if folder.exists() or folder.is_symlink():
            if not folder.is_dir():
                where = "is a file" if folder == path else f"lies below {folder}, which is a file"
                raise ConfigError(f"{field}={str(output_dir)!r}: {where}; give a folder path.")
            break
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

# Written into the run's folder, for this run, by the command that launches it before it starts (`sharpgrpo compare`
# logs each run to train.log there): neither an earlier run's file nor removed when the run replaces one.
LAUNCHER_FILES = ("train.log",)


def previous_run_files(path: Path) -> list[str]:
    """What an earlier run (or anything else) left in ``path``: every entry but the lock file and the launcher's
    log (:data:`LAUNCHER_FILES`)."""
    if not path.is_dir():
        return []
    return sorted(entry.name for entry in path.iterdir() if entry.name not in (LOCK_NAME, *LAUNCHER_FILES))


@contextlib.contextmanager
def guard_output_dir(
    output_dir: str | os.PathLike, *, resuming: bool, overwrite: bool, field: str = "output_dir"
) -> Iterator[None]:
    """Hold ``output_dir`` for one run (see the module docstring); the lock is released when the block ends."""
    if not is_main_process():
        yield
        return
    existed = Path(output_dir).expanduser().exists()
    path = check_output_dir_location(output_dir, field)
    handle = _acquire_lock(path, field)
    failed = True
    try:
        used = previous_run_files(path)
        if used and not resuming:
            if not overwrite:
                shown = ", ".join(used[:6]) + (f", ... ({len(used)} entries)" if len(used) > 6 else "")
                raise ConfigError(
                    f"{field}={str(output_dir)!r} is not empty ({shown}): a run there would overwrite those results. "
                    "Continue that run with --resume_from_checkpoint true, replace it with --overwrite_output_dir "
                    "true, or choose another output_dir."
                )
            if not is_run_folder(path):
                raise ConfigError(
                    f"{field}={str(output_dir)!r} holds files that are not a training run's ({', '.join(used[:6])}): "
                    "overwrite_output_dir replaces an earlier run's folder only; choose another output_dir."
                )
            for name in used:  # the whole earlier run: nothing of it is read as this run's
                entry = path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        yield
        failed = False
    finally:
        _release_lock(handle)
        if failed and not existed and previous_run_files(path) == []:  # a refused run leaves no folder behind
            shutil.rmtree(path, ignore_errors=True)


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a training run: a ``checkpoint-N`` folder or an entry named in :data:`RUN_FILES`."""
    return any(
        entry.name in RUN_FILES or (entry.name.startswith(_CHECKPOINT_PREFIX) and entry.is_dir())
        for entry in path.iterdir()
    )


def _acquire_lock(path: Path, field: str):
    try:
        import fcntl
    except ImportError:  # no fcntl (Windows): the non-empty check still applies
        return None
    handle = open(path / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 (held until _release_lock)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(
            f"{field}={str(path)!r} is in use by another running training run (process {owner}); wait for it to "
            "end or choose another output_dir."
        ) from None
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
