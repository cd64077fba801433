"""``maxrl``, ``rlsd`` and ``echo`` in the trainer (docs/methods.md §18): real generation batches of the tiny model give
what the authors' released functions give (their float64 reproductions in ``tests/strategies``), bad inputs are
refused in one line, and two training steps change the parameters with finite metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import binary_letters_reward, cpu_config, make_trainer, sampling_trainer, tiny_config


def test_generation_batch_advantages_are_maxrls(tiny_model_path, tmp_path):
    """A real generation batch of the tiny model (two groups of 8, binary rewards): the trainer's advantages are the
    released estimator of the batch's rewards (its lines reproduced in tests/strategies/test_maxrl.py); the demo's
    graded reward is refused with maxrl's line."""
    from sharpgrpo.data.demo import demo_dataset

    trainer = sampling_trainer(tiny_model_path, tmp_path / "binary", strategies=["maxrl"])
    seen = {}
    maxrl = trainer.advantage_strategies[0]
    original = maxrl.token_advantages
    maxrl.token_advantages = lambda batch: seen.setdefault("batch", batch) and original(batch)
    torch.manual_seed(1)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    rewards = seen["batch"].rewards.double()
    assert set(rewards.tolist()) <= {0.0, 1.0} and 0 < rewards.sum() < 16
    mask = output["completion_mask"].double()
    groups = rewards.view(2, 8)
    mean = groups.mean(dim=1, keepdim=True)
    expected = ((groups - mean) / (mean + 1e-6)).flatten()[:, None] * mask  # released L435-438
    torch.testing.assert_close(output["advantages"].double() * mask, expected, rtol=0, atol=1e-6)  # float32 output

    graded = make_trainer(tiny_model_path, cpu_config(tmp_path / "graded", strategies=["maxrl"],
                                                      per_device_train_batch_size=16, num_generations=8,
                                                      max_completion_length=8, seed=0), train_dataset=16)
    with pytest.raises(ValueError, match="maxrl needs binary rewards"):
        graded._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])


def trained_logs(model_path, output_dir, reward_funcs=(binary_letters_reward,), **overrides) -> list[dict]:
    """Two training steps of the tiny model with ``overrides``: asserts that parameters changed and every logged
    number is finite; returns the two log entries."""
    trainer = make_trainer(model_path, tiny_config(output_dir, max_steps=2, **overrides), reward_funcs=reward_funcs)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        bad = {k: v for k, v in entry.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not bad, f"non-finite metrics {bad}"
    return logs


def telemetry_columns(run, step: int = 1):
    """The per-token telemetry file of ``step``: (frame, column descriptions)."""
    from sharpgrpo.diagnostics.telemetry import read_telemetry

    frame, meta = read_telemetry(run / "telemetry" / f"telemetry_{step:06d}.parquet")
    return frame, meta["columns"]


@pytest.mark.slow
def test_maxrl_trains_two_steps(tiny_model_path, tmp_path):
    for entry in trained_logs(tiny_model_path, tmp_path, strategies=["maxrl"], token_telemetry=True):
        assert 0 <= entry["maxrl/frac_all_fail_groups"] <= 1 and entry["maxrl/max_advantage"] >= 0
    frame, described = telemetry_columns(tmp_path)
    means = frame["maxrl/group_mean"].to_numpy() * 8  # success rates of groups of 8
    assert np.allclose(means, np.round(means)) and described["maxrl/group_mean"].startswith("maxrl (advantage")


def test_generation_batch_advantages_are_rlsds(tiny_model_path, tmp_path):
    """A real generation batch with SDPO's self-teacher: the trainer's advantages are RLSD's reweighting (the released
    lines, reproduced in tests/strategies/test_rlsd.py) of TRL's advantages by the self-teacher's log-probabilities the
    generation input computed; completions without a successful sibling keep TRL's advantage."""
    from sharpgrpo.data.demo import demo_dataset
    from sharpgrpo.strategies.distillation import rlsd_advantages

    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["rlsd"])
    seen = {}
    rlsd = trainer.advantage_strategies[0]
    assert rlsd.needs_inputs == ("self_teacher_logps",)
    original = rlsd.token_advantages
    rlsd.token_advantages = lambda batch: seen.setdefault("batch", batch) and original(batch)
    torch.manual_seed(1)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    batch = seen["batch"]
    teacher = batch.extras["self_teacher_logps"].double()
    rows = torch.isfinite(teacher).any(dim=1)
    assert rows.any() and (batch.advantages != 0).any()
    mask = output["completion_mask"].double()
    expected, _, _ = rlsd_advantages(batch.advantages.double(), torch.nan_to_num(teacher), batch.old_logps.double(),
                                     mask, 0.5, 0.2)
    expected = torch.where(rows[:, None], expected, batch.advantages.double() * mask)
    torch.testing.assert_close(output["advantages"].double() * mask, expected, rtol=0, atol=1e-6)
    assert ((expected - batch.advantages.double() * mask).abs() > 1e-4).any()  # the teacher moved some token


