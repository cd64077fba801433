"""CW-GRPO as its authors' released code runs it (`cw_variant: released`) against a float64 reference.

The reference is written from the released trainer's loss (github WangCheng0116/CW-GRPO at 4d46a2c,
src/open_r1/trl/trainer/grpo_trainer.py, compute_loss lines 760-830: `use_ours` weights at 784-807), restated in
six points and coded here independently of sharpgrpo: (1) log-probabilities centred by each response's own masked
mean, (2) advantages centred over the micro-batch, (3) sigma the population std of c over the valid tokens plus
1e-8, (4) renormalisation by the micro-batch's B x T (padding included), (5) w computed from the current policy's
log-probabilities with gradient, (6) w on the policy term only, KL unweighted, per-sequence mean then batch mean,
one iteration (r = exp(logp - sg[logp])).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import cpu_config, make_trainer

from sharpgrpo.strategies.base import STRATEGIES, TokenWeightStrategy
from sharpgrpo.strategies.covariance import (
    CovarianceWeighting,
    ReleasedCovarianceWeights,
    released_covariance_weights,
)
from sharpgrpo.strategy_params import StrategyParams
from sharpgrpo.validation import ConfigError


def random_micro_batch(seed, rows=6, cols=9, dtype=torch.float64):
    """Log-probabilities, group-normalised-looking advantages and a right-padded mask (ragged lengths, one row of
    length 1, one full row)."""
    gen = torch.Generator().manual_seed(seed)
    logps = -3.0 * torch.rand(rows, cols, generator=gen, dtype=torch.float64)
    advantages = torch.randn(rows, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, cols + 1, (rows,), generator=gen)
    lengths[0], lengths[-1] = 1, cols
    mask = (torch.arange(cols)[None, :] < lengths[:, None]).long()
    return logps.to(dtype), advantages.to(dtype), mask


def reference_weights(logps, advantages, mask):
    """The six points' weights with python loops over float64 floats."""
    lp, adv, m = logps.double().tolist(), advantages.double().flatten().tolist(), mask.tolist()
    rows, cols = len(lp), len(lp[0])
    adv_mean = sum(adv) / rows
    cov = [[0.0] * cols for _ in range(rows)]
    for i in range(rows):
        count = sum(m[i])
        mean = sum(lp[i][t] for t in range(cols) if m[i][t]) / (count + 1e-8)
        for t in range(cols):
            if m[i][t]:
                cov[i][t] = (lp[i][t] - mean) * (adv[i] - adv_mean)
    values = [cov[i][t] for i in range(rows) for t in range(cols) if m[i][t]]
    centre = sum(values) / len(values)
    sigma = math.sqrt(sum((v - centre) ** 2 for v in values) / len(values)) + 1e-8
    kernel = [[math.exp(-cov[i][t] ** 2 / (2 * sigma**2)) if m[i][t] else 0.0 for t in range(cols)] for i in range(rows)]
    total = sum(map(sum, kernel))
    scale = rows * cols / total if total > 0 else 1.0
    return torch.tensor([[k * scale for k in row] for row in kernel], dtype=torch.float64)


def reference_loss(logps, anchor, advantages, mask, ref_logps, beta, weight_gradient=True):
    """-(w r A) + beta k3 per token with r = exp(logp - anchor) (anchor = sg[logp]), mean per sequence, then over
    sequences; float64 torch, w through its own loop-free formula of the six points."""
    m = mask.double()
    lp = logps if weight_gradient else logps.detach()
    mean = (lp * m).sum(1, keepdim=True) / (m.sum(1, keepdim=True) + 1e-8)
    cov = (lp - mean) * m * (advantages - advantages.mean())[:, None]
    flat = cov[mask.bool()]
    sigma = ((flat - flat.mean()) ** 2).mean().sqrt() + 1e-8
    w = torch.exp(-cov**2 / (2 * sigma**2)) * m
    w = w * w.numel() / w.sum()
    ratio = torch.exp(logps - anchor)
    kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
    per_token = -(w * ratio * advantages[:, None]) + beta * kl
    return ((per_token * m).sum(1) / m.sum(1)).mean()


