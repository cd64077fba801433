"""The code blocks of the README and of every page under docs/ (the documentation site), as a reader copies them:
every ``python`` block runs as written (offline, on the CPU, in an empty folder), and every ``sharpgrpo`` /
``train.py`` command of a ``bash`` block names a command that exists, options that its ``--help`` lists, and a
config that resolves."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sharpgrpo.cli import COMMANDS

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>\w*)[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)


DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_blocks(language: str) -> list[str]:
    """The fenced blocks of ``language`` of the README and every docs page, dedented (blocks inside list items are
    indented)."""
    return [textwrap.dedent(m["body"]) for page in DOC_PAGES for m in FENCE.finditer(page.read_text(encoding="utf-8"))
            if m["lang"] == language]


def documented_commands() -> list[tuple[str, list[str], str]]:
    """``(subcommand, its arguments, the line as written)`` of every sharpgrpo command in the docs' bash blocks:
    ``sharpgrpo SUB ...``, ``python -m sharpgrpo SUB ...`` and ``[accelerate launch ...] train.py ...`` (train)."""
    commands = []
    for block in readme_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"\s&&\s|;\s", line):
                words = [w.lstrip("[").rstrip("]") for w in shlex.split(part, comments=True)]
                words = [w for w in words if w and w != "..."]
                for index, word in enumerate(words):
                    if word == "sharpgrpo" and index + 1 < len(words) and (index == 0 or words[index - 1] in
                                                                           ("-m", "python", "python3")):  # fmt: skip
                        commands.append((words[index + 1], words[index + 2:], part.strip()))
                        break
                    if word == "train.py":
                        commands.append(("train", words[index + 1:], part.strip()))
                        break
    return commands


HELP_SCRIPT = """
import contextlib, io, json, runpy, sys
from sharpgrpo.cli import COMMANDS
texts = {}
for name, (module, _) in COMMANDS.items():
    sys.argv = [f"sharpgrpo {name}", "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            assert stop.code in (0, None), (name, stop.code)
    texts[name] = out.getvalue()
print(json.dumps(texts))
"""


@pytest.fixture(scope="module")
def help_texts() -> dict[str, str]:
    """Every subcommand's ``--help`` output (one process for all: the imports are paid once)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "SHARPGRPO_DEBUG": "0"}
    done = subprocess.run([sys.executable, "-c", HELP_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_docs_document_every_command():
    documented = {name for name, _, _ in documented_commands()}
    assert set(COMMANDS) - {"serve"} <= documented, documented  # serve: the Search section's prose names it
    assert len(documented_commands()) >= 15


def test_every_documented_command_and_option_exists(help_texts):
    from sharpgrpo.run.config_file import resolve_config_path

    for name, args, line in documented_commands():
        assert name in COMMANDS, f"docs: `{line}`: no command {name!r}"
        for index, word in enumerate(args):
            if not word.startswith("--"):
                continue
            option = word.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_texts[name]), (
                f"docs: `{line}`: `sharpgrpo {name} --help` lists no {option}"
            )
            if option == "--config" and name in ("train", "compare"):
                value = args[index + 1]
                assert Path(resolve_config_path(str(REPO / value) if "/" in value else value)).is_file(), line


@pytest.mark.slow
def test_python_blocks_run_as_written(tmp_path):
    """Each block in a fresh interpreter in an empty folder, offline (the Python API example trains a few steps of
    the tiny model on the CPU)."""
    blocks = readme_blocks("python")
    assert any("SharpGRPOTrainer(" in block for block in blocks)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", OMP_NUM_THREADS="2")
    for index, block in enumerate(blocks):
        folder = tmp_path / f"block{index}"
        folder.mkdir()
        probe = "\nprint('GLOBAL_STEP', trainer.state.global_step)\n" if "trainer.train()" in block else ""
        (folder / "block.py").write_text(block + probe)  # the block as written, then what it trained
        done = subprocess.run([sys.executable, "block.py"], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == 0, f"docs python block {index}:\n{block}\n{done.stderr[-3000:]}"
        # no raw Python warning with a library's source line (transformers' renamed gradient_checkpointing, ...)
        assert "Warning: " not in done.stderr and "warnings.warn(" not in done.stderr, done.stderr[-3000:]
        if probe:
            steps = int(done.stdout.split("GLOBAL_STEP")[-1])
            assert steps == int(re.search(r"max_steps=(\d+)", block)[1])
