"""Reading a YAML config file: the one loader every entry point uses (it imports only PyYAML).

* A key written twice in one mapping is refused, naming the key and both lines (YAML keeps the last silently).
* Aliases are bounded: a document whose aliases expand to more than :data:`MAX_EXPANDED_NODES` nodes is refused
  before it is built (nested aliases grow exponentially: ten lines can stand for billions of values).
* The top level must be a mapping; a syntax error names the file, the line and the column.
* The ``env:`` block (``train.py``) must map names to scalars (a string, number or boolean); it is applied by
  :func:`apply_config_env` before transformers, datasets or the Hub client are imported, so settings such as
  ``HF_HUB_OFFLINE: "1"`` hold for every library of the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from sharpgrpo.validation import ConfigError, did_you_mean

MAX_EXPANDED_NODES = 100_000  # far above any real config (configs/ have < 200 values)
CONFIG_FLAG = "--config"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # PyYAML refuses unhashable keys itself
                line = key_node.start_mark.line + 1
                if key in first_line:
                    raise ConfigError(
                        f"{self.name}: line {line}: key {key!r} is already set on line {first_line[key]} of the same "
                        "mapping; keep one of them."
                    )
                first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node, sizes: dict[int, int], limit: int) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (memoised per node; stops past ``limit``)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = 1  # a recursive alias counts once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [child for pair in node.value for child in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, sizes, limit)
        if total > limit:
            break
    sizes[id(node)] = total
    return total


def read_yaml(path: str | os.PathLike, field: str = "config") -> Any:
    """The document of the YAML file ``path``, checked as the module docstring says; errors are one line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{field}={str(path)!r}: no such file.") from None
    except IsADirectoryError:
        raise ConfigError(f"{field}={str(path)!r}: is a directory, not a YAML file.") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{field}={str(path)!r}: not UTF-8 text (byte {error.start}).") from None
    except OSError as error:
        raise ConfigError(f"{field}={str(path)!r}: cannot be read ({error.strerror or error}).") from None
    loader = _StrictLoader(text)
    loader.name = str(path)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {}, MAX_EXPANDED_NODES)
        if size > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"{field}={str(path)!r}: its aliases expand to more than {MAX_EXPANDED_NODES:,} values; a config "
                "needs far fewer (nested aliases grow exponentially)."
            )
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        context = getattr(error, "context", None)
        raise ConfigError(
            f"{field}={str(path)!r}: {where}not valid YAML ({problem}{f', {context}' if context else ''})."
        ) from None
    except RecursionError:
        raise ConfigError(f"{field}={str(path)!r}: nested too deeply to be a config.") from None
    finally:
        loader.dispose()


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """A flat config file: a mapping of field names (strings) to values."""
    config = read_yaml(path)
    if not isinstance(config, dict):
        found = "an empty file" if config is None else f"a YAML {type(config).__name__}"
        raise ConfigError(f"config={str(path)!r}: must be a mapping of field: value lines, found {found}.")
    bad = [key for key in config if not isinstance(key, str)]
    if bad:
        raise ConfigError(f"config={str(path)!r}: key {bad[0]!r} is not a field name (a string).")
    return config


def env_block(config: dict[str, Any], path: str | os.PathLike) -> dict[str, str]:
    """The ``env:`` block as strings, refusing what is not a mapping of names to scalars."""
    env = config.get("env")
    if env is None:
        if "env" in config:
            raise ConfigError(f"config={str(path)!r}: env is empty; remove it or give NAME: value lines.")
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"config={str(path)!r}: env={env!r}: must be a mapping of environment variables.")
    values = {}
    for name, value in env.items():
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(f"config={str(path)!r}: env key {name!r} is not an environment variable name.")
        if isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (int, float, str)):
            value = str(value)
        else:
            raise ConfigError(
                f"config={str(path)!r}: env.{name}={value!r}: must be a string, number or boolean, not a "
                f"{type(value).__name__}."
            )
        if "\0" in value:
            raise ConfigError(f"config={str(path)!r}: env.{name} contains a NUL character.")
        values[name] = value
    return values


SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # `configs/` of a checkout links here


def shipped_config_names() -> list[str]:
    """The configs shipped with the package, by name (``demo``, ``smol_addition_demo``, ...)."""
    return sorted(path.stem for path in SHIPPED_CONFIGS.glob("*.yaml"))


def resolve_config_path(value: str) -> str:
    """``--config``'s value as a file: a path as given, or a shipped config's name (``demo`` ->
    ``sharpgrpo/configs/demo.yaml``) where no such file exists, so that an installed package finds its configs."""
    if Path(value).expanduser().exists() or "/" in value or os.sep in value:
        return value
    name = value[: -len(".yaml")] if value.endswith(".yaml") else value
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    if shipped.is_file():
        return str(shipped)
    if value.endswith((".yaml", ".yml")):
        return value  # a file name that does not exist: read_yaml names it
    raise ConfigError(
        f"{CONFIG_FLAG}={value!r}: no such file, and no shipped config of that name"
        f"{did_you_mean(name, shipped_config_names())} (shipped: {', '.join(shipped_config_names())}); give the path "
        "of a YAML config file."
    )


def config_path_from_args(args: list[str]) -> str | None:
    """The file named by ``--config`` (``--config PATH`` or ``--config=PATH``, a path or a shipped config's name,
    :func:`resolve_config_path`) in ``args``, or None without one."""
    for index, arg in enumerate(args):
        if arg.startswith(CONFIG_FLAG + "="):
            value = arg.split("=", 1)[1]
        elif arg == CONFIG_FLAG:
            value = args[index + 1] if index + 1 < len(args) else ""
            if value.startswith("--"):
                value = ""
        else:
            continue
        if not value:
            raise ConfigError(f"{CONFIG_FLAG} needs a value: the path of a YAML config file (e.g. configs/demo.yaml).")
        return resolve_config_path(value)
    return None


def apply_config_env(args: list[str]) -> dict[str, str]:
    """Set the ``env:`` block of the ``--config`` file named in ``args`` (call it before importing transformers,
    datasets or huggingface_hub: they read some variables once, on import). Returns what was set."""
    path = config_path_from_args(args)
    if path is None:
        return {}
    env = env_block(read_config(path), path)
    os.environ.update(env)
    return env