def padded_micro_batch(model, gen: torch.Generator, prompt: int, lengths: list[int], cols: int):
    """A micro-batch as the loss receives it: random prompts of ``prompt`` tokens, completions of ``cols`` tokens padded
    after ``lengths``, float64 advantages. Returns (inputs, prompt + completion ids, their attention mask)."""
    rows, vocab = len(lengths), model.config.vocab_size
    completion_mask = (torch.arange(cols)[None, :] < torch.tensor(lengths)[:, None]).long()
    inputs = {
        "prompt_ids": torch.randint(0, vocab, (rows, prompt), generator=gen),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (rows, cols), generator=gen),
        "completion_mask": completion_mask,
        "advantages": torch.randn(rows, generator=gen, dtype=torch.float64),
        "num_items_in_batch": completion_mask.sum(),
    }
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    return inputs, input_ids, torch.cat([inputs["prompt_mask"], completion_mask], 1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weights_match_loop_reference(seed, dtype):
    logps, advantages, mask = random_micro_batch(seed, dtype=dtype)
    weights = released_covariance_weights(logps, advantages, mask)
    expected = reference_weights(logps, advantages, mask)
    assert weights.dtype == dtype
    torch.testing.assert_close(weights.double(), expected, rtol=1e-6, atol=1e-6)
    # Point 4: with padding the mean over valid tokens is B T / (valid tokens) > 1, and w = 0 on padding.
    assert mask.sum() < mask.numel()
    valid = mask.bool()
    assert weights[valid].double().mean().item() == pytest.approx(mask.numel() / mask.sum().item(), rel=1e-6)
    assert torch.all(weights[~valid] == 0)
    # (B, 1) advantages, as the trainer passes them, give the same weights.
    torch.testing.assert_close(released_covariance_weights(logps, advantages[:, None], mask), weights)


def test_differs_from_the_paper_reading():
    """Point 1-3: per-response centring and micro-batch centring differ from the paper variant's group statistics."""
    from sharpgrpo.strategies.covariance import covariance_gaussian_weights

    logps, advantages, mask = random_micro_batch(4)
    released = released_covariance_weights(logps, advantages, mask)
    paper, _ = covariance_gaussian_weights(logps, advantages, mask, torch.zeros(6, dtype=torch.long))
    valid = mask.bool()
    released_mean_one = released[valid] * mask.sum() / mask.numel()  # undo point 4's padding factor
    assert (released_mean_one - paper[valid]).abs().max() > 1e-2


def test_equal_advantages_give_uniform_weights():
    """A micro-batch whose advantages are all equal: c = 0, sigma = 1e-8, w = 1 before renormalisation, so every
    valid token gets B T / (valid tokens); the gradient stays finite (and 0 through w)."""
    logps, _, mask = random_micro_batch(5)
    logps.requires_grad_(True)
    weights = released_covariance_weights(logps, torch.zeros(6, dtype=torch.float64), mask)
    valid = mask.bool()
    torch.testing.assert_close(weights[valid], torch.full_like(weights[valid], mask.numel() / mask.sum().item()))
    weights.sum().backward()
    assert torch.isfinite(logps.grad).all() and torch.all(logps.grad == 0)


@pytest.mark.parametrize("seed", [6, 7, 8])
@pytest.mark.parametrize("weight_gradient", [True, False])
def test_loss_gradient_matches_finite_differences(seed, weight_gradient):
    """Point 5: d loss / d logp through w (and through the ratio) against central differences of the loop
    reference; without the gradient switch only the ratio and the KL carry gradient."""
    logps, advantages, mask = random_micro_batch(seed, rows=4, cols=5)
    ref_logps = logps + 0.2 * torch.randn(logps.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    anchor, beta = logps.clone(), 0.04

    def loop_loss(lp, w_lp):
        w = reference_weights(w_lp, advantages, mask).tolist()
        total = 0.0
        for i in range(lp.shape[0]):
            row = 0.0
            for t in range(lp.shape[1]):
                if mask[i, t]:
                    diff = float(ref_logps[i, t] - lp[i, t])
                    row += -w[i][t] * math.exp(float(lp[i, t] - anchor[i, t])) * float(advantages[i])
                    row += beta * (math.exp(diff) - diff - 1)
            total += row / int(mask[i].sum())
        return total / lp.shape[0]

    variable = logps.clone().requires_grad_(True)
    strategy = ReleasedCovarianceWeights(StrategyParams(cw_variant="released", cw_weight_gradient=weight_gradient))
    weights = strategy.loss_weights(variable, mask, advantages[:, None])
    ratio = torch.exp(variable - variable.detach())
    kl = torch.exp(ref_logps - variable) - (ref_logps - variable) - 1
    per_token = -(weights * ratio * advantages[:, None]) + beta * kl
    loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    loss.backward()
    assert loss.item() == pytest.approx(loop_loss(logps, logps), abs=1e-9)
    step = 1e-6
    numeric = torch.zeros_like(logps)
    for i in range(logps.shape[0]):
        for t in range(logps.shape[1]):
            if not mask[i, t]:
                continue
            plus, minus = logps.clone(), logps.clone()
            plus[i, t] += step
            minus[i, t] -= step
            w_plus, w_minus = (plus, minus) if weight_gradient else (logps, logps)
            numeric[i, t] = (loop_loss(plus, w_plus) - loop_loss(minus, w_minus)) / (2 * step)
    torch.testing.assert_close(variable.grad, numeric, rtol=1e-6, atol=1e-6)


def test_micro_batches_are_independent():
    """Under several processes each process centres and normalises its own micro-batch (the released trainer
    gathers nothing for the weights): the weights of two micro-batches are not those of their union."""
    logps, advantages, mask = random_micro_batch(9, rows=8)
    whole = released_covariance_weights(logps, advantages, mask)
    halves = torch.cat([released_covariance_weights(logps[r], advantages[r], mask[r]) for r in (slice(0, 4), slice(4, 8))])
    torch.testing.assert_close(halves[:4], reference_weights(logps[:4], advantages[:4], mask[:4]))
    assert (halves - whole).abs().max() > 1e-3


def test_registry_builds_the_released_strategy():
    assert STRATEGIES.get("cw_grpo") is CovarianceWeighting
    released = CovarianceWeighting(StrategyParams(cw_variant="released"))
    assert isinstance(released, ReleasedCovarianceWeights) and isinstance(released, TokenWeightStrategy)
    assert released.kind == "weight" and released.gradient
    assert not ReleasedCovarianceWeights(StrategyParams(cw_variant="released", cw_weight_gradient=False)).gradient
    assert isinstance(CovarianceWeighting(StrategyParams()), CovarianceWeighting)
    with pytest.raises(ValueError, match="cw_weight_gradient=True: needs cw_variant: released"):
        CovarianceWeighting.check_params(StrategyParams(cw_weight_gradient=True))  # a relation: check_params


def released_config(tmp_path, **overrides):
    options = dict(strategies="cw_grpo", cw_variant="released", loss_type="grpo", per_device_train_batch_size=8,
                   num_generations=4, max_completion_length=6)
    options.update(overrides)
    return cpu_config(tmp_path, **options)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(loss_type="dapo"), "loss_type='dapo'"),
        (dict(num_iterations=2), "num_iterations=2"),
        (dict(gradient_accumulation_steps=2, steps_per_generation=2), "steps_per_generation=2"),
        (dict(weight_placement="ratio"), "weight_placement='ratio'"),
        (dict(beta=0.04, kl_weighting="loss"), "kl_weighting='loss'"),
        (dict(beta=0.04, kl_weighting="none", use_bias_correction_kl=True), "use_bias_correction_kl=True"),
        (dict(importance_sampling_level="sequence"), "importance_sampling_level='sequence'"),
        (dict(top_entropy_quantile=0.5), "top_entropy_quantile=0.5"),
        (dict(entropy_coef=0.01), "entropy_coef=0.01"),
        (dict(sharpness_probe_steps=5), "sharpness_probe_steps=5"),
        (dict(strategies=["grpo_sg", "cw_grpo"]), "strategies=['grpo_sg', 'cw_grpo']"),
    ],
)
def test_config_refuses_what_cannot_express_the_released_loss(tmp_path, overrides, field):
    with pytest.raises(ConfigError) as error:
        released_config(tmp_path, **overrides)
    message = str(error.value)
    assert message.startswith(field) and "cw_variant=released" in message and "\n" not in message


