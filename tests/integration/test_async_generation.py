"""Asynchronous generation (``async_generation``) trained for real on the tiny model, with its rollout process.

* Staleness 0 equals synchronous training: the same seed trained 3 steps by ``SharpGRPOTrainer`` with its own
  generation and with the rollout process (``max_staleness: 0``) logs the same numbers and ends with the same weights,
  bit for bit (the rollout process builds the policy from its config, takes its weights from shared memory, runs
  TRL's transformers generation and the trainer's generation capture, and hands the random state back), for
  ``grpo_sg``, ``thr`` (hidden states from the rollout process's capture), ``cw_grpo`` (sampling log-probabilities
  from it) and a composition.
* Staleness is what is configured: with ``max_staleness`` k, every step's ``async/staleness`` is at most k, and the
  second step's batch (submitted with the first one's weights) is exactly one version behind.
* A rollout process that dies stops training with one line naming it.
* Settings it cannot serve are refused in one line when the config is built.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_config, make_trainer

from sharpgrpo.validation import ConfigError

pytestmark = pytest.mark.slow
TIMING = ("runtime", "per_second", "step_time", "wait_seconds")


def train(model_path, output_dir, **overrides):
    trainer = make_trainer(model_path, tiny_config(output_dir, **overrides))
    trainer.train()
    return trainer


@pytest.mark.parametrize("strategies", [["grpo_sg"], ["thr"], ["cw_grpo"], ["grpo_sg", "ar"]])
def test_staleness_zero_equals_synchronous_training(tiny_model_path, tmp_path, strategies):
    synchronous = train(tiny_model_path, tmp_path / "sync", max_steps=3, strategies=strategies)
    asynchronous = train(tiny_model_path, tmp_path / "async", max_steps=3, strategies=strategies,
                         async_generation=True, max_staleness=0)
    compared = 0
    for ours, theirs in zip(asynchronous.state.log_history, synchronous.state.log_history, strict=True):
        for key, value in theirs.items():
            if isinstance(value, float) and not any(part in key for part in TIMING):
                assert ours[key] == value or (math.isnan(value) and math.isnan(ours[key])), key
                compared += 1
        assert ours.get("async/staleness", 0.0) == 0.0
    assert compared > 30
    weights = dict(synchronous.model.named_parameters())
    for name, parameter in asynchronous.model.named_parameters():
        assert torch.equal(parameter, weights[name]), name
    before = make_trainer(tiny_model_path, tiny_config(tmp_path / "untrained")).model
    assert any(not torch.equal(p, dict(before.named_parameters())[n]) for n, p in weights.items())  # it trained


@pytest.mark.parametrize("k", [1, 2, 4])
def test_staleness_is_what_is_configured(tiny_model_path, tmp_path, k):
    trainer = train(tiny_model_path, tmp_path, max_steps=6, async_generation=True, max_staleness=k)
    staleness = [entry["async/staleness"] for entry in trainer.state.log_history if "async/staleness" in entry]
    assert len(staleness) == 6
    assert all(0 <= value <= k for value in staleness)
    assert staleness[0] == 0 and staleness[1] == 1  # batch 2 was generated with the first step's weights
    assert all(math.isfinite(entry.get("loss", 0.0)) for entry in trainer.state.log_history)


def test_a_dead_rollout_process_stops_training_in_one_line(tiny_model_path, tmp_path):
    from sharpgrpo.data.demo import allowed_letters_reward
    from sharpgrpo.training.generation.async_rollout.client import RolloutProcessError

    holder = {}

    def reward_that_kills_the_rollout_process(prompts, completions, **kwargs):
        holder["calls"] = holder.get("calls", 0) + 1
        if holder["calls"] == 2:
            holder["trainer"].rollout_func._process.kill()
        return allowed_letters_reward(prompts, completions, **kwargs)

    reward_that_kills_the_rollout_process.__name__ = "allowed_letters_reward"
    trainer = make_trainer(tiny_model_path, tiny_config(tmp_path, max_steps=5, async_generation=True,
                                                        max_staleness=1),
                           reward_funcs=[reward_that_kills_the_rollout_process])
    holder["trainer"] = trainer
    with pytest.raises(RolloutProcessError) as error:
        trainer.train()
    message = str(error.value)
    assert "\n" not in message and "rollout process exited" in message
    assert 2 <= trainer.state.global_step < 5


def test_max_staleness_without_async_generation_is_said_once(tmp_path):
    with pytest.warns(UserWarning, match=r"max_staleness=2 acts only with async_generation: true, which is off"):
        tiny_config(tmp_path, max_staleness=2)


@pytest.mark.parametrize("overrides, named", [
    (dict(async_generation=True, max_staleness=-1), "max_staleness"),
    (dict(async_generation=True, dynamic_sampling=True), "dynamic_sampling"),
    (dict(async_generation=True, use_vllm=True, vllm_mode="colocate"), "vllm_mode='colocate'"),
])
def test_settings_it_cannot_serve_are_refused_in_one_line(tmp_path, overrides, named):
    with pytest.raises(ConfigError) as error:
        tiny_config(tmp_path, **overrides)
    assert named in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.every_strategy)
                                  for name in __import__("integration.test_training", fromlist=["BUILTIN"]).BUILTIN])
def test_every_strategy_trains_two_asynchronous_steps(tiny_model_path, tmp_path, name):
    """Each registered strategy trains 2 steps one version behind (max_staleness 1), with finite metrics and moved
    weights, or is refused in one line when the config is built (skipped here with that line)."""
    from integration.test_training import binary_reward_trainer, strategy_config, train_and_check

    try:
        trainer = binary_reward_trainer(tiny_model_path, tmp_path, strategies=[name], async_generation=True,
                                        max_staleness=1, **strategy_config([name]))
    except ConfigError as error:
        assert "\n" not in str(error)
        pytest.skip(f"{name} is refused with async_generation on the CPU demo: {error}")
    logs = train_and_check(trainer)
    assert [entry["async/staleness"] for entry in logs] == [0.0, 1.0]
    assert all(math.isfinite(value) for entry in logs for value in entry.values() if isinstance(value, float))


def test_token_telemetry_records_each_rows_weight_version(tiny_model_path, tmp_path):
    """The per-token telemetry of an asynchronous run names each row's weight version and how far it lagged the step
    that trained on it; the lag is the step's logged async/staleness and at most max_staleness."""
    import pandas as pd

    trainer = train(tiny_model_path, tmp_path, max_steps=4, async_generation=True, max_staleness=2,
                    token_telemetry=True, telemetry_steps=1)
    logged = {entry["step"]: entry["async/staleness"] for entry in trainer.state.log_history
              if "async/staleness" in entry}
    files = sorted((tmp_path / "telemetry").glob("telemetry_*.parquet"))
    assert len(files) == 4
    for path in files:
        frame = pd.read_parquet(path)
        step = int(frame["step"].iloc[0])
        assert (frame["versions_behind"] == step - 1 - frame["policy_version"]).all()
        assert frame["versions_behind"].between(0, 2).all()
        assert frame["versions_behind"].nunique() == 1 and frame["versions_behind"].iloc[0] == logged[step]


