"""RLSD (docs/methods.md §18.4) against the authors' released reweighting.

The reference is a float64 loop over tokens doing exactly what iie-ycx/RLSD@93e46f7
``verl/workers/actor/dp_opsd_actor.py`` ``_build_stgca_advantages`` L209-239 does (the released module imports verl's
workers and cannot be imported here): sign_adv = sign(A) (L221); delta = (teacher - student) * mask (L222); weights =
exp(sign_adv * delta) * mask (L223); clamp to [1 - clip, 1 + clip] (L227); reweight = ((1 - lam) + lam * clipped) *
mask (L228); A * reweight (L239), with ``negative_only`` and ``thought_only`` off (their defaults, opsd_config.py
L181-188), lam = ``rlsd_lambda`` (0.5) and clip the reweight clip range (0.2), as ``update_policy_grpo_opsd`` passes
them (L440-443). The strategy runs through the trainer's advantage path (``run_advantage_strategies`` with the
trainer's output checker); real generation batches and training are in
``tests/integration/test_token_credit_training.py``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers import cpu_config

from sharpgrpo.strategies.base import STRATEGIES, GenerationBatch
from sharpgrpo.training.generation.advantage_pipeline import run_advantage_strategies
from sharpgrpo.training.output_checks import StrategyOutputChecker
from sharpgrpo.validation import ConfigError

SEEDS = [0, 1, 2, 3, 4]


def released_rlsd(teacher, student, advantages, mask, lam, clip):
    """dp_opsd_actor.py L219-239, token by token, in float64."""
    out = torch.zeros_like(advantages)
    for i in range(advantages.size(0)):
        for t in range(advantages.size(1)):
            a = float(advantages[i, t])
            sign = (a > 0) - (a < 0)
            delta = (float(teacher[i, t]) - float(student[i, t])) * float(mask[i, t])
            weight = math.exp(sign * delta) * float(mask[i, t])
            clipped = min(max(weight, 1.0 - clip), 1.0 + clip)
            out[i, t] = a * ((1.0 - lam) + lam * clipped) * float(mask[i, t])
    return out


def random_batch(seed: int, teacher_input: str, size: int = 12, length: int = 9) -> GenerationBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (size,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    old = -torch.rand(size, length, generator=g, dtype=torch.float64) * 3
    teacher = old + torch.randn(size, length, generator=g, dtype=torch.float64) * 0.4  # |delta| past the clip too
    advantages = torch.randn(size, 1, generator=g, dtype=torch.float64).expand(size, length).clone()
    advantages[0] = 0.0  # sign 0: weight exp(0) = 1
    return GenerationBatch(
        old_logps=old, completion_mask=mask, completion_ids=torch.zeros(size, length, dtype=torch.long),
        advantages=advantages, rewards=torch.zeros(size, dtype=torch.float64),
        group_ids=torch.arange(size) // 4, num_generations=4, extras={teacher_input: teacher},
    )


def run_rlsd(batch: GenerationBatch, **params):
    args = SimpleNamespace(**{"rlsd_teacher": "self", "rlsd_lambda": 0.5, "rlsd_clip": 0.2, **params})
    strategy = STRATEGIES.get("rlsd")(args)
    advantages, metrics, stages = run_advantage_strategies([strategy], batch,
                                                           StrategyOutputChecker({"rlsd": STRATEGIES.get("rlsd")}))
    return advantages, dict(metrics), stages


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("teacher", "lam", "clip"), [("self", 0.5, 0.2), ("teacher_model", 1.0, 0.2),
                                                      ("self", 0.3, 0.5)])
def test_matches_the_released_reweighting_through_the_advantage_path(seed, teacher, lam, clip):
    input_name = {"self": "self_teacher_logps", "teacher_model": "teacher_logps"}[teacher]
    batch = random_batch(seed, input_name)
    mask = batch.completion_mask
    expected = released_rlsd(batch.extras[input_name], batch.old_logps, batch.advantages, mask, lam, clip)
    got, metrics, stages = run_rlsd(batch, rlsd_teacher=teacher, rlsd_lambda=lam, rlsd_clip=clip)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got * mask, expected, rtol=0, atol=1e-9)
    assert 0 < metrics["rlsd/clip_low_ratio"] and 0 < metrics["rlsd/clip_high_ratio"]  # both clips were reached
    assert torch.equal(torch.sign(got * mask), torch.sign(batch.advantages * mask))  # the direction is the reward's
    weight = stages[2]  # advantage/rlsd, rlsd/teacher_logp, rlsd/weight
    torch.testing.assert_close(weight * mask * batch.advantages, expected, rtol=0, atol=1e-6)


def test_controls_differ():
    """Without sign(A) (exp(delta) for every token), or with the paper's lambda = 1 against the released 0.5, the
    advantages miss the released ones at 1e-9."""
    batch = random_batch(0, "self_teacher_logps")
    teacher, mask = batch.extras["self_teacher_logps"], batch.completion_mask
    expected = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, 0.5, 0.2)
    unsigned = batch.advantages * (0.5 + 0.5 * torch.exp((teacher - batch.old_logps) * mask).clamp(0.8, 1.2)) * mask
    paper = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, 1.0, 0.2)
    for control in (unsigned, paper):
        assert (control - expected).abs().max() > 1e-3


def test_completions_without_a_self_teacher_keep_their_advantage():
    batch = random_batch(1, "self_teacher_logps")
    teacher = batch.extras["self_teacher_logps"].clone()
    teacher[4:8] = torch.nan  # SDPO's self-teacher: NaN where no sibling succeeded and no feedback
    got, metrics, _ = run_rlsd(GenerationBatch(**{**batch.__dict__, "extras": {"self_teacher_logps": teacher}}))
    mask = batch.completion_mask
    torch.testing.assert_close(got[4:8] * mask[4:8], batch.advantages[4:8] * mask[4:8], rtol=0, atol=0)
    expected = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, 0.5, 0.2)
    torch.testing.assert_close(got[8:] * mask[8:], expected[8:], rtol=0, atol=1e-9)
    assert metrics["rlsd/teacher_fraction"] == pytest.approx(8 / 12)


def test_without_a_teacher_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="rlsd needs teacher_model") as error:
        cpu_config(tmp_path, strategies=["rlsd"], rlsd_teacher="teacher_model", num_generations=4,
                   per_device_train_batch_size=4)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="rlsd_teacher"):
        cpu_config(tmp_path, strategies=["rlsd"], rlsd_teacher="ref", num_generations=4, per_device_train_batch_size=4)
    args = cpu_config(tmp_path, strategies=["maxrl", "rlsd"], num_generations=4, per_device_train_batch_size=4)
    assert STRATEGIES.get("rlsd")(args).needs_inputs == ("self_teacher_logps",)
