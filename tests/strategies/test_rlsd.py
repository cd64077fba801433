"""RLSD (docs/methods.md §18.4) against the authors' released reweighting.

The reference is a float64 loop over tokens doing exactly what iie-ycx/RLSD@93e46f7
``verl/workers/actor/dp_opsd_actor.py`` ``_build_stgca_advantages`` L209-239 does (the released module imports verl's
workers and cannot be imported here): sign_adv = sign(A) (L221); delta = (teacher - student) * mask (L222); weights =
exp(sign_adv * delta) * mask (L223); clamp to [1 - clip, 1 + clip] (L227); reweight = ((1 - lam) + lam * clipped) *
mask (L228); ``negative_only``: rows whose advantages sum to < 0 keep the reweight, the others the mask (L230-232);
``thought_mask``: the reweight inside it, the mask outside (L234-237); A * reweight (L239), lam = ``rlsd_lambda``
(0.5) and clip the reweight clip range (0.2), as ``update_policy_grpo_opsd`` passes them (L440-443). The lambda
schedule is ``verl/trainer/opsd_trainer.py`` L1951-1961 (``global_step`` 1 at the first step, L1998-1999), the
thought span ``_build_thought_span_mask`` L1879-1908, each reproduced as a loop below. The strategy runs through the
trainer's advantage path (``run_advantage_strategies`` with the trainer's output checker); real generation batches and
training are in ``tests/integration/test_token_credit_training.py``.
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


def released_rlsd(teacher, student, advantages, mask, lam, clip, negative_only=False, thought_mask=None):
    """dp_opsd_actor.py L219-239, token by token, in float64."""
    out = torch.zeros_like(advantages)
    for i in range(advantages.size(0)):
        row_sum = sum(float(advantages[i, t]) * float(mask[i, t]) for t in range(advantages.size(1)))
        for t in range(advantages.size(1)):
            a, m = float(advantages[i, t]), float(mask[i, t])
            sign = (a > 0) - (a < 0)
            delta = (float(teacher[i, t]) - float(student[i, t])) * m
            weight = math.exp(sign * delta) * m
            clipped = min(max(weight, 1.0 - clip), 1.0 + clip)
            reweight = ((1.0 - lam) + lam * clipped) * m
            if negative_only:
                negative = 1.0 if row_sum < 0 else 0.0
                reweight = negative * reweight + (1.0 - negative) * m
            if thought_mask is not None:
                inside = float(thought_mask[i, t])
                reweight = inside * reweight + (1.0 - inside) * m
            out[i, t] = a * reweight
    return out


def released_lambda(global_step, target, warmup_steps, decay_steps):
    """opsd_trainer.py L1951-1961."""
    if warmup_steps > 0 and global_step < warmup_steps:
        return target * (global_step / warmup_steps)
    elif decay_steps > 0 and global_step >= warmup_steps:
        return target * max(1.0 - (global_step - warmup_steps) / decay_steps, 0.0)
    return target


def released_thought_span(responses, response_mask, start_ids, end_ids):
    """opsd_trainer.py ``_build_thought_span_mask`` L1879-1908 on token ids."""
    mask = torch.zeros_like(response_mask)
    for i in range(responses.size(0)):
        tokens, in_thought, t, seq_len = responses[i].tolist(), False, 0, responses.size(1)
        while t < seq_len:
            if not in_thought:
                if t + len(start_ids) <= seq_len and tokens[t:t + len(start_ids)] == start_ids:
                    in_thought = True
                    t += len(start_ids)
                    continue
            else:
                if t + len(end_ids) <= seq_len and tokens[t:t + len(end_ids)] == end_ids:
                    in_thought = False
                    t += len(end_ids)
                    continue
                mask[i, t] = 1.0
            t += 1
    return mask * response_mask


def random_batch(seed: int, teacher_input: str, size: int = 12, length: int = 9, step: int = 0) -> GenerationBatch:
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
        group_ids=torch.arange(size) // 4, num_generations=4, extras={teacher_input: teacher}, step=step,
    )


def run_rlsd(batch: GenerationBatch, **params):
    args = SimpleNamespace(**{"rlsd_teacher": "self", "rlsd_lambda": 0.5, "rlsd_clip": 0.2,
                              "rlsd_negative_only": False, "rlsd_thought_only": False, "rlsd_lambda_warmup_steps": 0,
                              "rlsd_lambda_decay_steps": 0, **params})
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


@pytest.mark.parametrize(("warmup", "decay"), [(0, 60), (10, 20), (8, 0)])
def test_the_lambda_schedule_is_the_released_one(warmup, decay):
    """The batch generated after ``step`` optimizer steps trains first at step + 1: its advantages are the released
    reweighting at the released trainer's lambda of that 1-based step (its script's decay over 60 steps, a warm-up then
    a decay, a warm-up alone); controls: the 0-based step and the constant lambda differ where the schedule moves."""
    for step in (0, 4, 9, 10, 25, 29, 59, 60, 75):
        batch = random_batch(step % 5, "self_teacher_logps", step=step)
        mask, teacher = batch.completion_mask, batch.extras["self_teacher_logps"]
        lam = released_lambda(step + 1, 0.5, warmup, decay)
        expected = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, lam, 0.2)
        got, metrics, _ = run_rlsd(batch, rlsd_lambda_warmup_steps=warmup, rlsd_lambda_decay_steps=decay)
        torch.testing.assert_close(got * mask, expected, rtol=0, atol=1e-9)
        assert metrics["rlsd/lambda"] == pytest.approx(lam, abs=1e-12)
        for control in (released_lambda(step, 0.5, warmup, decay), 0.5):
            if abs(control - lam) > 1e-3:
                other = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, control, 0.2)
                assert (other - expected).abs().max() > 1e-5
    late = released_lambda(1000, 0.5, warmup, decay)
    assert late == (0.5 if decay == 0 else 0.0)  # decayed to 0 and held there
    if decay:
        strategy = STRATEGIES.get("rlsd")(SimpleNamespace(
            rlsd_teacher="self", rlsd_lambda=0.5, rlsd_clip=0.2, rlsd_negative_only=False, rlsd_thought_only=False,
            rlsd_lambda_warmup_steps=warmup, rlsd_lambda_decay_steps=decay))
        batch = random_batch(0, "self_teacher_logps", step=warmup + decay)
        with pytest.warns(UserWarning, match="rlsd: lambda has decayed to 0") as caught:
            for _ in range(2):
                got, _ = strategy.token_advantages(batch)
        assert sum("decayed" in str(w.message) for w in caught) == 1
        torch.testing.assert_close(got * batch.completion_mask, batch.advantages * batch.completion_mask, rtol=0,
                                   atol=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("negative_only", "thought_only"), [(True, False), (False, True), (True, True)])
def test_negative_only_and_thought_only_are_the_released_lines(seed, negative_only, thought_only):
    """``rlsd_negative_only`` and ``rlsd_thought_only`` (its span from the generation input) against L230-237, with
    lambda 1; controls: the reweighting of every token differs, and the span's tokens move while the others keep A."""
    batch = random_batch(seed, "self_teacher_logps")
    g = torch.Generator().manual_seed(100 + seed)
    span = (torch.rand(batch.completion_mask.shape, generator=g) < 0.5).double() * batch.completion_mask
    batch = GenerationBatch(**{**batch.__dict__, "extras": {**batch.extras, "rlsd_thought_span": span}})
    teacher, mask = batch.extras["self_teacher_logps"], batch.completion_mask
    expected = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, 1.0, 0.2, negative_only,
                             span if thought_only else None)
    got, _, _ = run_rlsd(batch, rlsd_lambda=1.0, rlsd_negative_only=negative_only, rlsd_thought_only=thought_only)
    torch.testing.assert_close(got * mask, expected, rtol=0, atol=1e-9)
    plain = released_rlsd(teacher, batch.old_logps, batch.advantages, mask, 1.0, 0.2)
    assert (plain - expected).abs().max() > 1e-3
    kept = mask.bool() & ~span.bool() if thought_only else mask.bool() & (batch.advantages >= 0)
    torch.testing.assert_close(got[kept], batch.advantages[kept], rtol=0, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_thought_span_is_the_released_mask(seed):
    """``tag_span_mask`` against ``_build_thought_span_mask`` on random token ids holding multi-token tags, spans that
    close, one left open, a closing tag outside a span, and padding; control: a mask that keeps the tags differs."""
    from sharpgrpo.strategies.distillation import tag_span_mask

    g = torch.Generator().manual_seed(seed)
    opening, closing = [5, 6], [7]
    ids = torch.randint(0, 5, (6, 24), generator=g)  # no tag token but where placed, in the first three rows
    ids[3:] = torch.randint(0, 10, (3, 24), generator=g)  # tags wherever they fall
    ids[0, 2:4], ids[0, 9] = torch.tensor(opening), 7
    ids[1, 0:2] = torch.tensor(opening)  # may stay open to the end
    ids[2, 3] = 7
    mask = (torch.arange(24)[None] < torch.randint(10, 25, (6, 1), generator=g)).double()
    expected = released_thought_span(ids, mask, opening, closing)
    got = tag_span_mask(ids, mask, opening, closing)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert expected[0, 4:9].eq(1).all() and expected.sum() > 0
    with_tags = torch.where(torch.isin(ids, torch.tensor(opening + closing)), mask, expected)
    assert not torch.equal(with_tags, expected)


def test_thought_only_needs_the_span_input_and_two_tags(tmp_path):
    args = cpu_config(tmp_path, strategies=["rlsd"], rlsd_thought_only=True, rlsd_thought_tags="<think> </think>",
                      num_generations=4, per_device_train_batch_size=4)
    assert STRATEGIES.get("rlsd")(args).needs_inputs == ("self_teacher_logps", "rlsd_thought_span")
    with pytest.raises(ConfigError, match="rlsd_thought_tags") as error:
        cpu_config(tmp_path, strategies=["rlsd"], rlsd_thought_only=True, rlsd_thought_tags="<think>",
                   num_generations=4, per_device_train_batch_size=4)
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="rlsd_lambda_decay_steps"):
        cpu_config(tmp_path, strategies=["rlsd"], rlsd_lambda_decay_steps=-1, num_generations=4,
                   per_device_train_batch_size=4)
