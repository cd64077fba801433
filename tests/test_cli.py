"""`sharpgrpo SUBCOMMAND` (and `python -m sharpgrpo SUBCOMMAND`) runs each CLI exactly as `python -m MODULE` does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sharpgrpo.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]


def run(*args, timeout=300):
    env = {**os.environ, "SHARPGRPO_DEBUG": "0", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "sharpgrpo", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_no_command_prints_the_commands_and_fails():
    result = run()
    assert result.returncode == 2
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


def test_unknown_command_is_one_clear_error():
    result = run("fit")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == (
        "error: unknown command 'fit'; must be one of train, eval, compare, plot, tokens, record, serve, vllm-serve."
    )


def test_subcommand_help_is_the_module_help():
    command = "plot"
    module = COMMANDS[command][0]
    direct = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    via_cli = run(command, "--help")
    assert via_cli.returncode == direct.returncode == 0
    # the options listed are the module's own (argparse's program name aside)
    assert via_cli.stdout.split("options:")[-1] == direct.stdout.split("options:")[-1]


def test_train_runs_train_py_with_its_one_line_errors(tmp_path):
    result = run("train", "--config", str(REPO / "configs" / "demo.yaml"), "--thr_p", "nan",
                 "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("error: thr_p=nan: must be a finite number in [-1, 1].")
    assert not (tmp_path / "out").exists()


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'sharpgrpo = "sharpgrpo.cli:main"' in text


def test_each_subcommand_names_itself_in_its_usage():
    """`sharpgrpo CMD --help` and its errors say `usage: sharpgrpo CMD`, the documented form (not a file name)."""
    for command in ("eval", "compare", "plot", "tokens", "serve", "vllm-serve"):
        result = run(command, "--help")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: sharpgrpo {command} "), result.stdout.splitlines()[0]


def test_train_without_config_says_so_and_help_lists_config():
    """No `--config`: one line asking for one (not TRL's bf16/GPU error on a CPU); `--config` near the top of --help."""
    bare = run("train")
    assert bare.returncode == 1
    line = bare.stderr.strip().splitlines()[-1]
    assert line.startswith("error: sharpgrpo train needs --config: a YAML file or a shipped config's name, e.g. "
                           "`sharpgrpo train --config demo` (shipped: ")
    assert "bf16" not in line
    flags_only = run("train", "--max_steps", "1")
    if flags_only.returncode != 0:  # TRL's defaults fail on a CPU: the line says no config was read
        assert "(no --config was given, so TRL's defaults apply" in flags_only.stderr
    usage = run("train", "--help").stdout
    assert usage.startswith("usage: sharpgrpo train [-h] [--config CONFIG] ")
    assert "The YAML config: a file, or a shipped config's name (cw_grpo_math_cpu, " in " ".join(usage.split())


def test_train_help_lists_the_registered_datasets_and_rewards():
    from reward_fns import REWARD_FUNCTIONS

    from sharpgrpo.data.registry import DATASETS

    usage = " ".join(run("train", "--help").stdout.split())
    assert f"Registered: {', '.join(DATASETS.names())}." in usage
    assert f"Registered: {', '.join(REWARD_FUNCTIONS.names())}." in usage


@pytest.mark.slow  # builds the tiny model once (a 300-step warm start)
def test_the_tiny_model_says_when_it_is_built(tmp_path):
    code = "from sharpgrpo.models.prepared import resolve_model_name; resolve_model_name('sharpgrpo-tiny')"
    env = {**os.environ, "SHARPGRPO_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    first, again = (subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
                    for _ in range(2))  # fmt: skip
    assert first.returncode == again.returncode == 0, first.stderr[-2000:]
    notices = [line for line in first.stderr.splitlines() if line.startswith("[sharpgrpo] building sharpgrpo-tiny")]
    assert len(notices) == 1 and str(tmp_path) in notices[0]
    assert "[sharpgrpo] building" not in again.stderr  # built once, then reused silently


def test_vllm_serve_is_trls_command_with_the_weight_transfer_of_the_machine():
    """`sharpgrpo vllm-serve` builds TRL's `vllm serve` command line from the same options; only without CUDA is the
    weight-transfer engine sharpgrpo's file engine instead of TRL's NCCL (the command line is built, nothing is
    served)."""
    import json

    from trl.scripts.vllm_serve import build_command, make_parser

    from sharpgrpo.cli.vllm_serve import vllm_serve_argv

    argv = ["--model", "org/some-model", "--port", "8011", "--dtype", "float32", "--max-num-seqs", "4"]
    script_args, extra_args = make_parser().parse_args_and_config(args=argv, return_remaining_strings=True)
    trl_command = build_command(script_args, extra_args)
    trl_serve = trl_command[trl_command.index("serve"):]
    assert vllm_serve_argv(argv, cuda_available=True) == trl_serve
    on_cpu = vllm_serve_argv(argv, cuda_available=False)
    changed = [index for index, (ours, trls) in enumerate(zip(on_cpu, trl_serve, strict=True)) if ours != trls]
    assert [trl_serve[index - 1] for index in changed] == ["--weight-transfer-config"]
    assert json.loads(trl_serve[changed[0]]) == {"backend": "nccl"}
    assert json.loads(on_cpu[changed[0]]) == {"backend": "sharpgrpo_file"}
    assert on_cpu[-2:] == ["--max-num-seqs", "4"]  # vLLM's own options pass through
