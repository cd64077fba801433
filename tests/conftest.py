"""Shared fixtures: offline Hub settings and the tiny model built once per test session.

Configs and trainers come from ``helpers.py`` beside this file (``cpu_config``, ``tiny_config``, ``make_trainer``);
pytest puts this folder on ``sys.path`` when it loads this conftest, so every test imports ``helpers`` directly.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Triton kernels (sharpgrpo/strategies/_thr_triton.py) are tested in Triton's CPU interpreter, which must be on
# before anything (transformers, trl) imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny Qwen2 and its tokenizer, built locally (no download) and loaded by path like any hub model."""
    from sharpgrpo.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2"))


@pytest.fixture(scope="session")
def tiny_moe_path(tmp_path_factory):
    """``sharpgrpo-tiny-moe``'s architecture (a 2-layer Qwen3-MoE, 4 experts, top-2), randomly initialised (no warm
    start: seconds), built locally and loaded by path."""
    from sharpgrpo.models.tiny import build_tiny_model
    from sharpgrpo.models.tiny_moe import TINY_MOE_CONFIG

    directory = tmp_path_factory.mktemp("tiny") / "qwen3_moe"
    return str(build_tiny_model(directory, architecture="qwen3_moe", extra_config=TINY_MOE_CONFIG, warm_start_steps=0))


@pytest.fixture
def restore_environment():
    """TrlParser exports a config's `env:` block into os.environ; undo that after the test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
