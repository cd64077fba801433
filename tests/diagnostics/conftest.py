"""Real training logs for the diagnostics tests: the tiny model trained three steps on the demo task, once with
GRPO-SG weights and once with plain GRPO (``equal``), with TRL's completion logging on."""

from __future__ import annotations

import pytest

RUN_STEPS = 3


@pytest.fixture(scope="session")
def tiny_runs(tiny_model_path, tmp_path_factory):
    from helpers import make_trainer, tiny_config

    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for strategy in ("grpo_sg", "equal"):
        args = tiny_config(root / strategy, strategies=[strategy], per_device_train_batch_size=8, num_generations=4,
                           max_steps=RUN_STEPS, log_completions=True)
        trainer = make_trainer(tiny_model_path, args, train_dataset=64)
        trainer.train()
        trainer.save_state()
        runs[strategy] = root / strategy
    return runs
