"""How the tests build configs and trainers: on the CPU, nothing reported, the tiny model and the demo task.

``conftest.py`` puts this folder on ``sys.path`` (pytest's rootdir conftest), so any test imports it as
``from helpers import cpu_config, tiny_config, make_trainer``. The multi-process worker
(``integration/_launch_worker.py``) imports it the same way, with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # sharpgrpo (and with it TRL) is imported on first use, so that collecting the math tests stays fast
    from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer

# What every test config shares: the CPU in fp32 (bf16 off) and no logging service.
CPU = {"report_to": [], "use_cpu": True, "bf16": False}

# The tiny model's training runs: two groups of 8 completions of 8 tokens per step, a learning rate high enough that
# the tiny model moves in a step or two, one log line per step, no checkpoints, seed 0.
TINY_TRAINING = {
    "per_device_train_batch_size": 16, "num_generations": 8, "max_completion_length": 8, "learning_rate": 1e-3,
    "logging_steps": 1, "save_strategy": "no", "seed": 0,
}


def cpu_config(output_dir: str | Path, **overrides) -> SharpGRPOConfig:
    """``SharpGRPOConfig`` with ``CPU`` and only the given ``overrides`` (TRL's defaults for everything else)."""
    from sharpgrpo import SharpGRPOConfig

    return SharpGRPOConfig(output_dir=str(output_dir), **{**CPU, **overrides})


def tiny_config(output_dir: str | Path, **overrides) -> SharpGRPOConfig:
    """``cpu_config`` with ``TINY_TRAINING``; ``overrides`` replace any of them."""
    return cpu_config(output_dir, **{**TINY_TRAINING, **overrides})


def make_trainer(
    model_path: str | Path,
    args: SharpGRPOConfig,
    reward_funcs: Sequence[Callable] | None = None,
    train_dataset=64,
    trainer_class: type[SharpGRPOTrainer] | None = None,
) -> SharpGRPOTrainer:
    """A trainer on ``model_path`` with its own tokenizer. ``reward_funcs`` default to the demo task's
    ``allowed_letters_reward``, ``train_dataset`` is a dataset or a number of demo prompts
    (``sharpgrpo.data.demo.demo_dataset``), ``trainer_class`` defaults to ``SharpGRPOTrainer``."""
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset

    trainer_class = trainer_class or SharpGRPOTrainer
    reward_funcs = reward_funcs or [allowed_letters_reward]

    return trainer_class(
        model=str(model_path),
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=demo_dataset(train_dataset) if isinstance(train_dataset, int) else train_dataset,
        processing_class=AutoTokenizer.from_pretrained(model_path),
    )


def binary_letters_reward(prompts, completions, allowed, **kwargs):
    """The demo reward thresholded at 0.5: binary, so that every strategy applies (pass@k and THR need correct and
    incorrect completions in a group)."""
    from sharpgrpo.data.demo import allowed_letters_reward

    return [float(r >= 0.5) for r in allowed_letters_reward(prompts, completions, allowed)]


def write_jsonl(path: Path, rows) -> str:
    """``rows`` as a JSON-lines file at ``path`` (one object a line); returns the path as a string."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def sampling_trainer(model_path: str | Path, output_dir: str | Path, **overrides) -> SharpGRPOTrainer:
    """Two groups of 8 completions of 8 tokens at temperature 0.8, binary rewards; the model in training mode."""
    args = cpu_config(output_dir, per_device_train_batch_size=16, num_generations=8, max_completion_length=8,
                      temperature=0.8, seed=0, **overrides)
    trainer = make_trainer(model_path, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    trainer.model.train()
    return trainer


def generate_batch(trainer: SharpGRPOTrainer, capture: bool) -> dict:
    """One generation batch of ``sampling_trainer``'s two demo groups, seeded; ``capture``: ``generation_capture``."""
    import torch

    from sharpgrpo.data.demo import demo_dataset

    trainer.args.generation_capture = capture
    torch.manual_seed(3)
    return trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])


def disk_listing(root: str | Path) -> dict[str, tuple[int, str]]:
    """Everything under ``root``: each file's path relative to ``root`` -> (size, sha256 of its bytes), each folder
    -> (-1, ""). Two listings are equal only when nothing was added, removed or changed, so a test of a refused
    command compares the listing before and after it."""
    import hashlib

    root = Path(root)
    listing: dict[str, tuple[int, str]] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_dir() and not path.is_symlink():
            listing[name] = (-1, "")
        else:
            data = path.read_bytes() if path.is_file() else b""
            listing[name] = (len(data), hashlib.sha256(data).hexdigest())
    return listing
