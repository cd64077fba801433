"""What a training run shows and leaves behind: completions files, a quiet progress bar, a summary line, and the
check that a multi-process launch really started several processes."""

from __future__ import annotations

import os
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback


class CompletionsCallback(TrainerCallback):
    """Write the last generation batch's prompts, completions, rewards and advantages at every log step to
    ``output_dir/completions/completions_<step>.parquet``: the same columns and file names as TRL's
    ``log_completions`` (which also prints a rich table per step), read by ``sharpgrpo tokens``.

    ``advantage`` is the one trained on: with advantage strategies, each completion's mean token advantage after them
    (the trainer replaces TRL's value in ``trainer._logs``), TRL's group-normalised value in ``trl_advantage``."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_log(self, args, state, control, logs=None, **kwargs):
        trainer = self.trainer
        if not state.is_world_process_zero or trainer.log_completions or not trainer._logs["prompt"]:
            return control  # TRL writes the same file itself with `log_completions`
        import pandas as pd

        table = {
            "step": [state.global_step] * len(trainer._logs["prompt"]),
            "prompt": list(trainer._logs["prompt"]),
            "completion": list(trainer._logs["completion"]),
            **{name: list(values) for name, values in trainer._logs["rewards"].items()},
            **{name: list(values) for name, values in trainer._logs["extra"].items()},
            "advantage": list(trainer._logs["advantages"]),
        }
        folder = Path(args.output_dir) / "completions"
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(table).to_parquet(folder / f"completions_{state.global_step:05d}.parquet")
        return control


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar without its per-step metric dicts: loss and reward go to the bar's postfix."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs:
            shown = {k: logs[k] for k in ("loss", "reward") if isinstance(logs.get(k), (int, float))}
            # refresh now: the bar is next redrawn by the following step, so the last step would show the one before
            self.training_bar.set_postfix({k: f"{v:.3g}" for k, v in shown.items()}, refresh=True)

    @classmethod
    def install(cls, trainer) -> None:
        if trainer.pop_callback(ProgressCallback) is not None:
            trainer.add_callback(cls())


def _step_span(entries: list[dict]) -> str:
    """``step 4`` or ``steps 1-4``: the global steps of consecutive log entries."""
    steps = [e.get("step") for e in entries]
    if None in steps:  # entries not stamped by the Trainer: their positions
        return f"{len(entries)} logged steps"
    return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"


def training_summary(trainer, interrupted: bool = False) -> str:
    """One line: steps, mean reward over the first and last 10% of logged steps (naming the steps each mean
    covers), and where the outputs are."""
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    out = trainer.args.output_dir
    head = f"[sharpgrpo] {'interrupted' if interrupted else 'done'} at step {trainer.state.global_step}"
    if history:
        n = max(1, len(history) // 10)
        first = sum(e["reward"] for e in history[:n]) / n
        last = sum(e["reward"] for e in history[-n:]) / n
        head += (
            f"; mean reward {first:.3f} over {_step_span(history[:n])} -> {last:.3f} over {_step_span(history[-n:])}"
            f" (each mean covers {n} of the {len(history)} logged steps)"
        )
    head += constant_reward_note(trainer.state.log_history)
    if interrupted:
        return f"{head}; checkpoint and trainer_state.json in {out}; continue with --resume_from_checkpoint true"
    return f"{head}; model, trainer_state.json and plots in {out}"


def constant_reward_note(log_history: list[dict]) -> str:
    """What the summary says when no group ever had two different rewards (TRL's ``frac_reward_zero_std`` 1 at every
    logged step): every advantage was 0, so the policy loss trained nothing (a reward that cannot tell these
    completions apart, e.g. one that fails to parse any of them)."""
    fractions = [entry["frac_reward_zero_std"] for entry in log_history
                 if isinstance(entry.get("frac_reward_zero_std"), (int, float))]  # fmt: skip
    if not fractions or min(fractions) < 1.0:
        return ""
    rewards = sorted({round(float(e["reward"]), 6) for e in log_history if isinstance(e.get("reward"), (int, float))})
    said = f"{rewards[0]:g} " if len(rewards) == 1 else ""
    return (
        f"; WARNING: the reward was the same {said}for every completion of every group at all {len(fractions)} "
        "logged steps, so every advantage was 0 and the policy loss trained nothing; check that the reward function "
        "can tell these completions apart"
    )


def check_process_count() -> None:
    """Refuse ``accelerate launch --num_processes N`` (N > 1) that started ONE process.

    Without a config file or ``--multi_gpu``, ``accelerate launch`` on a machine without several GPUs uses its
    simple launcher: it starts one process (setting ``MASTER_ADDR``, but not ``WORLD_SIZE``), which would silently
    train alone with 1/N of the intended global batch."""
    env = os.environ
    if "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env and "WORLD_SIZE" not in env:
        raise SystemExit(
            "error: `accelerate launch --num_processes N` started ONE process: without a config file or "
            "`--multi_gpu`, accelerate only launches several processes when it sees several GPUs. On the CPU use "
            "`accelerate launch --multi_gpu --num_processes 2 --mixed_precision no -m sharpgrpo train --config ...` (with "
            "`use_cpu: true`, gloo), or `--config_file configs/accelerate/multi_gpu.yaml --num_processes 2`."
        )
