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
        # Without the strategy state the generator would restart from its seed (other weights, other losses): such a
        # checkpoint is refused, naming the file, instead of resuming with fresh state.
        from sharpgrpo.run.lifecycle import CheckpointError

        os.remove(checkpoint / "sharpgrpo_strategy_state.pt")
        with pytest.raises(CheckpointError, match="lacks sharpgrpo_strategy_state.pt"):
            run_case(tiny_model_path, str(tmp_path / "restarted"), strategies=strategies,
                     resume_from_checkpoint=str(checkpoint), **OPTIONS)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# Every piece of state (issue 42): loss, every weight, the optimizer and every stateful strategy's state.


def stateful_strategies() -> set[str]:
    """Registered strategies whose state_dict() holds something (they override Strategy.state_dict)."""
    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.strategies.base import Strategy

    return {name for name in STRATEGIES.names() if STRATEGIES.get(name).state_dict is not Strategy.state_dict}


# Each stateful strategy, composed where they compose (one weight strategy and loss strategies): one pair of runs.
# opd / iw_opd keep state with teacher_model: ema, sdpo with sdpo_teacher: ema (the EMA teacher's weights, one copy,
# carried by the first of them: run once with each holder first).
EVERY_STATE = ["random", "clip_cov", "opd", "iw_opd", "sdpo", "rlsd"]
STATE_SETTINGS = {"teacher_model": "ema", "sdpo_teacher": "ema", "teacher_ema_decay": 0.5}
HOLDERS = {"opd": "OnPolicyDistillationStrategy", "sdpo": "SelfDistillationStrategy"}


def test_every_stateful_strategy_is_resumed_here():
    assert stateful_strategies() <= set(EVERY_STATE), (
        f"{sorted(stateful_strategies() - set(EVERY_STATE))} keep state: add them to EVERY_STATE"
    )


def _train(model_path, output_dir, resume_from=None, **overrides):
    """A 4-step run saving checkpoint-2 (a generation boundary, module docstring); returns the trainer."""
    from helpers import make_trainer, tiny_config

    args = tiny_config(output_dir, per_device_train_batch_size=8, max_steps=4, save_strategy="steps", save_steps=2,
                       steps_per_generation=2, optim="adamw_torch", learning_rate=1e-2, **overrides)  # fmt: skip
    trainer = make_trainer(model_path, args, train_dataset=64)
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


def _state(trainer) -> dict:
    """Everything that must match: per-step losses, every weight, the optimizer's state, the strategies' state."""
    optimizer = trainer.optimizer.state_dict()
    return {
        "loss": [(e["step"], e["loss"], e.get("grad_norm")) for e in trainer.state.log_history if "loss" in e],
        "weights": {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()},
        "optimizer": {(key, name): value.clone() for key, group in optimizer["state"].items()
                      for name, value in group.items() if torch.is_tensor(value)},  # fmt: skip
        "strategies": {name: {k: v.tolist() if torch.is_tensor(v) else v for k, v in state.items()}
                       for name, state in trainer.strategy_state().items()},  # fmt: skip
        "generation_count": trainer._generation_count,
    }


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_an_interrupted_and_resumed_run_equals_the_uninterrupted_one_in_every_piece_of_state(tiny_model_path, tmp_path,
                                                                                          holder):
    """The run is cut after checkpoint-2 (a second trainer resumes from that folder, which is what a run killed
    after saving it leaves) and must end where the uninterrupted run ends: the same losses at steps 3-4, bit-equal
    weights and Adam moments, the same generator states of every stateful strategy and the same generation count.
    ``holder``: the EMA teacher's user listed first (it carries the average)."""
    strategies = ",".join(sorted(EVERY_STATE, key=lambda name: name != holder))
    full = _state(_train(tiny_model_path, tmp_path / "full", strategies=strategies, **STATE_SETTINGS))
    checkpoint = tmp_path / "full" / "checkpoint-2"
    resumed = _state(_train(tiny_model_path, tmp_path / "resumed", resume_from=str(checkpoint), strategies=strategies,
                            **STATE_SETTINGS))
    later = [[value for value in entry[1:]] for entry in resumed["loss"] if entry[0] > 2]
    assert [e[0] for e in resumed["loss"] if e[0] > 2] == [3, 4]
    assert sum(later, []) == pytest.approx(sum([list(e[1:]) for e in full["loss"] if e[0] > 2], []), abs=1e-7)
    assert resumed["weights"].keys() == full["weights"].keys()
    for name, tensor in full["weights"].items():
        torch.testing.assert_close(resumed["weights"][name], tensor, rtol=0, atol=1e-7, msg=name)
    assert resumed["optimizer"].keys() == full["optimizer"].keys()
    for key, tensor in full["optimizer"].items():
        torch.testing.assert_close(resumed["optimizer"][key], tensor, rtol=0, atol=1e-7, msg=str(key))
    assert set(resumed["strategies"]) == set(full["strategies"]) and resumed["strategies"] == full["strategies"]
    assert [name for name in HOLDERS.values() if full["strategies"][name]] == [HOLDERS[holder]]
    assert resumed["generation_count"] == full["generation_count"]
    # Without the strategy state the resume is refused naming the file (no silent fresh generators).
    from sharpgrpo.run.lifecycle import CheckpointError, resolve_resume_checkpoint

    (checkpoint / "sharpgrpo_strategy_state.pt").unlink()
    with pytest.raises(CheckpointError, match="lacks sharpgrpo_strategy_state.pt"):
        resolve_resume_checkpoint(str(checkpoint), str(tmp_path / "full"))
