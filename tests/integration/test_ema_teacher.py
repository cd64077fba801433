"""``teacher_model: ema`` (docs/methods.md §16.1): an exponential moving average of the policy's trained weights,
updated after every optimizer step by a callback the ``teacher_logps`` provider registers (the trainer is not
edited), carried in the checkpoint's strategy state. The average the teacher holds after 3 real optimizer steps of
the tiny model equals a float64 loop of theta_T <- decay theta_T + (1 - decay) theta over the weights the policy had
after each step (TRL 1.16 ``SyncRefModelCallback._sync_target_model``, trl/trainer/callbacks.py L130-132, with
alpha = 1 - decay); ``opd`` trains with it; its state survives a save/load round trip and a checkpoint of another
teacher is refused."""

from __future__ import annotations

import pytest
import torch
from helpers import make_trainer, tiny_config
from transformers import TrainerCallback


class WeightLog(TrainerCallback):
    """The policy's trained weights, in float64, before training and after every optimizer step (registered after
    the EMA callback: it sees each step's weights once the average has taken them)."""

    def __init__(self, model):
        self.model, self.snapshots = model, [self.weights(model)]

    @staticmethod
    def weights(model):
        return {name: p.detach().double().clone() for name, p in model.named_parameters() if p.requires_grad}

    def on_step_end(self, args, state, control, **kwargs):
        self.snapshots.append(self.weights(self.model))


def ema_trainer(model_path, output_dir, decay=0.6, **overrides):
    args = tiny_config(output_dir, strategies=["opd"], teacher_model="ema", teacher_ema_decay=decay,
                       learning_rate=1e-2, **overrides)
    return make_trainer(model_path, args)


def test_ema_teacher_is_a_float64_loop_of_the_update_over_three_real_steps(tiny_model_path, tmp_path):
    decay = 0.6
    trainer = ema_trainer(tiny_model_path, tmp_path / "run", decay=decay, max_steps=3)
    holder = trainer.advantage_strategies[0]
    ema = holder._teacher_state
    log = WeightLog(trainer.model)
    trainer.add_callback(log)
    trainer.train()
    assert len(log.snapshots) == 4  # initial + 3 steps
    expected = dict(log.snapshots[0])
    for snapshot in log.snapshots[1:]:  # theta_T <- decay theta_T + (1 - decay) theta, in float64
        for name in expected:
            expected[name] = decay * expected[name] + (1.0 - decay) * snapshot[name]
    averaged = {name: p.detach().double() for name, p in ema.model.named_parameters()}
    moved = 0.0
    for name, value in expected.items():
        torch.testing.assert_close(averaged[name], value, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((value - log.snapshots[-1][name]).abs().max()))
    assert moved > 1e-3  # the average is not the final policy (the test could tell them apart)
    assert max(float((log.snapshots[-1][n] - log.snapshots[0][n]).abs().max()) for n in expected) > 1e-3
    assert not any(p.requires_grad for p in ema.model.parameters())  # the teacher is frozen
    # the teacher's scores are the averaged weights' (not the policy's): the provider reads ema.model
    assert all(p.data_ptr() != q.data_ptr() for p, q in zip(ema.model.parameters(), trainer.model.parameters()))
    # the checkpoint state: the averaged weights by name, restored into another trainer's teacher
    state = trainer.strategy_state()["OnPolicyDistillationStrategy"]
    assert set(state) == {"teacher_ema." + n for n in expected}
    other = ema_trainer(tiny_model_path, tmp_path / "other", decay=decay, max_steps=3)
    other.strategies.load_state_dict({"OnPolicyDistillationStrategy": state})
    restored = dict(other.advantage_strategies[0]._teacher_state.model.named_parameters())
    for name, value in expected.items():
        torch.testing.assert_close(restored[name].double(), value, rtol=0, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="does not hold this policy's EMA teacher weights"):
        other.strategies.load_state_dict({"OnPolicyDistillationStrategy": {}})


@pytest.mark.slow  # the 3-step test above trains opd with an EMA teacher too
def test_opd_with_an_ema_teacher_trains_two_steps(tiny_model_path, tmp_path):
    trainer = ema_trainer(tiny_model_path, tmp_path / "run", decay=0.5, max_steps=2)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2]
    for entry in logged:
        for key in ("loss", "opd/teacher_logp_mean", "opd/gap_abs_mean"):
            assert torch.isfinite(torch.tensor(entry[key])), (key, entry)
    # step 1's teacher is the initial policy (no gap beyond rounding); step 2's is the average of steps 0 and 1
    assert logged[0]["opd/gap_abs_mean"] < 1e-4
    assert logged[1]["opd/gap_abs_mean"] > 10 * logged[0]["opd/gap_abs_mean"]


def test_ema_checkpoint_state_is_refused_by_another_teacher(tiny_model_path, tmp_path):
    args = tiny_config(tmp_path / "ref", strategies=["opd"], teacher_model="ref", beta=0.04, max_steps=1)
    trainer = make_trainer(tiny_model_path, args)
    assert trainer.strategy_state()["OnPolicyDistillationStrategy"] == {}
    with pytest.raises(ValueError, match="resume with teacher_model: ema"):
        trainer.strategies.load_state_dict({"OnPolicyDistillationStrategy": {"teacher_ema.x": torch.zeros(1)}})


@pytest.mark.slow
def test_lora_run_averages_the_adapter_only(tiny_model_path, tmp_path):
    """In a LoRA run the policy trains the adapter only: the EMA averages (and the checkpoint carries) exactly the
    adapter's weights, and after two steps the teacher's adapter lies between its start (lora_B = 0) and the
    policy's, as the float64 loop says."""
    pytest.importorskip("peft")
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import demo_dataset

    decay = 0.5
    args = tiny_config(tmp_path, strategies=["opd"], teacher_model="ema", teacher_ema_decay=decay, max_steps=2,
                       learning_rate=1e-2)

    def constant_reward(completions, **kwargs):
        return [1.0] * len(completions)

    trainer = SharpGRPOTrainer(model=tiny_model_path, reward_funcs=[constant_reward], args=args,
                               train_dataset=demo_dataset(32),
                               processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
                               peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    ema = trainer.advantage_strategies[0]._teacher_state
    names = [name for name, _, _ in ema.pairs]
    assert names and all("lora_" in name for name in names)
    log = WeightLog(trainer.model)
    trainer.add_callback(log)
    trainer.train()
    averaged = {name: p.detach().double() for name, p in ema.model.named_parameters()}
    moved = 0.0
    for name in names:
        expected = log.snapshots[0][name]
        for snapshot in log.snapshots[1:]:
            expected = decay * expected + (1.0 - decay) * snapshot[name]
        torch.testing.assert_close(averaged[name], expected, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((expected - log.snapshots[-1][name]).abs().max()))
    assert moved > 1e-4
    assert set(trainer.strategy_state()["OnPolicyDistillationStrategy"]) == {"teacher_ema." + n for n in names}
