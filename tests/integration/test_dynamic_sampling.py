"""Dynamic sampling with refill (docs/methods.md §15.5).

The group filter against verl's (verl-project/verl@1dda039 ``verl/trainer/ppo/v1/replay_buffer.py`` L293-297,
reproduced: a group is dropped when ``len(values) > 1 and np.std(values) == 0.0``); the row joining of several
rounds; and training on the tiny model, where the task is solved for most prompts at the start.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sharpgrpo.training.generation.dynamic_sampling import draw_prompt_indices, groups_pass, merge_outputs, pad_cat


def verl_dropped(values: list[float]) -> bool:  # replay_buffer.py L295: classified (dropped) when not None
    return (float(values[0]) if len(values) > 1 and float(np.std(values)) == 0.0 else None) is not None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_filter_matches_verls_on_rewards_without_rounding(seed):
    rng = random.Random(seed)
    G, groups = 4, 200
    values = []
    for _ in range(groups):
        kind = rng.random()
        if kind < 0.4:  # binary accuracy, often all 0 or all 1
            values += [float(rng.random() < rng.choice([0.0, 0.5, 1.0])) for _ in range(G)]
        elif kind < 0.7:  # a small integer reward (K&K's -2..3 style), sometimes all equal
            level = rng.randint(-2, 3)
            values += [float(level if rng.random() < 0.7 else rng.randint(-2, 3)) for _ in range(G)]
        else:  # continuous
            values += [rng.gauss(0, 1) for _ in range(G)]
    got = groups_pass(torch.tensor(values, dtype=torch.float64), G)
    expected = [not verl_dropped(values[i * G:(i + 1) * G]) for i in range(groups)]
    assert got.tolist() == expected
    assert 0 < sum(expected) < groups  # both kinds present: the comparison can fail


def test_group_filter_on_equal_floats_and_missing_values():
    """Equal rewards fail whatever their mean rounds to (verl's float std keeps [0.1] * 3: the documented
    difference); NaN (a reward function that skipped the row) is left out; one value left fails."""
    assert float(np.std([0.1, 0.1, 0.1])) > 0  # why max > min is used instead of std > 0
    nan = float("nan")
    values = torch.tensor([0.1, 0.1, 0.1, 1.0, nan, 0.0, nan, nan, 1.0, 2.0, 2.0, nan], dtype=torch.float64)
    assert groups_pass(values, 3).tolist() == [False, True, False, False]


def test_prompt_draw_is_seeded_distinct_and_covers_small_sets():
    first = draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=1)
    assert first == draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=1)  # resumable
    assert len(set(first)) == 8 and all(0 <= i < 50 for i in first)
    assert first != draw_prompt_indices(50, 8, seed=3, generation_index=2, round_index=2)
    assert first != draw_prompt_indices(50, 8, seed=3, generation_index=3, round_index=1)
    small = draw_prompt_indices(3, 8, seed=0, generation_index=0, round_index=1)
    assert len(small) == 8 and set(small) <= {0, 1, 2}


def test_rows_of_two_rounds_join_with_trls_padding():
    pad = 9
    first = {"prompt_ids": torch.tensor([[pad, 1, 2], [3, 4, 5]]), "prompt_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
             "completion_ids": torch.tensor([[6, 7], [8, pad]]), "completion_mask": torch.tensor([[1, 1], [1, 0]]),
             "advantages": torch.tensor([0.5, -0.5]), "num_items_in_batch": torch.tensor(3.0)}
    second = {"prompt_ids": torch.tensor([[1], [2]]), "prompt_mask": torch.tensor([[1], [1]]),
              "completion_ids": torch.tensor([[1, 2, 3], [4, pad, pad]]),
              "completion_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]), "advantages": torch.tensor([1.0, -1.0]),
              "num_items_in_batch": torch.tensor(4.0)}
    merged = merge_outputs([(first, torch.tensor([1])), (second, torch.tensor([0, 1]))], pad)
    assert "num_items_in_batch" not in merged  # recounted by the sampler over all processes
    assert merged["prompt_ids"].tolist() == [[3, 4, 5], [pad, pad, 1], [pad, pad, 2]]
    assert merged["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert merged["completion_ids"].tolist() == [[8, pad, pad], [1, 2, 3], [4, pad, pad]]
    assert merged["completion_mask"].tolist() == [[1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert merged["advantages"].tolist() == [-0.5, 1.0, -1.0]
    assert pad_cat([torch.ones(1, 2, 3), torch.zeros(2, 1, 3)], 5.0)[1:, 1].eq(5.0).all()


# --- training the tiny model ---------------------------------------------------------------------------------------
G = 4


def solved_often_reward(prompts, completions, allowed, **kwargs):
    """1 when at least a quarter of the first 8 letters are allowed: the warm-started tiny model solves most prompts
    (about 60% of its groups of 4 have all four completions at 1 in the first batch)."""
    from sharpgrpo.data.demo import allowed_letters_reward

    return [float(r >= 0.25) for r in allowed_letters_reward(prompts, completions, allowed)]


def constant_reward(prompts, completions, **kwargs):
    return [1.0] * len(completions)


def recording_trainer_class():
    from sharpgrpo import SharpGRPOTrainer

    class RecordingTrainer(SharpGRPOTrainer):
        """Keeps the rewards of every generation batch it trains on (the joined batch's generation record)."""

        trained_rewards: list

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                self.trained_rewards.append((self._generation.rewards_per_func[:, 0].clone(),
                                             output["advantages"].clone()))
            return output

    return RecordingTrainer


def equal_reward_groups(rewards: torch.Tensor) -> int:
    grouped = rewards.view(-1, G)
    return int((grouped.max(dim=1).values == grouped.min(dim=1).values).sum())


def train(tiny_model_path, output_dir, reward=solved_often_reward, **options):
    from helpers import make_trainer, tiny_config

    args = tiny_config(output_dir, per_device_train_batch_size=16, num_generations=G, max_steps=2, **options)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[reward], train_dataset=64,
                           trainer_class=recording_trainer_class())
    trainer.trained_rewards = []
    trainer.train()
    return trainer