def test_config_accepts_the_released_loss_and_checks_the_switch(tmp_path):
    released_config(tmp_path, beta=0.04, kl_weighting="none", use_bias_correction_kl=False)
    released_config(tmp_path, cw_weight_gradient=False, sharpness_probe_steps=5)  # detached weights: probe is fine
    with pytest.raises(ConfigError, match="^cw_weight_gradient=True: needs cw_variant: released"):
        released_config(tmp_path, cw_variant="paper", cw_weight_gradient=True)
    with pytest.raises(ConfigError, match="cw_variant"):
        released_config(tmp_path, cw_variant="authors")


@pytest.mark.parametrize("weight_gradient", [True, False])
def test_trainer_loss_and_gradients_match_the_reference(tiny_model_path, tmp_path, weight_gradient):
    """The trainer's micro-batch loss and parameter gradients (tiny model in float64, padded completions, beta
    0.04) equal the reference loss built from the same log-probabilities."""
    rows, prompt, cols = 8, 5, 6
    args = released_config(tmp_path, beta=0.04, kl_weighting="none", use_bias_correction_kl=False,
                           cw_weight_gradient=weight_gradient, max_completion_length=cols)
    trainer = make_trainer(tiny_model_path, args, train_dataset=16)
    model = trainer.model.double().train()
    gen = torch.Generator().manual_seed(11)
    inputs, input_ids, attention = padded_micro_batch(model, gen, prompt, [1, 6, 3, 4, 6, 2, 5, 6], cols)
    completion_mask = inputs["completion_mask"]
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, cols)
    inputs["ref_per_token_logps"] = logps + 0.2 * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    trainer.current_gradient_accumulation_steps = 1

    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    current, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention, cols)
    expected = reference_loss(current, current.detach(), inputs["advantages"], completion_mask,
                              inputs["ref_per_token_logps"], 0.04, weight_gradient)
    expected.backward()
    assert grads and loss.item() == pytest.approx(expected.item(), abs=1e-7)
    for name, param in model.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-6, atol=1e-6, msg=name)
    assert trainer._metrics["train"]["token_weight/mean"][-1] == pytest.approx(
        completion_mask.numel() / completion_mask.sum().item(), rel=1e-5)


