"""Name-keyed registries (verl style) for strategies, reward functions and datasets.

A registry maps a name to an object. ``get`` also accepts a dotted import path (``package.module.attribute``
or ``package.module:attribute``) so users can plug their own objects without registering them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from sharpgrpo.validation import did_you_mean

T = TypeVar("T")


def import_from_path(path: str):
    """Import ``package.module.attr`` or ``package.module:attr`` and return the attribute."""
    module_name, sep, attribute = path.partition(":")
    if not sep:
        module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not a dotted import path of the form 'package.module.attribute'.")
    said = io.StringIO()
    try:
        # what it prints while importing (argparse's usage) is shown after, unless it exits (then in the error)
        with contextlib.redirect_stderr(said):
            module = importlib.import_module(module_name)
    except SystemExit as error:  # user code that parses arguments or exits on import: name the module, not the parser
        stdlib = sysconfig.get_paths()["stdlib"]  # the user's line, not argparse's exit()
        frame = [f for f in traceback.extract_tb(error.__traceback__)
                 if not f.filename.startswith(("<", stdlib))][-1]  # fmt: skip
        last = ([line for line in said.getvalue().splitlines() if line.strip()] or [""])[-1].strip()
        raise ValueError(
            f"Importing module {module_name!r} for {path!r} ended the process (SystemExit({error.code!r}) in "
            f"{frame.filename}:{frame.lineno}{f'; it printed {last!r}' if last else ''}): a module given by path must "
            "not parse command-line arguments or exit on import; move that code under `if __name__ == \"__main__\":`."
        ) from None
    except ImportError as error:
        raise ValueError(f"Could not import module {module_name!r} for {path!r}: {error}") from error
    except Exception as error:  # user code that fails while importing: one line naming it
        message = " ".join(str(error).split())
        raise ValueError(
            f"Importing module {module_name!r} for {path!r} raised {type(error).__name__}: {message}"
        ) from error
    sys.stderr.write(said.getvalue())
    try:
        return getattr(module, attribute)
    except AttributeError as error:
        raise ValueError(f"Module {module_name!r} has no attribute {attribute!r} (from {path!r}).") from error


class Registry(Generic[T]):
    """A registry of named objects of one kind (``kind`` appears in error messages). ``load``, if given, is called
    before each lookup, e.g. to import the modules that register entries (``sharpgrpo.settings.load_settings``)."""

    def __init__(self, kind: str, load: Callable[[], None] | None = None):
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._load = load

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            self._load()
        return self._entries

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: ``@registry.register("name")``. A duplicate name is an error."""

        def decorator(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"A {self.kind} named {name!r} is already registered.")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name_or_path: str) -> T:
        """Look up a registered name, or import a dotted path (a name containing '.' or ':')."""
        if name_or_path in self._loaded():
            return self._entries[name_or_path]
        if "." in name_or_path or ":" in name_or_path:
            return import_from_path(name_or_path)
        raise ValueError(
            f"Unknown {self.kind} {name_or_path!r}{did_you_mean(name_or_path, self._entries)}. Valid names: "
            f"{', '.join(sorted(self._entries))}; "
            "or give a dotted import path such as 'my_package.my_module.my_object'."
        )

    def names(self) -> list[str]:
        return sorted(self._loaded())

    def __contains__(self, name: str) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