def test_a_resumed_run_finds_its_place_in_the_data_order(tiny_model_path, tmp_path):
    """A checkpoint keeps no job in flight: after a resume the first batch is generated on demand (staleness 0) and
    the read-ahead moves to the trainer's position in the data order, so the next batch is pipelined again
    (staleness 1; had the position not been found, every later batch would be generated on demand, at 0)."""
    options = dict(max_steps=4, async_generation=True, max_staleness=1, save_strategy="steps", save_steps=2)
    first = train(tiny_model_path, tmp_path, **options)
    assert [e["async/staleness"] for e in first.state.log_history if "loss" in e] == [0.0, 1.0, 1.0, 1.0]
    resumed = make_trainer(tiny_model_path, tiny_config(tmp_path, **options))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    after = [(e["step"], e["async/staleness"]) for e in resumed.state.log_history if "loss" in e and e["step"] > 2]
    assert after == [(3, 0.0), (4, 1.0)]


def test_a_lora_policy_is_published_as_the_model_peft_merges(tiny_model_path):
    """The weights the rollout process receives for a LoRA policy are peft's own merge (``merge_and_unload``) of it,
    with ``modules_to_save`` and random adapters (nonzero deltas), and publishing leaves the policy untouched."""
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from sharpgrpo.training.generation.async_rollout.weights import plain_state_dict

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    plain = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False, modules_to_save=["lm_head"]))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    published = plain_state_dict(model)
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(published) == set(merged) == set(plain)
    for name, tensor in merged.items():
        torch.testing.assert_close(published[name], tensor, rtol=0, atol=1e-6)
    moved = [name for name in plain if not torch.allclose(published[name], plain[name], atol=1e-3)]
    assert any("q_proj" in name for name in moved) and any("v_proj" in name for name in moved)  # deltas are in
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_a_lora_policy_trains_asynchronously_on_its_own_weights(tiny_model_path, tmp_path):
    """A LoRA policy trains asynchronously: at staleness 0 the rollout process's sampling log-probabilities are the
    trainer's own (rollout_correction's KL between the two is ~0), though the random adapters move the policy far from
    its base model (the rollout process would not match it without them); the adapters train, finite metrics."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset

    torch.manual_seed(0)
    trainer = SharpGRPOTrainer(
        model=str(tiny_model_path), reward_funcs=[allowed_letters_reward],
        args=tiny_config(tmp_path, max_steps=2, strategies=["rollout_correction"], async_generation=True,
                         max_staleness=0),
        train_dataset=demo_dataset(64), processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapters = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "rollout_corr/kl" in entry]
    assert len(logs) == 2
    assert all(abs(entry["rollout_corr/kl"]) < 1e-4 for entry in logs), [e["rollout_corr/kl"] for e in logs]
    assert all(math.isfinite(v) for entry in logs for v in entry.values() if isinstance(v, float))
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[name], value) for name, value in adapters.items())


def test_what_if_on_an_asynchronous_run(tiny_model_path, tmp_path):
    """``sharpgrpo tokens --what-if`` on the telemetry of a stale step: the run rejects the tokens whose ratio of the
    recomputed policy to the behaviour policy (one version behind) is below 1, the what-if those above 1, and its
    counts are the ones the telemetry's own log-probabilities give."""
    import contextlib
    import io

    import numpy as np

    from sharpgrpo.cli.tokens import main
    from sharpgrpo.diagnostics.telemetry import read_telemetry

    run = tmp_path / "run"
    trainer = train(tiny_model_path, run, max_steps=2, async_generation=True, max_staleness=1,
                    token_telemetry=True, telemetry_steps=1, strategies=["rollout_correction"], rollout_is="token",
                    rollout_is_threshold=1.0, rollout_rs="token_k1", rollout_rs_threshold="1e-30_1.0")
    assert [e["async/staleness"] for e in trainer.state.log_history if "loss" in e] == [0.0, 1.0]
    frame, meta = read_telemetry(run / "telemetry" / "telemetry_000002.parquet")
    assert (frame["versions_behind"] == 1).all() and meta["sampling_logps"] is True
    loss = frame["mask"].to_numpy() == 1
    old = frame["old_logp"].to_numpy(dtype=np.float32)[loss]
    sampling = frame["sampling_logp"].to_numpy(dtype=np.float32)[loss]
    below, above = old < sampling, old > sampling
    assert below.sum() > 0 and above.sum() > 0
    rejected = frame["rollout_correction/rejected"].to_numpy()[loss]
    assert np.array_equal(rejected, below.astype(rejected.dtype))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = main(["--telemetry", str(run), "--step", "2", "--what-if", "rollout_rs_threshold=1.0_1e30",
                       "--max_groups", "99", "--output", str(tmp_path / "what_if")])
    what = result["what_if"]
    assert (what["only_what_if"], what["only_run"], what["both"]) == (int(above.sum()), int(below.sum()), 0)
    assert (tmp_path / "what_if" / "tokens.html").is_file()
