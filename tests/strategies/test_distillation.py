"""The distillation advantages (``sharpgrpo.strategies.distillation``, docs/methods.md §16) against the released code
run unchanged on shared inputs: TRL 1.16's experimental IW-OPD loss (``IWOPDTrainer._compute_iw_opd_loss``) and SDPO
losses (``trl.experimental.sdpo.loss_utils`` and ``SDPOTrainer._compute_policy_loss``), verl's ``kl_penalty`` (k1,
imported from verl 0.9.1 where installed); lasgroup/SDPO's ``compute_self_distillation_loss`` and slime's
``apply_opd_kl_to_advantages`` are reproduced line by line (cited: neither is an installable package).

An advantage A' enters sharpgrpo's loss through the PPO surrogate -min(r A', clip(r) A'); on-policy (r = 1, the
first step on a batch) its gradient is -A' d log p, which is what each reference's distillation term differentiates
to. The tests compare gradients with respect to the student's logits in float64 (1e-9)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from sharpgrpo.strategies.distillation import (
    distillation_gap,
    iw_opd_advantages,
    iw_opd_weights,
    opd_advantages,
    sdpo_advantages,
)
from sharpgrpo.training.loss.aggregation import aggregate_loss
from sharpgrpo.training.loss.surrogates import policy_surrogate

V = 11


def shared_batch(seed: int, rows: int = 4, length: int = 6):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(rows, length, V, generator=g, dtype=torch.float64)
    teacher = torch.randn(rows, length, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (rows, length), generator=g)
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    advantages = torch.randn(rows, generator=g, dtype=torch.float64)
    return student, teacher, ids, mask, advantages


def token_logps(logits, ids):
    return torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def sharpgrpo_gradient(student, ids, mask, advantages_of, loss_type):
    """d loss / d student logits of sharpgrpo's on-policy surrogate with the token advantages ``advantages_of(old)``
    (old: the detached sampling log-probabilities)."""
    logits = student.clone().requires_grad_(True)
    logps = token_logps(logits, ids)
    old = logps.detach()
    per_token = policy_surrogate(loss_type, torch.exp(logps - old), advantages_of(old), logps, epsilon_low=0.2,
                                 epsilon_high=0.2)
    loss, _ = aggregate_loss(per_token, mask, loss_type, accumulation_steps=1.0, window_tokens=mask.sum())
    loss.backward()
    return logits.grad


def test_gap_and_opd_match_a_loop_and_verls_k1():
    student, teacher, ids, mask, advantages = shared_batch(0)
    s, t = token_logps(student, ids), token_logps(teacher * 8, ids)  # a sharp teacher: some gaps beyond 10
    for clip in (None, 10.0, 0.5):
        gap = distillation_gap(t, s, mask, clip)
        adv = opd_advantages(advantages[:, None].expand_as(s), gap, 0.7)
        for i in range(s.shape[0]):
            for k in range(s.shape[1]):
                d = float(t[i, k] - s[i, k]) if mask[i, k] else 0.0
                d = d if clip is None else min(max(d, -clip), clip)
                assert float(gap[i, k]) == pytest.approx(d, abs=1e-12)
                # slime loss.py L695-697: advantages[i] = adv - opd_kl_coef * (student - teacher)
                assert float(adv[i, k]) == pytest.approx(float(advantages[i]) + 0.7 * d, abs=1e-12)
    assert (distillation_gap(t, s, mask, 10.0) - distillation_gap(t, s, mask, None)).abs().max() > 0  # clip acts
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl's released code is not installed")
    k1 = core_algos.kl_penalty(s, t, "k1").clamp(-10.0, 10.0)  # verl distillation/losses.py L258-260
    torch.testing.assert_close(-k1 * mask, distillation_gap(t, s, mask, 10.0), atol=1e-12, rtol=0)


def test_opd_advantage_is_verls_two_ppo_terms_on_policy_and_not_off_policy():
    """verl adds a second PPO term with advantage -k1 (distillation/losses.py L269-287); on-policy it equals one PPO
    term with the summed advantage, off-policy (a ratio outside the clip) it does not: why docs/methods.md §16 says
    'on-policy'."""
    student, teacher, ids, mask, advantages = shared_batch(1)
    gap = distillation_gap(token_logps(teacher, ids), token_logps(student, ids).detach(), mask, 10.0)
    a = advantages[:, None].expand_as(gap)
    for shift, same in ((0.0, True), (0.6, False)):
        grads = []
        for advantage_list in ([opd_advantages(a, gap, 0.5)], [a, 0.5 * gap]):
            logits = student.clone().requires_grad_(True)
            logps = token_logps(logits, ids)
            old = logps.detach() - shift  # shift: the sampling policy was another one (ratio e^0.6)
            total = sum(aggregate_loss(policy_surrogate("bnpo", torch.exp(logps - old), adv, logps, epsilon_low=0.2,
                                                        epsilon_high=0.2), mask, "bnpo", accumulation_steps=1.0)[0]
                        for adv in advantage_list)
            total.backward()
            grads.append(logits.grad)
        if same:
            torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=0)
        else:
            assert (grads[0] - grads[1]).abs().max() > 1e-4


def trl_iw_opd(student, teacher, ids, mask, gamma, epsilon):
    """TRL 1.16's ``IWOPDTrainer._compute_iw_opd_loss`` run unchanged (a stand-in ``self`` carrying the attributes
    it reads); returns (d loss / d student logits, its logged metrics)."""
    from trl.experimental.iw_opd.iw_opd_trainer import IWOPDTrainer

    stand_in = SimpleNamespace(temperature=1.0, iw_opd_gamma=gamma, iw_opd_epsilon=epsilon,
                               model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)})
    logits = student.clone().requires_grad_(True)
    labels = ids.masked_fill(mask == 0, -100)
    loss = IWOPDTrainer._compute_iw_opd_loss(stand_in, logits, ids, labels, token_logps(teacher, ids))
    loss.backward()
    return logits.grad, {k: v[0] for k, v in stand_in._metrics["train"].items()}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [0.5, 0.0, 2.0])
def test_iw_opd_matches_trls_released_loss(seed, gamma):
    student, teacher, ids, mask, advantages = shared_batch(seed)
    expected, trl_metrics = trl_iw_opd(student, teacher, ids, mask, gamma, 1e-8)
    t = token_logps(teacher, ids)

    def advantages_of(old):
        return iw_opd_advantages(advantages[:, None].expand_as(old), distillation_gap(t, old, mask), mask, gamma,
                                 1e-8, weight=1.0)[0]

    got = sharpgrpo_gradient(student, ids, mask, advantages_of, "bnpo")  # TRL divides by the valid tokens
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)
    old = token_logps(student, ids)
    gap = distillation_gap(t, old, mask)
    _, w = iw_opd_advantages(advantages[:, None].expand_as(old), gap, mask, gamma, 1e-8, 1.0)
    valid = mask.bool()
    assert trl_metrics["iw_opd/mean_weight"] == pytest.approx(float(w[valid].mean()), abs=1e-9)
    assert trl_metrics["iw_opd/max_weight"] == pytest.approx(float(w[valid].max()), abs=1e-9)
    assert trl_metrics["iw_opd/mean_advantage"] == pytest.approx(float((w * gap)[valid].mean()), abs=1e-9)


def test_iw_opd_weights_loop_and_controls():
    g = torch.Generator().manual_seed(4)
    gap = torch.randn(3, 7, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 7, dtype=torch.float64)
    mask[1, 4:] = 0
    w = iw_opd_weights(gap, mask, 0.5)
    for i in range(3):
        m = [float(x) for x in mask[i]]
        total = max(sum(abs(float(gap[i, s])) * m[s] for s in range(7)), 1e-8)
        for k in range(7):
            prefix = sum(abs(float(gap[i, s])) * m[s] for s in range(k))
            assert float(w[i, k]) == pytest.approx(1 + 0.5 * (1 - prefix / total), abs=1e-12)
    assert torch.equal(iw_opd_weights(gap, mask, 0.0), torch.ones_like(gap))
    assert float(w[:, 0].min()) == pytest.approx(1.5)  # the first token gets the most weight
    half, _ = iw_opd_advantages(torch.ones_like(gap), gap * mask, mask, 0.5, 1e-8, 0.5)
    torch.testing.assert_close(half, 0.5 + 0.5 * w * gap * mask)


def trl_sdpo(student, teacher, ids, mask, teacher_rows, advantages, weight):
    """TRL 1.16's SDPO loss on one batch: ``SDPOTrainer._compute_policy_loss`` (loss_type grpo) and
    ``loss_utils.compute_sampled_token_self_distillation_loss`` + ``apply_importance_sampling_clipping`` run
    unchanged; the aggregation and the convex mix are ``_compute_self_distillation_loss`` L1252-1255 and
    ``compute_loss`` L1136-1140 (reproduced)."""
    from trl.experimental.sdpo.loss_utils import (
        apply_importance_sampling_clipping,
        compute_sampled_token_self_distillation_loss,
    )
    from trl.experimental.sdpo.sdpo_trainer import SDPOTrainer

    stand_in = SimpleNamespace(importance_sampling_level="token", epsilon_low=0.2, epsilon_high=0.2,
                               loss_type="grpo", max_completion_length=ids.shape[1],
                               model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list)},
                               accelerator=SimpleNamespace(gather=lambda x: x))
    logits = student.clone().requires_grad_(True)
    old = token_logps(logits, ids).detach()
    inputs = {"completion_ids": ids, "completion_mask": mask, "advantages": advantages, "old_per_token_logps": old}
    policy = SDPOTrainer._compute_policy_loss(stand_in, inputs, logits)
    per_token = compute_sampled_token_self_distillation_loss(logits, teacher, ids, distillation_alpha=1.0)
    per_token = apply_importance_sampling_clipping(per_token, token_logps(logits, ids), old, 2.0)
    loss_mask = mask * teacher_rows.unsqueeze(1)
    distill = ((per_token * loss_mask).sum(-1) / loss_mask.sum(-1).clamp(min=1.0)).mean()
    ((1 - weight) * policy + weight * distill).backward()
    return logits.grad


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("weight", [1.0, 0.5, 0.0])
def test_sdpo_advantage_matches_trls_released_sdpo_loss(seed, weight):
    student, teacher, ids, mask, advantages = shared_batch(seed)
    teacher_rows = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)  # the second has no successful sibling
    expected = trl_sdpo(student, teacher, ids, mask, teacher_rows, advantages, weight)
    t = token_logps(teacher, ids)

    def advantages_of(old):
        return sdpo_advantages(advantages[:, None].expand_as(old), distillation_gap(t, old, mask), teacher_rows,
                               weight)

    got = sharpgrpo_gradient(student, ids, mask, advantages_of, "grpo")  # TRL's SDPO: per-sequence means
    torch.testing.assert_close(got, expected, atol=1e-9, rtol=0)
    if weight > 0:  # control: without the teacher rows, another gradient
        other = sharpgrpo_gradient(student, ids, mask, lambda old: sdpo_advantages(
            advantages[:, None].expand_as(old), distillation_gap(t, old, mask), torch.ones(4, dtype=torch.float64),
            weight), "grpo")
        assert (other - expected).abs().max() > 1e-6


def lasgroup_sdpo(student, teacher, ids, mask, teacher_rows):
    """lasgroup/SDPO@0e6d510 ``verl/trainer/ppo/core_algos.py`` ``compute_self_distillation_loss`` L1085-1183,
    reproduced for the sampled-token branch (L1160-1163), ``is_clip`` 2 (L1165-1173) and ``agg_loss`` 'token-mean'
    over the loss mask (L1057-1060): it replaces the policy loss (``dp_actor.py`` L833-846)."""
    logits = student.clone().requires_grad_(True)
    s = token_logps(logits, ids)
    old = s.detach()
    loss_mask = mask * teacher_rows.unsqueeze(1)
    per_token = (s - token_logps(teacher, ids)).detach() * s
    ratio = torch.exp((s - old).detach().clamp(-20.0, 20.0)).clamp(max=2.0)
    per_token = per_token * ratio
    loss = (torch.where(loss_mask.bool(), per_token, 0.0) * loss_mask).sum() / loss_mask.sum()
    loss.backward()
    return logits.grad


def test_sdpo_matches_the_authors_code_up_to_its_token_count():
    """The authors' token mean divides by the tokens of the completions that have a teacher; sharpgrpo's `bnpo` by
    every loss token: equal when every completion has one, and a factor N_teacher / N_all apart otherwise."""
    student, teacher, ids, mask, advantages = shared_batch(3)
    t = token_logps(teacher, ids)
    for rows in (torch.ones(4, dtype=torch.float64), torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)):
        expected = lasgroup_sdpo(student, teacher, ids, mask, rows)
        got = sharpgrpo_gradient(student, ids, mask, lambda old, rows=rows: sdpo_advantages(
            advantages[:, None].expand_as(old), distillation_gap(t, old, mask), rows, 1.0), "bnpo")
        factor = float((mask * rows[:, None]).sum() / mask.sum())
        torch.testing.assert_close(got, expected * factor, atol=1e-9, rtol=0)


@pytest.mark.parametrize("conversational", [False, True])
def test_self_teacher_prompts_match_trls_released_context_builder(conversational):
    """TRL 1.16's ``SuccessfulRolloutTeacherContextBuilder.build`` run unchanged (one process; a stand-in trainer
    with the real tiny tokenizer and TRL's own ``_tokenize_prompts_untruncated``): the same rows get a self-teacher
    and the same teacher prompt token ids, with feedback on and off."""
    from trl.experimental.sdpo.sdpo_config import SDPOConfig
    from trl.experimental.sdpo.sdpo_trainer import SDPOTrainer, SuccessfulRolloutTeacherContextBuilder

    from sharpgrpo.models.tiny import build_tokenizer
    from sharpgrpo.training.generation.teacher import self_teacher_prompts, successful_siblings

    tokenizer = build_tokenizer()
    g = torch.Generator().manual_seed(0)
    G, groups, T = 4, 3, 5
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])  # 2, 0, 1 successes
    completion_ids = torch.randint(40, 120, (G * groups, T), generator=g)
    completion_ids[2, 3:] = tokenizer.pad_token_id  # a short completion, padded
    completion_mask = (completion_ids != tokenizer.pad_token_id).long()
    if conversational:
        prompts = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question {k}?"}]
                   for k in range(groups) for _ in range(G)]
    else:
        prompts = [f"Question {k}? " for k in range(groups) for _ in range(G)]
    feedbacks = [None, "too long", None, None, "", None, "wrong letter", None, None, None, None, "no answer"]
    for include_feedback in (False, True):
        fields = {name: f.default for name, f in SDPOConfig.__dataclass_fields__.items()
                  if name in ("reprompt_template", "solution_template", "feedback_template",
                              "success_reward_threshold", "dont_reprompt_on_self_success", "max_reprompt_len",
                              "use_successful_as_teacher", "environment_feedback_only_without_solution",
                              "remove_thinking_from_demonstration")}
        stand_in = SimpleNamespace(
            args=SimpleNamespace(**fields, include_environment_feedback=include_feedback),
            accelerator=SimpleNamespace(device=torch.device("cpu"), process_index=0, gather=lambda x: x,
                                        pad_across_processes=lambda x, **kwargs: x),
            model=SimpleNamespace(training=True), num_generations=G, _tokenizer=tokenizer,
            processing_class=tokenizer, chat_template_kwargs={})
        stand_in._tokenize_prompts_untruncated = lambda p, s=stand_in: SDPOTrainer._tokenize_prompts_untruncated(s, p)
        built = SuccessfulRolloutTeacherContextBuilder(stand_in).build(
            {"completion_ids": completion_ids, "completion_mask": completion_mask}, prompts, rewards, feedbacks)

        siblings = successful_siblings(rewards, G, 1.0, exclude_self=True)
        pad = tokenizer.pad_token_id
        demos = [None if j is None else tokenizer.decode(completion_ids[j][completion_ids[j] != pad],
                                                          skip_special_tokens=True) for j in siblings]
        used = [f if include_feedback and isinstance(f, str) and f.strip() else None for f in feedbacks]
        ours = self_teacher_prompts(prompts, demos, used)
        has_teacher = [d is not None or f is not None for d, f in zip(demos, used)]
        assert built["self_distillation_mask"].tolist() == [float(x) for x in has_teacher]
        assert 0 < sum(has_teacher) < len(has_teacher)
        ids = (tokenizer.apply_chat_template(ours, add_generation_prompt=True, tokenize=True, return_dict=True)
               if conversational else tokenizer(text=ours))["input_ids"]
        width = built["teacher_input_ids"].shape[1] - T
        for row, expected in enumerate(ids):
            trl_prompt = built["teacher_input_ids"][row, :width][built["teacher_attention_mask"][row, :width].bool()]
            assert trl_prompt.tolist() == expected


@pytest.mark.parametrize("weight", [1.0, 0.5])
def test_sdpo_batch_without_a_self_teacher_is_said_once(weight):
    """A batch where no completion has a successful sibling (or feedback) gives sdpo nothing to distil: with
    sdpo_weight 1 its advantage is then 0 everywhere. That is said (once, naming the threshold), not silent; a batch
    with a self-teacher says nothing."""
    import warnings

    from sharpgrpo.strategies import STRATEGIES
    from sharpgrpo.strategies.base import GenerationBatch

    _, _, ids, mask, advantages = shared_batch(0)
    args = SimpleNamespace(sdpo_weight=weight, sdpo_success_threshold=0.9, sdpo_teacher="live")

    def batch(teacher):
        return GenerationBatch(old_logps=torch.zeros_like(mask), completion_mask=mask, completion_ids=ids,
                               advantages=advantages[:, None].expand_as(mask).clone(), rewards=advantages,
                               group_ids=torch.zeros(4, dtype=torch.long), num_generations=4,
                               extras={"self_teacher_logps": teacher})

    sdpo = STRATEGIES.get("sdpo")(args)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sdpo.token_advantages(batch(torch.full_like(mask, -1.0)))  # every row has a self-teacher
        assert not caught
        got, metrics = sdpo.token_advantages(batch(torch.full_like(mask, float("nan"))))
        sdpo.token_advantages(batch(torch.full_like(mask, float("nan"))))
    assert metrics["sdpo/reprompt_fraction"] == 0.0
    assert len(caught) == 1 and "sdpo_success_threshold=0.9" in str(caught[0].message)
    assert ("teaches nothing" in str(caught[0].message)) == (weight == 1.0)
    torch.testing.assert_close(got, (1 - weight) * advantages[:, None].expand_as(mask))