def test_a_weight_that_underflows_to_zero_is_accepted():
    """exp(-z^2 / 2) underflows to exactly 0 in float32 for one outlying token of a micro-batch (on SmolLM2-135M it did
    within 12 steps on 2 of 3 seeds): the released code trains on, and so does this variant; the output checker
    accepts w = 0 from it (>= 0), still refuses negative weights, and still refuses 0 from a strategy that does not
    declare zero weights."""
    from sharpgrpo.strategies.probability_shaping import GRPOSGWeights
    from sharpgrpo.training.output_checks import StrategyOutputChecker
    logps = torch.full((8, 64), -1.0)
    logps[0, 0] = -80.0  # one token far from every other: z of about 16
    advantages = torch.tensor([2.0, -1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0])
    mask = torch.ones(8, 64, dtype=torch.long)
    released = ReleasedCovarianceWeights(StrategyParams(cw_variant="released"))
    weights = released.loss_weights(logps, mask, advantages)
    assert weights[0, 0] == 0 and (weights[mask.bool()] == 0).sum() == 1
    checker = StrategyOutputChecker({"cw_grpo": ReleasedCovarianceWeights, "grpo_sg": GRPOSGWeights})
    assert checker.count_bad_weights(released, weights, logps, mask) == 0
    checker.raise_for_weights(released, weights, logps, mask)  # accepted
    with pytest.raises(ValueError, match=r"value\(s\) < 0 .* must be >= 0"):
        checker.raise_for_weights(released, weights - 2.0, logps, mask)
    shaped = GRPOSGWeights(StrategyParams())
    assert checker.count_bad_weights(shaped, weights, logps, mask) == 1
    with pytest.raises(ValueError, match=r"value\(s\) <= 0 .* must be > 0"):
        checker.raise_for_weights(shaped, weights, logps, mask)