@pytest.mark.slow
def test_trains_only_on_groups_with_signal_and_reports_the_refill(tiny_model_path, tmp_path):
    control = train(tiny_model_path, tmp_path / "control")
    # the control can fail the assertion below: without dynamic sampling its batches hold groups of equal rewards
    assert sum(equal_reward_groups(rewards) for rewards, _ in control.trained_rewards) >= 2
    trainer = train(tiny_model_path, tmp_path / "dynamic", dynamic_sampling=True, dynamic_sampling_max_rounds=6)
    assert len(trainer.trained_rewards) == 2
    for rewards, advantages in trainer.trained_rewards:
        assert rewards.shape == (16,) and advantages.shape == (16,)
        assert equal_reward_groups(rewards) == 0  # the fraction of zero-variance groups trained on is 0
        assert bool((advantages != 0).view(-1, G).any(dim=1).all())  # every group carries an advantage
    logged = [entry for entry in trainer.state.log_history if "dynamic_sampling/extra_rounds" in entry]
    assert len(logged) == 2
    for entry in logged:
        assert 0 <= entry["dynamic_sampling/extra_rounds"] <= 6
        assert entry["dynamic_sampling/groups_unfilled"] == 0
        generated = entry["dynamic_sampling/groups_generated"]
        assert generated == 4 * (entry["dynamic_sampling/extra_rounds"] + 1)
        assert generated == 4 + entry["dynamic_sampling/groups_dropped"] + entry["dynamic_sampling/groups_surplus"]
    assert sum(entry["dynamic_sampling/groups_dropped"] for entry in logged) >= 2
    assert sum(entry["dynamic_sampling/extra_rounds"] for entry in logged) >= 1
    # the completion table shows the rows trained on: its rewards are the last batch's
    table = list(trainer._logs["rewards"]["solved_often_reward"])
    assert table == trainer.trained_rewards[-1][0].tolist()


