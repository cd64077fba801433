"""The config file means what it says, and every parse error is one line.

The YAML loader (``sharpgrpo.run.config_file``) refuses a duplicated key naming both lines, bounds aliases, refuses a
non-scalar ``env:`` value and applies the ``env:`` block before transformers and the Hub client are imported; the
parser (``sharpgrpo.run.config_parser``) turns argparse's usage block into one line naming the field and the value.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cpu_config
from trl import ModelConfig

from sharpgrpo import SharpGRPOConfig
from sharpgrpo.run.config_file import MAX_EXPANDED_NODES, apply_config_env, config_path_from_args, read_config
from sharpgrpo.run.config_parser import ConfigParser
from sharpgrpo.search.config import SearchArguments
from sharpgrpo.validation import ConfigError

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def parse(args: list[str]):
    from sharpgrpo.cli import train

    parser = ConfigParser((train.TaskArguments, SharpGRPOConfig, ModelConfig, SearchArguments))
    return parser.parse_args_and_config(args)


def test_a_duplicated_key_is_refused_naming_it_and_both_lines(tmp_path):
    path = write(tmp_path, "strategies: grpo_sg\noutput_dir: out\nstrategies: equal\n")
    with pytest.raises(ConfigError, match=r"line 3: key 'strategies' is already set on line 1"):
        read_config(path)
    nested = write(tmp_path, "dataset_kwargs:\n  num_prompts: 8\n  num_prompts: 9\n", "nested.yaml")
    with pytest.raises(ConfigError, match=r"line 3: key 'num_prompts' is already set on line 2"):
        read_config(nested)


def test_the_parser_refuses_the_duplicate_that_trained_plain_grpo(tmp_path, restore_environment):
    path = write(tmp_path, f"output_dir: {tmp_path / 'run'}\nstrategies: grpo_sg\nstrategies: equal\n")
    with pytest.raises(ConfigError, match="'strategies' is already set on line 2"):
        parse(["--config", str(path)])


def test_aliases_and_merge_keys_still_work(tmp_path):
    path = write(tmp_path, "base: &b {num_prompts: 8}\ndataset_kwargs:\n  <<: *b\n  seed: 1\nother: *b\n")
    assert read_config(path) == {
        "base": {"num_prompts": 8}, "dataset_kwargs": {"num_prompts": 8, "seed": 1}, "other": {"num_prompts": 8}
    }  # fmt: skip


def test_aliases_that_expand_without_bound_are_refused_fast(tmp_path):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]  # 10**10 values
    path = write(tmp_path, "\n".join(levels) + "\n")
    started = time.process_time()
    with pytest.raises(ConfigError, match=f"more than {MAX_EXPANDED_NODES:,} values"):
        read_config(path)
    assert time.process_time() - started < 5


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("env:\n  HF_HUB_OFFLINE: [1]\n", r"env.HF_HUB_OFFLINE=\[1\]: must be a string, number or boolean"),
        ("env:\n  A: {b: 1}\n", "env.A="),
        ("env:\n  A: null\n", "env.A=None"),
        ("env: [A]\n", "must be a mapping of environment variables"),
        ("- a\n- b\n", "must be a mapping of field: value lines, found a YAML list"),
        ("", "found an empty file"),
        ("a: [1\n", r"line 2, column 1: not valid YAML"),
    ],
)
def test_bad_files_and_env_blocks_are_one_line(tmp_path, text, fragment, restore_environment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=fragment) as raised:
        apply_config_env(["--config", str(path)])
    assert "\n" not in str(raised.value)


def test_config_flag_without_value_is_one_line():
    for args in (["--config"], ["--max_steps", "2", "--config", "--seed", "1"], ["--config="]):
        with pytest.raises(ConfigError, match="--config needs a value"):
            config_path_from_args(args)
    assert config_path_from_args(["--config=a.yaml"]) == "a.yaml"
    with pytest.raises(ConfigError, match=r"config='missing.yaml': no such file"):
        apply_config_env(["--config", "missing.yaml"])


@pytest.mark.parametrize(
    "yaml_line, args, fragment",
    [
        ('num_generations: "eight"', [], r"^num_generations: invalid int value: 'eight'"),
        ("", ["--bf16", "maybe"], r"^bf16: Truthy value expected: got maybe"),
        ("", ["--max_steps", "ten"], r"^max_steps: invalid int value: 'ten'"),
        ("stratgies: equal", [], r"stratgies is not a field of sharpgrpo train \(did you mean strategies\?\)"),
    ],
)
def test_type_errors_are_one_line_naming_field_and_value(tmp_path, yaml_line, args, fragment, restore_environment):
    path = write(tmp_path, f"output_dir: {tmp_path / 'run'}\n{yaml_line}\n")
    with pytest.raises(ConfigError, match=fragment) as raised:
        parse(["--config", str(path), *args])
    assert "\n" not in str(raised.value) and "usage:" not in str(raised.value)


def test_a_strategy_module_that_raises_on_import_names_the_field(tmp_path, monkeypatch, restore_environment):
    (tmp_path / "broken_strategy.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^strategies=\['broken_strategy.Thing'\]: Importing module "
                       r"'broken_strategy' for 'broken_strategy.Thing' raised RuntimeError: no GPU here"):  # fmt: skip
        cpu_config(tmp_path / "run", strategies="broken_strategy.Thing")


def test_env_block_is_applied_before_transformers_and_the_hub_client_import(tmp_path):
    """``HF_HUB_OFFLINE`` is read once, when huggingface_hub (and datasets) are imported: set by the config's env
    block, it must be in force in both (TRL's parser applied it after they were imported, so datasets went online)."""
    config = write(tmp_path, f"env:\n  HF_HUB_OFFLINE: '1'\noutput_dir: {tmp_path / 'run'}\nsg_tau: .nan\n")
    probe = (
        "import sys, train\n"
        "try:\n    train.cli(['--config', sys.argv[1]])\nexcept SystemExit as stop:\n    print('exit', stop.code)\n"
        "import huggingface_hub.constants as hub, datasets.config as ds\n"
        "print('offline', hub.HF_HUB_OFFLINE, ds.HF_HUB_OFFLINE)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", probe, str(config)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=REPO, check=False)  # fmt: skip
    assert "exit 1" in done.stdout, done.stderr[-2000:]
    assert "error: sg_tau=nan: must be a finite number > 0" in done.stderr  # the run stopped at the config check
    assert "offline True True" in done.stdout, done.stdout
