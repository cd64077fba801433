"""``train.py``'s parser: TRL's ``TrlParser`` (a YAML config, then command-line overrides) reading the config file
with :mod:`sharpgrpo.run.config_file` and reporting every parse error in one line.

Differences from ``TrlParser``: duplicate YAML keys, unbounded aliases and a non-scalar ``env:`` value are refused
(:func:`sharpgrpo.run.config_file.read_config`); a value argparse cannot convert (``num_generations: "eight"``,
``bf16: maybe``) or a missing ``--config`` value is a :class:`~sharpgrpo.validation.ConfigError` naming the field and
the value instead of argparse's usage block; an unknown config key or command-line flag names the closest field.
"""

from __future__ import annotations

import os
import re
import sys

from pathlib import Path

from trl import TrlParser

from sharpgrpo.run.config_file import CONFIG_FLAG, config_path_from_args, env_block, read_config
from sharpgrpo.validation import ConfigError, did_you_mean


def train_command() -> str:
    """How the user started training, for the errors' "see ... --help": ``python train.py`` (the repository's
    script) or ``sharpgrpo train`` (the installed command, ``python -m sharpgrpo train``, ``-m sharpgrpo.cli.train``)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("")
    if script.name == "train.py" and script.parent.name != "cli":
        return "python train.py"
    return "sharpgrpo train"

_ARGUMENT = re.compile(r"^argument --(\w+)(?:/--[\w-]+)*: (.*)$", re.DOTALL)


class ConfigParser(TrlParser):
    """``TrlParser`` with the config file read by :mod:`sharpgrpo.run.config_file` and one-line errors."""

    _config_path: str | None = None

    def error(self, message: str):  # argparse prints its usage block and exits 2; one line instead
        match = _ARGUMENT.match(message)
        source = f" (from {self._config_path} or the command line)" if self._config_path else ""
        if match:
            field, problem = match.groups()
            raise ConfigError(f"{field}: {' '.join(problem.split())}{source}")
        raise ConfigError(" ".join(message.split()) + source)

    def parse_args_and_config(self, args=None, return_remaining_strings=False, fail_with_unknown_args=True,
                              separate_remaining_strings=False):  # fmt: skip
        import sys

        args = list(args) if args is not None else sys.argv[1:]
        path = config_path_from_args(args)
        remaining: list[str] = []
        if path is not None:
            index = next(i for i, a in enumerate(args) if a == CONFIG_FLAG or a.startswith(CONFIG_FLAG + "="))
            del args[index : index + (1 if "=" in args[index] else 2)]
            self._config_path = path
            config = read_config(path)
            os.environ.update(env_block(config, path))  # train.py applied it before any import; idempotent
            config.pop("env", None)
            remaining = self.set_defaults_with_config(**config)
            if remaining and fail_with_unknown_args and not return_remaining_strings:
                fields = [action.dest for action in self._actions]
                unknown = [key for key in config if key not in fields]
                hint = did_you_mean(unknown[0], fields) if unknown else ""
                raise ConfigError(
                    f"config={path!r}: {', '.join(unknown) or remaining[0]} is not a field of {train_command()}{hint}"
                    f"; see {train_command()} --help."
                )
        if fail_with_unknown_args and not return_remaining_strings:  # a mistyped flag names the closest field
            from sharpgrpo.run.command_line import unknown_option_error

            unknown = unknown_option_error(args, self._option_string_actions, train_command())
            if unknown is not None:
                raise unknown
        output = self.parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings)
        if return_remaining_strings:
            if separate_remaining_strings:
                return output[:-1] + (remaining, output[-1])
            return output[:-1] + (remaining + output[-1],)
        return output