def raw_logit_logps(model, input_ids, attention, cols, temperature=1.0):
    """Per-token log-probabilities of the completion's tokens from the model's logits divided by ``temperature``, in
    float64, as the released ``_get_per_token_logps`` computes them at 1 (github WangCheng0116/CW-GRPO at 4d46a2c,
    src/open_r1/trl/trainer/grpo_trainer.py lines 501-537: ``selective_log_softmax(logits, ids)``, no temperature;
    the temperature reaches only the sampler, lines 438-440 and 450-455)."""
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, -cols - 1 : -1].double() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, -cols:, None]).squeeze(-1)


def test_loss_at_the_authors_temperature_reads_logps_at_temperature_1(tiny_model_path, tmp_path, weight_gradient=True):
    """At the authors' recipe temperature 0.7 the released loss computes w, the ratio and the KL from log-probabilities
    at temperature 1 (the released compute_loss, lines 760-830, calls _get_per_token_logps, which does not divide the
    logits): the trainer's loss and gradients equal the float64 transcription on those, and differ from the same
    transcription on TRL's temperature-scaled log-probabilities (what this variant computed before). Gradients agree to
    1e-5 (TRL's fused LM head accumulates in chunks; the scaled ones differ by units to tens here)."""
    rows, prompt, cols = 8, 5, 6
    args = released_config(tmp_path, beta=0.04, kl_weighting="none", use_bias_correction_kl=False, temperature=0.7,
                           cw_weight_gradient=weight_gradient, max_completion_length=cols)
    trainer = make_trainer(tiny_model_path, args, train_dataset=16)
    model = trainer.model.double().train()
    gen = torch.Generator().manual_seed(5)
    inputs, input_ids, attention = padded_micro_batch(model, gen, prompt, [2, 6, 3, 4, 6, 1, 5, 6], cols)
    completion_mask = inputs["completion_mask"]
    with torch.no_grad():
        reference_logps = raw_logit_logps(model, input_ids, attention, cols)
    inputs["ref_per_token_logps"] = reference_logps + 0.2 * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    trainer.current_gradient_accumulation_steps = 1

    model.zero_grad()
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    losses, gradients = {}, {}
    for temperature in (1.0, 0.7):
        model.zero_grad()
        current = raw_logit_logps(model, input_ids, attention, cols, temperature)
        expected = reference_loss(current, current.detach(), inputs["advantages"], completion_mask,
                                  inputs["ref_per_token_logps"], 0.04, weight_gradient)
        expected.backward()
        losses[temperature] = expected.item()
        gradients[temperature] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert grads and loss.item() == pytest.approx(losses[1.0], abs=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, gradients[1.0][name], rtol=1e-5, atol=1e-5, msg=name)
    # The temperature matters on this batch: the scaled log-probabilities give another loss and gradient.
    assert abs(losses[0.7] - losses[1.0]) > 1e-3
    flat = {t: torch.cat([g.flatten() for g in gradients[t].values()]) for t in gradients}
    assert (flat[0.7] - flat[1.0]).norm() > 0.05 * flat[1.0].norm()


def test_reference_logps_at_the_authors_temperature_are_at_temperature_1(tiny_model_path, tmp_path):
    """A real generation batch at temperature 0.7 with beta > 0: the reference's log-probabilities stored for the loss
    are the reference model's at temperature 1 (released lines 640-650 call the same _get_per_token_logps), while the
    completions are still sampled at 0.7 (the generation config keeps it)."""
    args = released_config(tmp_path, beta=0.04, kl_weighting="none", use_bias_correction_kl=False, temperature=0.7)
    trainer = make_trainer(tiny_model_path, args, train_dataset=16)
    assert trainer.ref_model is not None and trainer.temperature == 0.7
    assert trainer.generation_config.temperature == 0.7
    rows = [trainer.train_dataset[i] for i in range(8)]
    with torch.no_grad():
        output = trainer._generate_and_score_completions(rows)
    input_ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
    cols, mask = output["completion_ids"].size(1), output["completion_mask"].bool()
    with torch.no_grad():
        at_1 = raw_logit_logps(trainer.ref_model, input_ids, attention, cols)
        at_07 = raw_logit_logps(trainer.ref_model, input_ids, attention, cols, temperature=0.7)
    stored = output["ref_per_token_logps"].double()
    torch.testing.assert_close(stored[mask], at_1[mask], rtol=1e-4, atol=1e-4)
    assert (stored[mask] - at_07[mask]).abs().max() > 1e-2
