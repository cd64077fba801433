"""Real training logs for the diagnostics tests: the tiny model trained three steps on the demo task, once with
GRPO-SG weights and once with plain GRPO (``equal``), with TRL's completion logging on."""

from __future__ import annotations

import pytest

RUN_STEPS = 3


@pytest.fixture(scope="session")
def tiny_runs(tiny_model_path, tmp_path_factory):
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
    from sharpgrpo.demo import allowed_letters_reward, demo_dataset

    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for strategy in ("grpo_sg", "equal"):
        args = SharpGRPOConfig(
            output_dir=str(root / strategy),
            strategies=[strategy],
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=8,
            max_steps=RUN_STEPS,
            logging_steps=1,
            learning_rate=1e-3,
            report_to=[],
            bf16=False,
            use_cpu=True,
            save_strategy="no",
            log_completions=True,
            seed=0,
        )
        trainer = SharpGRPOTrainer(
            model=tiny_model_path,
            reward_funcs=[allowed_letters_reward],
            args=args,
            train_dataset=demo_dataset(64),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
        )
        trainer.train()
        trainer.save_state()
        runs[strategy] = root / strategy
    return runs
