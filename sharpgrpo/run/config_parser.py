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
        deepspeed = _option_value(args, "--deepspeed")
        if deepspeed is None and path is not None:
            deepspeed = config.get("deepspeed")
        if deepspeed not in (None, "", "None", "none"):
            check_deepspeed(deepspeed)  # before transformers' own parsing raises a bare library error on it
        output = self.parse_args_into_dataclasses(args=args, return_remaining_strings=return_remaining_strings)
        if return_remaining_strings:
            if separate_remaining_strings:
                return output[:-1] + (remaining, output[-1])
            return output[:-1] + (remaining + output[-1],)
        return output


def _option_value(args: list[str], flag: str):
    """The value of ``flag`` in ``args`` (``--flag value`` or ``--flag=value``), or None."""
    for index, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and index + 1 < len(args):
            return args[index + 1]
    return None


def check_deepspeed(value) -> None:
    """``deepspeed``: a JSON file (or mapping) that is a DeepSpeed config, DeepSpeed installed, and a GPU to run it on;
    each refused in one line before transformers builds its DeepSpeed config (which would fail with a bare library
    error, or on the CPU only at the first step, after DeepSpeed's own setup)."""
    import importlib.util
    import json

    if isinstance(value, str) and not value.lstrip().startswith("{"):
        file = Path(value).expanduser()
        if not file.is_file():
            raise ConfigError(f"deepspeed={value!r}: no such file; give a DeepSpeed JSON config (e.g. ds_zero2.json).")
        try:
            parsed = json.loads(file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            where = f" (line {error.lineno}, column {error.colno})" if hasattr(error, "lineno") else ""
            raise ConfigError(f"deepspeed={value!r}: not a JSON file{where}: {getattr(error, 'msg', error)}; a "
                              "DeepSpeed config is JSON (accelerate's YAML configs go to `accelerate launch "
                              "--config_file`).") from None  # fmt: skip
    elif isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError as error:
            raise ConfigError(f"deepspeed={value!r}: not valid JSON ({error}).") from None
    else:
        parsed = value
    if not isinstance(parsed, dict):
        raise ConfigError(f"deepspeed={value!r}: must be a JSON object of DeepSpeed settings, found a "
                          f"{type(parsed).__name__}.")  # fmt: skip
    if importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"deepspeed={value!r}: DeepSpeed is not installed; `pip install deepspeed`, or train "
                          "without it.")  # fmt: skip
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"deepspeed={value!r}: DeepSpeed runs on GPUs and none is visible here (on the CPU it fails "
                          "at the first step); train without it, or with several CPU processes through `accelerate "
                          "launch --multi_gpu --num_processes N` (configs/accelerate/multi_gpu.yaml).")  # fmt: skip
