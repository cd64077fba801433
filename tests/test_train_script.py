"""train.py end to end as a user runs it (a subprocess on the demo config with CLI overrides)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def test_demo_config_with_overrides(tmp_path):
    output_dir = tmp_path / "run"
    env = {**os.environ, "SHARPGRPO_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "train.py", "--config", "configs/demo.yaml",
        "--strategies", "reverse", "--max_steps", "3", "--output_dir", str(output_dir),
    ]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # The embedded default was built locally and loaded by path.
    assert (tmp_path / "cache").is_dir() and any((tmp_path / "cache").glob("tiny-qwen2-*/config.json"))
    state = json.loads((output_dir / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert len(steps) == 3  # --max_steps override
    # The summary line names the steps each mean covers (10% of 3 logged steps: one each).
    first, last = steps[0]["reward"], steps[-1]["reward"]
    assert (
        f"mean reward {first:.3f} over step 1 -> {last:.3f} over step 3 (each mean covers 1 of the 3 logged steps)"
        in result.stderr
    ), result.stderr[-1000:]
    assert all(0.6 - 1e-6 <= e["token_weight/min"] <= e["token_weight/max"] <= 1.0 + 1e-6 for e in steps)  # reverse
    assert (output_dir / "training_curves.png").stat().st_size > 10_000
    assert (output_dir / "model.safetensors").exists() and (output_dir / "tokenizer_config.json").exists()
    card = (output_dir / "README.md").read_text()
    assert "## sharpgrpo strategies" in card and "**`reverse`**" in card and "sg_tau=0.111" in card
    assert "Sharpness-Guided Group Relative Policy Optimization" in card


def test_unknown_strategy_fails_before_loading_a_model(tmp_path):
    env = {**os.environ, "SHARPGRPO_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "train.py", "--config", "configs/demo.yaml", "--strategies", "grpo_sgg"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Unknown strategy 'grpo_sgg' (did you mean grpo_sg?). Valid names:" in result.stderr
    assert not (tmp_path / "cache").exists()  # failed at config parsing, before building or loading a model
