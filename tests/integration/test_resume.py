"""A run stopped at step k and resumed from its checkpoint continues exactly like the uninterrupted run.

Design. A 4-step run saves ``checkpoint-2``; a second trainer resumes from it (the checkpoint of a run stopped at step
2 is the same folder) and must log the same losses, gradient norms and weight statistics at steps 3-4. Seeded CPU
training with TRL's own sampling: the checkpoint restores the weights, Adam's state, the scheduler, every random
stream (transformers' ``rng_state.pth``) and the strategies' state (``sharpgrpo_strategy_state.pt``: the `random`
strategy's generator, the trainer's generation counter). Generation batches: TRL generates once per
``steps_per_generation`` steps and buffers the batch (``_buffered_inputs``), which a checkpoint does not hold; a
resumed run generates a fresh batch at its first step. With ``steps_per_generation=2`` the checkpoint at step 2 is a
generation boundary, so the uninterrupted run also generates at step 3 and the losses are comparable (resuming
mid-buffer, at an odd step, would regenerate a batch the uninterrupted run reuses; the losses would then differ even
though the resume is correct). Multi-process resume is tested in test_multiprocess.py.
"""

from __future__ import annotations

import os

import pytest
import torch
from _launch_worker import run_case

pytestmark = pytest.mark.slow

OPTIONS = dict(
    generation="trl", per_device_train_batch_size=8, max_steps=4, save_strategy="steps", save_steps=2,
    steps_per_generation=2, optim="adamw_torch", learning_rate=1e-2,
)
COMPARED = ("loss", "grad_norm", "token_weight/mean", "token_weight/std", "token_weight/max")


def logged(result: dict, steps=(3, 4)) -> list[float]:
    """The compared metrics of the given steps, flat (pytest.approx takes no nested sequences)."""
    by_step = {entry["step"]: entry for entry in result["log"]}
    return [by_step[step][key] for step in steps for key in COMPARED]


@pytest.mark.parametrize("strategies", ["random", "grpo_sg"])
def test_resumed_run_continues_exactly(tiny_model_path, tmp_path, strategies):
    full = run_case(tiny_model_path, str(tmp_path / "full"), strategies=strategies, **OPTIONS)
    checkpoint = tmp_path / "full" / "checkpoint-2"
    state = torch.load(checkpoint / "sharpgrpo_strategy_state.pt", weights_only=True)
    assert state["generation_count"] == 1
    resumed = run_case(
        tiny_model_path, str(tmp_path / "resumed"), strategies=strategies, resume_from_checkpoint=str(checkpoint),
        **OPTIONS,
    )
    assert logged(resumed) == pytest.approx(logged(full), abs=1e-7)
    assert resumed["strategy_state"] == full["strategy_state"]
    assert resumed["param_sum"] == pytest.approx(full["param_sum"], abs=1e-9)
    if strategies == "random":
        # Without the strategy state the generator restarts from its seed: the same checkpoint then gives other
        # weights, hence other losses (so the file is what makes the resume exact).
        os.remove(checkpoint / "sharpgrpo_strategy_state.pt")
        restarted = run_case(
            tiny_model_path, str(tmp_path / "restarted"), strategies=strategies,
            resume_from_checkpoint=str(checkpoint), **OPTIONS,
        )
        assert logged(restarted) != pytest.approx(logged(full), abs=1e-7)