@pytest.mark.slow
def test_a_filter_that_is_never_met_stops_with_one_line_after_the_bound(tiny_model_path, tmp_path):
    from sharpgrpo.training.generation.dynamic_sampling import DynamicSamplingError

    with pytest.raises(DynamicSamplingError) as error:
        train(tiny_model_path, tmp_path / "never", reward=constant_reward, dynamic_sampling=True,
              dynamic_sampling_max_rounds=1)
    message = str(error.value)
    assert "\n" not in message and message.startswith("dynamic_sampling_filter=reward_std: no group passed in 2 ")


@pytest.mark.slow
def test_accuracy_filter_and_a_bound_too_small_to_fill(tiny_model_path, tmp_path):
    """``accuracy`` reads the answer verdicts (here the binary reward's fallback rule); with no extra round allowed the
    batch is filled with failing groups, counted and warned about once."""
    with pytest.warns(UserWarning, match="dynamic_sampling_filter=accuracy: .* were trained on to fill the batch"):
        trainer = train(tiny_model_path, tmp_path / "accuracy", dynamic_sampling=True,
                        dynamic_sampling_filter="accuracy", dynamic_sampling_max_rounds=0)
    logged = [entry for entry in trainer.state.log_history if "dynamic_sampling/groups_unfilled" in entry]
    unfilled = [entry["dynamic_sampling/groups_unfilled"] for entry in logged]
    assert [entry["dynamic_sampling/extra_rounds"] for entry in logged] == [0, 0]
    assert unfilled == [equal_reward_groups(rewards) for rewards, _ in trainer.trained_rewards]
    assert sum(unfilled) >= 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_end_each_step_with_the_same_groups(tiny_model_path, tmp_path):
    """Under two processes every process trains on the same number of groups (its own 2 of the 4), none with equal
    rewards unless the bound forced them in (counted in groups_unfilled; the tiny model learns fast, so the second
    step may run out of rounds); the processes agree on the joined batch's gathered rewards and the logged counts."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_multiprocess import free_port

    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(repo / "configs/accelerate/multi_gpu.yaml"), "--num_processes", "2", "--mixed_precision", "no",
               "--main_process_port", str(free_port()), str(Path(__file__).with_name("_dynamic_sampling_worker.py")),
               "--model", tiny_model_path, "--output_dir", str(tmp_path)]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(repo / "tests"), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [len(r["batches"]) for r in ranks] == [2, 2]
    assert ranks[0]["metrics"] == ranks[1]["metrics"] and len(ranks[0]["metrics"]) == 2
    for step, metrics in enumerate(ranks[0]["metrics"]):
        first, second = (r["batches"][step] for r in ranks)
        assert first["rows"] == second["rows"] == 8  # the same number of groups (2 of 4) on each process
        assert first["global"] == second["global"]  # one joined batch, seen alike
        assert first["global"] == first["local"] + second["local"]
        # no group without signal, except those the bound forced in, which are counted
        assert equal_reward_groups(torch.tensor(first["global"])) == metrics["dynamic_sampling/groups_unfilled"]
        assert 0 <= metrics["dynamic_sampling/extra_rounds"] <= 6
        assert metrics["dynamic_sampling/groups_generated"] == 4 * (metrics["dynamic_sampling/extra_rounds"] + 1)
    assert ranks[0]["metrics"][0]["dynamic_sampling/groups_unfilled"] == 0


@pytest.mark.slow
def test_an_unknown_filter_names_the_setting_and_the_rewards(tiny_model_path, tmp_path):
    from helpers import make_trainer, tiny_config

    args = tiny_config(tmp_path / "nope", per_device_train_batch_size=16, num_generations=G, max_steps=2,
                       dynamic_sampling=True, dynamic_sampling_filter="nope")
    with pytest.raises(ValueError, match=r"dynamic_sampling_filter='nope': must be reward_std, accuracy or the name "
                                         r"of one of the run's reward functions .*: solved_often_reward\."):
        make_trainer(tiny_model_path, args, reward_funcs=[solved_often_reward], train_dataset=64)  # before any step
    trainer = train(tiny_model_path, tmp_path / "named", dynamic_sampling=True,
                    dynamic_sampling_filter="rewards/solved_often_reward/mean")  # the logged column's name
    assert all(equal_reward_groups(rewards) == 0 for rewards, _ in trainer.trained_rewards)
