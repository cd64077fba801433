"""Every command's options, checked before any work, each error one line naming the option.

:class:`CommandParser` is ``argparse.ArgumentParser`` for ``sharpgrpo eval``, ``compare``, ``tokens``, ``plot`` and
``serve`` (``train`` has :class:`sharpgrpo.run.config_parser.ConfigParser`, which shares
:func:`unknown_option_error`):

* an option may declare what it accepts (``add_argument("--limit", type=int, rule=integer(1))``, the rules of
  :mod:`sharpgrpo.validation`; ``path="file"`` / ``"dir"`` / ``"exists"`` for an input that must exist), checked
  right after parsing, before the command reads a file or loads a model: ``--limit=0: must be an integer >= 1.``;
* argparse's own errors (a value it cannot convert, a missing required option, a wrong choice) become one
  :class:`~sharpgrpo.validation.ConfigError` line naming the option instead of the usage block;
* a mistyped option names the closest one (``--limt: no such option of sharpgrpo eval (did you mean --limit?)``).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sharpgrpo.validation import ConfigError, Rule, did_you_mean

_ARGUMENT = re.compile(r"^argument (\S+?)(?:/\S+)*: (.*)$", re.DOTALL)
_INVALID = re.compile(r"^invalid (\w+) value: (.*)$", re.DOTALL)
PATH_KINDS = ("file", "dir", "exists")


def option_names(argv: Sequence[str]) -> Iterator[str]:
    """The ``--name`` of each option token in ``argv`` (``--name value`` or ``--name=value``), up to a bare ``--``.
    Values are not options: a token after an option that takes one is skipped by the caller's parser anyway, so
    only ``--name`` tokens are looked at."""
    for token in argv:
        if token == "--":
            return
        if token.startswith("--") and len(token) >= 3:
            yield token.split("=", 1)[0]


def unknown_option_error(argv: Sequence[str], known: Iterable[str], command: str) -> ConfigError | None:
    """The first ``--option`` in ``argv`` that is none of ``known`` (option strings such as ``--limit``), as one line
    naming the closest known option; None when every option is known."""
    known = sorted(set(known))
    for name in option_names(argv):
        if name in known:
            continue
        return ConfigError(f"{name}: no such option of {command}{did_you_mean(name, known)}; see {command} --help.")
    return None


class CommandParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line naming the option, with declared value rules and input
    paths (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._rules: dict[str, tuple[str, Rule | None, str | None]] = {}

    def add_argument(self, *names, rule: Rule | None = None, path: str | None = None, **kwargs):
        action = super().add_argument(*names, **kwargs)
        if path is not None and path not in PATH_KINDS:
            raise ValueError(f"path={path!r}: must be one of {', '.join(PATH_KINDS)}")
        if rule is not None or path is not None:
            label = next((n for n in names if n.startswith("--")), action.dest)
            self._rules[action.dest] = (label, rule, path)
        return action

    def error(self, message: str):  # argparse prints its usage block and exits 2: one line instead
        match = _ARGUMENT.match(" ".join(message.split()))
        if match:
            option, problem = match.groups()
            invalid = _INVALID.match(problem)
            if invalid:
                kind, value = invalid.groups()
                kind = {"int": "an integer", "float": "a number"}.get(kind, f"a valid {kind} value")
                raise ConfigError(f"{option}={value}: must be {kind}; see {self.prog} --help.")
            raise ConfigError(f"{option}: {problem.rstrip('.')}; see {self.prog} --help.")
        raise ConfigError(f"{self.prog}: {' '.join(message.split()).rstrip('.')}; see {self.prog} --help.")

    def parse_args(self, args=None, namespace=None):
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        error = unknown_option_error(argv, self._option_string_actions, self.prog)
        if error is not None:
            raise error
        parsed = super().parse_args(argv, namespace)
        self.check(parsed)
        return parsed

    def check(self, parsed: argparse.Namespace) -> None:
        """Every declared rule and input path, in the order the options were added."""
        for dest, (label, rule, path) in self._rules.items():
            values = getattr(parsed, dest, None)
            for value in values if isinstance(values, list) else [values]:
                if value is None:
                    continue
                if rule is not None:
                    rule.check(label, value)
                if path is not None:
                    check_input_path(label, value, path)


def check_input_path(label: str, value: Any, kind: str) -> None:
    """An input that must exist: ``file``, ``dir`` or ``exists`` (either), one line naming the option and the path."""
    path = Path(str(value)).expanduser()
    if not path.exists():
        what = {"dir": "folder", "file": "file", "exists": "file or folder"}[kind]
        raise ConfigError(f"{label}={str(value)!r}: no such {what} ({path.resolve()}).")
    if kind == "file" and not path.is_file():
        raise ConfigError(f"{label}={str(value)!r}: {path.resolve()} is a folder; give a file.")
    if kind == "dir" and not path.is_dir():
        raise ConfigError(f"{label}={str(value)!r}: {path.resolve()} is a file; give a folder.")


def check_output_folder(label: str, value: Any, command: str | None = None, settings: Any = None) -> None:
    """An output folder: not a file, not below a file (it is created when the command writes). With ``command``,
    the one rule of every writing command as well (:func:`sharpgrpo.run.output_dir.check_output_target`: a new or
    empty folder, or one ``command`` wrote, with the same ``settings`` where given); the command then calls
    :func:`sharpgrpo.run.output_dir.claim_output_target` when it starts writing."""
    if command is not None:
        from sharpgrpo.run.output_dir import check_output_target

        check_output_target(value, command=command, label=label, settings=settings)
        return
    path = Path(str(value)).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{label}={str(value)!r}: {path.resolve()} is a file; give a folder.")
    blocking = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"{label}={str(value)!r}: lies below {blocking}, which is a file; give a folder.")
