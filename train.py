"""Train a policy with SharpGRPOTrainer from a YAML config.

    python train.py --config configs/demo.yaml [--any_field value ...]
    accelerate launch --config_file configs/accelerate/zero3.yaml train.py --config configs/grpo_sg_kk_qwen2.5_3b.yaml

The YAML is flat: every field of `TaskArguments` (below), of `sharpgrpo.SharpGRPOConfig` (all of TRL's
`GRPOConfig` plus the strategies) and of TRL's `ModelConfig` (model, dtype, LoRA), plus an optional `env:` block
of environment variables. Command-line flags override the YAML (TRL's `TrlParser`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from transformers import AutoTokenizer
from trl import ModelConfig, TrlParser, get_peft_config

from reward_fns import get_reward_function
from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
from sharpgrpo.data import load_train_dataset
from sharpgrpo.tasks import register_tasks
from sharpgrpo.tiny import resolve_model_name


@dataclass
class TaskArguments:
    """What to train on and how it is scored."""

    dataset_name: str = field(
        default="demo",
        metadata={
            "help": "A registered dataset (demo, kk, kk_shared, math_eval), a local .jsonl/.json/.parquet file or "
            "folder, or a Hugging Face Hub id."
        },
    )
    dataset_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments of the dataset builder or loader (a YAML mapping, or JSON on the command "
            "line), e.g. {num_puzzles: 2000, min_people: 3, max_people: 7} for `kk`, or {column_mapping: "
            "{problem: prompt}, prompt_template: math, split: train} for a file or hub dataset."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["allowed_letters"],
        metadata={"help": "Reward functions by registered name (kk, math, qa_em, think_format, ...) or dotted path."},
    )
    plot: bool = field(default=True, metadata={"help": "Write training_curves.png into output_dir at the end."})


def main(task: TaskArguments, training_args: SharpGRPOConfig, model_args: ModelConfig) -> SharpGRPOTrainer:
    register_tasks()
    model_path = resolve_model_name(model_args.model_name_or_path or "sharpgrpo-tiny")
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    dataset_kwargs = task.dataset_kwargs or {}
    if isinstance(dataset_kwargs, str):
        dataset_kwargs = json.loads(dataset_kwargs)
    train_dataset = load_train_dataset(task.dataset_name, **dataset_kwargs)
    reward_funcs = [get_reward_function(name) for name in task.reward_funcs]

    model_init_kwargs = dict(training_args.model_init_kwargs or {})
    if model_args.dtype is not None:
        model_init_kwargs.setdefault("dtype", model_args.dtype)
    if model_args.attn_implementation is not None:
        model_init_kwargs.setdefault("attn_implementation", model_args.attn_implementation)
    training_args.model_init_kwargs = model_init_kwargs or None

    trainer = SharpGRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    trainer.save_model(training_args.output_dir)  # final weights (or adapters) + tokenizer + model card
    trainer.save_state()  # full log history in output_dir/trainer_state.json
    if trainer.is_world_process_zero():
        trainer.create_model_card(dataset_name=task.dataset_name)
        if task.plot:
            from sharpgrpo.plot import plot_training_curves

            plot_training_curves(training_args.output_dir, os.path.join(training_args.output_dir, "training_curves.png"))
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=task.dataset_name)
    return trainer


if __name__ == "__main__":
    parser = TrlParser((TaskArguments, SharpGRPOConfig, ModelConfig))
    main(*parser.parse_args_and_config())