@pytest.mark.slow
def test_rlsd_schedule_and_thought_span_in_the_trainer(tiny_model_path, tmp_path):
    """A batch generated after 29 optimizer steps with the released script's decay over 60 steps trains at lambda
    0.5 (1 - 30/60) = 0.25 (the reweighting at that lambda, float32 output), only inside the thought span the
    generation input found with the real tokenizer; the input matches the tags' own token ids in a completion."""
    from sharpgrpo.data.demo import demo_dataset
    from sharpgrpo.strategies.distillation import rlsd_advantages

    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["rlsd"], rlsd_lambda_decay_steps=60,
                               rlsd_thought_only=True, rlsd_thought_tags="<think> </think>")
    tokenizer = trainer.processing_class
    opening, closing = (tokenizer.encode(tag, add_special_tokens=False) for tag in ("<think>", "</think>"))
    ids = torch.tensor([[3] + opening + [4, 5, 6] + closing + [7], [3] + opening + [5] * (4 + len(closing))])
    provide = trainer._input_providers["rlsd_thought_span"]
    span = provide({"completion_ids": ids, "completion_mask": torch.ones_like(ids)})
    start = 1 + len(opening)
    assert span[0].tolist() == [0.0] * start + [1.0] * 3 + [0.0] * (len(closing) + 1)
    assert span[1].tolist() == [0.0] * start + [1.0] * (4 + len(closing))  # open to the end

    seen = {}
    rlsd = trainer.advantage_strategies[0]
    original = rlsd.token_advantages
    rlsd.token_advantages = lambda batch: seen.setdefault("batch", batch) and original(batch)
    trainer.state.global_step = 29
    torch.manual_seed(1)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    batch = seen["batch"]
    assert batch.step == 29
    teacher = torch.nan_to_num(batch.extras["self_teacher_logps"].double())
    rows = torch.isfinite(batch.extras["self_teacher_logps"]).any(dim=1)
    mask = output["completion_mask"].double()
    span = batch.extras["rlsd_thought_span"].double()
    expected, _, _ = rlsd_advantages(batch.advantages.double(), teacher, batch.old_logps.double(), mask, 0.25, 0.2,
                                     span=span)
    expected = torch.where(rows[:, None], expected, batch.advantages.double() * mask)
    torch.testing.assert_close(output["advantages"].double() * mask, expected, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("teacher", [{"rlsd_teacher": "self"}, {"rlsd_teacher": "teacher_model",
                                                                 "teacher_model": "ema"}], ids=lambda t: t["rlsd_teacher"])
def test_rlsd_trains_two_steps(tiny_model_path, tmp_path, teacher):
    for entry in trained_logs(tiny_model_path, tmp_path, strategies=["rlsd"], token_telemetry=True, **teacher):
        assert 0 < entry["rlsd/reweight_mean"] <= 1.2 and 0 <= entry["rlsd/teacher_fraction"] <= 1
    frame, described = telemetry_columns(tmp_path, step=2)
    weight = frame["rlsd/weight"].to_numpy()
    assert ((weight >= 0.9 - 1e-6) & (weight <= 1.1 + 1e-6)).all()  # (1 - 0.5) + 0.5 clip(w, 0.8, 1.2)
    assert {"rlsd/teacher_logp", "rlsd/weight"} <= set(described)


def tool_batch(trainer, seed: int = 0, rows: int = 4, length: int = 10) -> dict:
    """A micro-batch whose completions hold a tool result (``tool_mask`` 0) after the model's first tokens."""
    g = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    completion_mask = (torch.arange(length)[None] < torch.tensor([10, 9, 7, 10])[:, None]).long()
    tool_mask = torch.ones(rows, length, dtype=torch.long)
    tool_mask[:3, 2:6] = 0  # the last row has no tool result
    return {"prompt_ids": torch.randint(0, vocab, (rows, 3), generator=g),
            "prompt_mask": torch.ones(rows, 3, dtype=torch.long),
            "completion_ids": torch.randint(0, vocab, (rows, length), generator=g), "completion_mask": completion_mask,
            "tool_mask": tool_mask, "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
            "num_items_in_batch": (completion_mask * tool_mask).sum()}


@torch.no_grad()
def loss_and_logps(trainer, inputs) -> tuple[float, torch.Tensor]:
    """The trainer's ``_compute_loss`` on ``inputs`` (3 prompt tokens), and the completion tokens' log-probabilities
    at the sampling temperature from an independent forward (float64)."""
    loss = float(trainer._compute_loss(trainer.model, inputs))
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = trainer.model(input_ids=ids, attention_mask=attention).logits.double()[:, 2:-1] / trainer.temperature
    return loss, torch.log_softmax(logits, -1).gather(-1, inputs["completion_ids"][..., None]).squeeze(-1)


def test_echo_in_the_trainers_loss(tiny_model_path, tmp_path):
    """The trainer's ``_compute_loss`` on a micro-batch with tool results: with ``echo`` the loss is the plain one plus
    ``echo_coef`` times the mean -log p of the tool-result tokens, the log-probabilities from an independent forward
    (prime-rl's ce component, tests/strategies/test_echo.py)."""
    losses, logps = {}, None
    for name, strategies in (("plain", ["grpo_sg"]), ("echo", ["grpo_sg", "echo"])):
        args = cpu_config(tmp_path / name, strategies=strategies, echo_coef=0.1, per_device_train_batch_size=4,
                          num_generations=2, max_completion_length=10, seed=0)
        trainer = make_trainer(tiny_model_path, args, train_dataset=4)
        inputs = tool_batch(trainer)
        losses[name], logps = loss_and_logps(trainer, inputs)
    env = (inputs["completion_mask"] * (1 - inputs["tool_mask"])).double()
    expected = float((-0.1 * logps * env).sum() / env.sum())
    assert losses["echo"] - losses["plain"] == pytest.approx(expected, abs=1e-5)
    assert expected > 0.1  # the tiny model is far from predicting random tool tokens


def keep_even_tokens(token_ids):
    """An echo filter, imported by path: keep the tokens with an even id."""
    return [token % 2 == 0 for token in token_ids]


@pytest.mark.slow
def test_echo_roles_and_filter_in_the_trainers_loss(tiny_model_path, tmp_path):
    """The trainer's ``_compute_loss`` on a micro-batch whose environment tokens carry the rollout's roles (tool, then
    user) with ``echo_roles: tool,user=0.05`` and a filter imported by path: the loss exceeds the plain one by the
    role-weighted mean -log p over the tokens the filter keeps (the token ids reach it through the loss inputs)."""
    losses = {}
    for name, strategies in (("plain", ["grpo_sg"]), ("echo", ["grpo_sg", "echo"])):
        args = cpu_config(tmp_path / name, strategies=strategies, echo_roles="tool,user=0.05",
                          echo_filter="test_token_credit_training:keep_even_tokens", per_device_train_batch_size=4,
                          num_generations=2, max_completion_length=10, seed=0)
        trainer = make_trainer(tiny_model_path, args, train_dataset=4)
        inputs = tool_batch(trainer)
        roles = torch.zeros_like(inputs["tool_mask"])
        roles[:3, 2:4], roles[:3, 4:6] = 4, 2  # the tool result's first tokens, then a user message
        inputs["env_roles"] = roles
        losses[name], logps = loss_and_logps(trainer, inputs)
    alpha = torch.where(roles == 4, 0.1, torch.where(roles == 2, 0.05, 0.0)).double()
    alpha = alpha * (inputs["completion_ids"] % 2 == 0) * inputs["completion_mask"] * (1 - inputs["tool_mask"])
    assert (alpha != 0).any() and (alpha == 0).logical_and(roles > 0).any()
    expected = float((-logps * alpha).sum() / (alpha != 0).sum())
    assert losses["echo"] - losses["plain"] == pytest.approx(expected, abs=1e-5)
