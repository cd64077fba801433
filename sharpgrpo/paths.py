"""Paths: where the project's optional shared evaluation data lives, and whether a name is meant as a local path.

The evaluation data (``shared/data``, see its SOURCES.md files) is not shipped with the package. It is looked up
in ``$SHARPGRPO_SHARED_DIR`` if set, else in a ``shared`` folder beside the repository checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path | None:
    """The shared folder (holding ``data/``), or None where it is absent (as in a user's clone)."""
    candidates = []
    if os.environ.get("SHARPGRPO_SHARED_DIR"):
        candidates.append(Path(os.environ["SHARPGRPO_SHARED_DIR"]))
    candidates.append(REPO_ROOT.parent / "shared")
    for candidate in candidates:
        if (candidate / "data").is_dir():
            return candidate
    return None


def shared_data_dir(subdir: str = "") -> Path | None:
    """``shared/data/<subdir>`` or None where the shared folder is absent."""
    root = shared_dir()
    if root is None:
        return None
    path = root / "data" / subdir
    return path if path.exists() else None


_DATA_SUFFIXES = (".jsonl", ".json", ".parquet")


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


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``path`` so that a file under its name is always complete: the text goes to a temporary file beside it
    (flushed to disk), which then replaces ``path``; a failed write (a full disk) removes the temporary file and
    leaves any earlier ``path`` as it was."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
