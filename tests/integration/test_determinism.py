"""Bit-for-bit reruns (docs/comparing.md, "Run records..."): with ``full_determinism: true`` and a ``seed``, two
runs on one machine log the same numbers, every one, and end with the same weights, bit for bit; a run with another
seed differs. Real training of the tiny model (3 steps, a weight strategy, sampling at temperature 1), in this process.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from helpers import make_trainer, tiny_config

# Wall-clock figures: the only logged numbers a rerun may change.
WALL_CLOCK = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time")


@pytest.fixture
def deterministic_mode():
    """``full_determinism`` switches torch's deterministic algorithms on and sets environment variables for the
    process (transformers' ``enable_full_determinism``): put both back after the test."""
    saved = dict(os.environ)
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic = before[1]
    os.environ.clear()
    os.environ.update(saved)


def run(tmp_path, model_path, name: str, seed: int):
    args = tiny_config(tmp_path / name, max_steps=3, full_determinism=True, seed=seed, strategies=["grpo_sg"],
                       temperature=1.0)  # fmt: skip
    trainer = make_trainer(model_path, args)
    trainer.train()
    numbers = [{k: v for k, v in entry.items() if isinstance(v, (int, float)) and not k.endswith(WALL_CLOCK)}
               for entry in trainer.state.log_history]  # fmt: skip
    weights = {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}
    return numbers, weights


@pytest.mark.slow
def test_two_runs_are_identical_and_another_seed_differs(tiny_model_path, tmp_path, deterministic_mode):
    first_numbers, first_weights = run(tmp_path, tiny_model_path, "first", seed=3)
    second_numbers, second_weights = run(tmp_path, tiny_model_path, "second", seed=3)
    other_numbers, other_weights = run(tmp_path, tiny_model_path, "other", seed=4)

    assert len(first_numbers) == 4 and sum("loss" in entry for entry in first_numbers) == 3  # 3 steps and the total
    assert any(k.startswith("token_weight/") for k in first_numbers[0])  # the strategy's metrics are compared too
    # every logged number, bit for bit (NaN where both are NaN), and every weight
    for first, second in zip(first_numbers, second_numbers, strict=True):
        assert first.keys() == second.keys()
        for key in first:
            a, b = first[key], second[key]
            assert a == b or (math.isnan(a) and math.isnan(b)), (key, a, b)
    assert first_weights.keys() == second_weights.keys()
    for name, value in first_weights.items():
        assert torch.equal(value, second_weights[name]), name
    # the initial weights are the same model's: the training changed them, and another seed trained them otherwise
    changed = [name for name, value in first_weights.items() if not torch.equal(value, other_weights[name])]
    assert changed, "another seed ended with the same weights"
    assert any(first.get("loss") != other.get("loss") or first.get("reward") != other.get("reward")
               for first, other in zip(first_numbers, other_numbers, strict=True))  # fmt: skip
    # the run records say what made them differ: the folder alone for the reruns, the seed as well for the third
    from sharpgrpo.run.run_record import read_run_record, record_differences

    first, second, other = (read_run_record(tmp_path / name) for name in ("first", "second", "other"))
    folders = {"config.output_dir", "config.logging_dir", "config.run_name"}
    assert {field for field, _, _ in record_differences(first, second)} <= folders
    assert {field for field, _, _ in record_differences(first, other)} - folders == {"config.seed", "seeds.seed"}
