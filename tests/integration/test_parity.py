"""SharpGRPOTrainer's loss against the parent GRPOTrainer (strategy `equal`) and against a float64 reference.

The loss is TRL 1.16's `_compute_loss` with token weights added, so with w = 1 it must give the parent's loss and
gradients for every loss type TRL accepts and every option, the entropy bonus (static and adaptive) included.
Inputs are built directly (random completions, ragged masks, off-policy old log-probs, reference log-probs) so every
branch is exercised without generation.
"""

import math

import pytest
import torch
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from sharpgrpo import SharpGRPOConfig, SharpGRPOTrainer
from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
from sharpgrpo.strategies.loss_types import RATIO_PLACEMENT_LOSS_TYPES
from sharpgrpo.strategies.probability_shaping import probability_shaping_weights

B, PROMPT, T = 8, 5, 6


def build(trainer_cls, config_cls, model_path, tmp_path, **kwargs):
    args = config_cls(
        output_dir=str(tmp_path),
        report_to=[],
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=B,
        num_generations=4,
        max_completion_length=T,
        **kwargs,
    )
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=[allowed_letters_reward],
        args=args,
        train_dataset=demo_dataset(16),
        processing_class=AutoTokenizer.from_pretrained(model_path),
    )
    trainer.model.train()
    return trainer


def make_inputs(trainer, seed, off_policy=True, with_ref=True, sampled=False):
    """Random prompts and completions; ``sampled`` draws the completions from the model (likely tokens)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = trainer.model.config.vocab_size
    prompt_mask = torch.ones(B, PROMPT, dtype=torch.long)
    prompt_mask[:3, :2] = 0  # left padding
    completion_mask = torch.ones(B, T, dtype=torch.long)
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    lengths[0] = 1  # a single-token completion
    for row, length in enumerate(lengths.tolist()):
        completion_mask[row, length:] = 0
    inputs = {
        "prompt_ids": torch.randint(0, vocab, (B, PROMPT), generator=generator),
        "prompt_mask": prompt_mask,
        "completion_ids": torch.randint(0, vocab, (B, T), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }
    if sampled:
        torch.manual_seed(seed)
        inputs["completion_ids"] = trainer.model.generate(
            input_ids=inputs["prompt_ids"], attention_mask=prompt_mask, max_new_tokens=T, min_new_tokens=T,
            do_sample=True, eos_token_id=None,
        )[:, PROMPT:]
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([prompt_mask, completion_mask], 1),
            T,
        )
    if off_policy:  # as after a few optimizer steps (num_iterations > 1): ratios away from 1, some clipped
        inputs["old_per_token_logps"] = logps + 0.3 * torch.randn(B, T, generator=generator)
    if with_ref:
        inputs["ref_per_token_logps"] = logps + 0.2 * torch.randn(B, T, generator=generator)
    return inputs


def loss_and_grads(trainer, inputs, accumulation):
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


def assert_same(parent_result, sharp_result, atol=1e-6):
    (parent_loss, parent_grads), (sharp_loss, sharp_grads) = parent_result, sharp_result
    torch.testing.assert_close(sharp_loss, parent_loss, atol=atol, rtol=0)
    assert parent_grads.keys() == sharp_grads.keys() and parent_grads
    for name in parent_grads:
        torch.testing.assert_close(sharp_grads[name], parent_grads[name], atol=atol, rtol=1e-5, msg=name)


CASES = [
    dict(loss_type=loss_type, beta=beta, importance_sampling_level=level)
    for loss_type in ["dapo", "grpo", "bnpo", "dr_grpo"]
    for beta in [0.0, 0.04]
    for level in ["token", "sequence"]
]
EXTRAS = [
    dict(loss_type="dapo", beta=0.04, top_entropy_quantile=0.5),
    dict(loss_type="grpo", beta=0.0, off_policy_mask_threshold=0.05),
    dict(loss_type="bnpo", beta=0.04, delta=1.2),
    dict(loss_type="dapo", beta=0.04, use_bias_correction_kl=True),
    dict(loss_type="dapo", beta=0.0, steps_per_generation=4, gradient_accumulation_steps=4),
]
# The loss types beyond PPO's clip, and TRL's static entropy bonus (its scale per loss type and under accumulation).
NEW_LOSS_CASES = [
    dict(loss_type=loss_type, beta=beta, importance_sampling_level=level)
    for loss_type in ["luspo", "cispo", "sapo", "vespo"]
    for beta, level in [(0.0, "token"), (0.04, "sequence")]
] + [
    dict(loss_type="cispo", beta=0.0, epsilon_high=1.2),  # some ratios above the truncation, some below
    dict(loss_type="sapo", beta=0.04, sapo_temperature_pos=2.0, sapo_temperature_neg=0.5),
    dict(loss_type="vespo", beta=0.0, vespo_k_pos=1.0, vespo_lambda_neg=4.0, steps_per_generation=2,
         gradient_accumulation_steps=2),
]
ENTROPY_CASES = [
    dict(loss_type="dapo", beta=0.04, entropy_coef=0.05),
    dict(loss_type="grpo", beta=0.0, entropy_coef=0.05, top_entropy_quantile=0.5, steps_per_generation=2,
         gradient_accumulation_steps=2),
    dict(loss_type="cispo", beta=0.0, epsilon_high=1.2, entropy_coef=-0.02),
    dict(loss_type="luspo", beta=0.0, importance_sampling_level="sequence", entropy_coef=0.05,
         steps_per_generation=2, gradient_accumulation_steps=2),
]


def explicit_placement(options):
    """`ratio` where the loss type defines it (w = 1 either way), set explicitly so the default does not matter."""
    return "ratio" if options["loss_type"] in RATIO_PLACEMENT_LOSS_TYPES else "loss"


PARITY_CASES = [(options, off_policy) for options in CASES + EXTRAS for off_policy in (True, False)] + [
    (options, True) for options in NEW_LOSS_CASES + ENTROPY_CASES  # off-policy (r != 1, some clipped) only: cheaper
]
PARITY_IDS = [
    ("off_policy-" if off else "on_policy-") + "-".join(f"{k}={v}" for k, v in o.items()) for o, off in PARITY_CASES
]


@pytest.mark.parametrize(
    ("options", "off_policy"),
    PARITY_CASES,
    ids=PARITY_IDS,
)
def test_equal_strategy_matches_parent(tiny_model_path, tmp_path, options, off_policy):
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", **options)
    sharp = build(
        SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", strategies="equal",
        weight_placement=explicit_placement(options), **options,
    )
    accumulation = options.get("gradient_accumulation_steps", 1)
    for seed in range(2):
        inputs = make_inputs(parent, seed, off_policy=off_policy, with_ref=options["beta"] > 0)
        snapshot = {k: v.clone() for k, v in inputs.items()}
        expected = loss_and_grads(parent, inputs, accumulation)
        assert_same(expected, loss_and_grads(sharp, inputs, accumulation))
        for key, value in snapshot.items():  # TRL reuses inputs: they must not be mutated
            assert torch.equal(inputs[key], value), key
    for key, values in parent._metrics["train"].items():  # TRL's metric names, same values
        if key.startswith("clip_ratio/") and options.get("delta") is not None:
            continue  # TRL measures clipping on the ratio already capped at delta; sharpgrpo on the ratio itself
        assert sharp._metrics["train"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), key


def run_windows(trainer, micro_batches, accumulation):
    """Micro-batches in accumulation windows, as TRL's loop runs them: gradients sync on each window's last."""
    results = []
    for k, inputs in enumerate(micro_batches):
        trainer.accelerator.sync_gradients = k % accumulation == accumulation - 1
        results.append(loss_and_grads(trainer, inputs, accumulation))
    trainer.accelerator.sync_gradients = True
    return results


@pytest.mark.parametrize("loss_type", ["dapo", "sapo"])
@pytest.mark.parametrize("entropy_target", [100.0, 0.0], ids=["below_target", "above_target"])
def test_adaptive_entropy_matches_parent_over_accumulation_windows(tiny_model_path, tmp_path, loss_type,
                                                                    entropy_target):
    """Adaptive entropy control (Skywork-OR1) over 3 windows of 2 micro-batches: the same loss and gradients per
    micro-batch, the same coefficient and measured entropy after each window, the same metrics."""
    options = dict(
        loss_type=loss_type, beta=0.0, use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.05,
        entropy_target=entropy_target, steps_per_generation=2, gradient_accumulation_steps=2,
    )
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", **options)
    sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", strategies="equal",
                  weight_placement="ratio", **options)
    micro_batches = [make_inputs(parent, seed) for seed in range(6)]
    for window in range(3):
        batch = micro_batches[2 * window : 2 * window + 2]
        expected, got = run_windows(parent, batch, 2), run_windows(sharp, batch, 2)
        for parent_result, sharp_result in zip(expected, got, strict=True):
            assert_same(parent_result, sharp_result)
        assert sharp.entropy_coef == pytest.approx(parent.entropy_coef, abs=1e-12)
        assert sharp._last_world_entropy == pytest.approx(parent._last_world_entropy, rel=1e-6)
        assert sharp._entropy_window_stats is None and parent._entropy_window_stats is None
    # Not vacuous: the coefficient moved every window, and (entropy below target) the bonus entered the loss.
    step = 0.05 if entropy_target > 0 else -0.05
    assert sharp.entropy_coef == pytest.approx(max(0.1 + 3 * step, 0.0))
    metrics = sharp._metrics["train"]
    assert metrics["entropy_coef"] == pytest.approx(parent._metrics["train"]["entropy_coef"])
    assert len(metrics["entropy_coef"]) == 3 and len(metrics["policy_loss"]) == 6
    # policy_loss is the loss before the bonus, per micro-batch (sapo) or already per window (dapo's normaliser)
    policy_part = metrics["policy_loss"][-1] / (2 if loss_type == "sapo" else 1)
    if entropy_target > 0:
        assert abs(got[-1][0].item() - policy_part) > 1e-4
    else:  # entropy above the target: no bonus applied
        assert got[-1][0].item() == pytest.approx(policy_part, abs=1e-7)


@pytest.mark.parametrize("loss_type", ["luspo", "cispo", "sapo", "vespo"])
def test_loss_placed_weight_is_scaled_advantage_through_parent(tiny_model_path, tmp_path, loss_type):
    """README: a loss-placed weight multiplies each token's policy term, which for every TRL surrogate equals the
    parent trainer run with token advantages w*A (beta = 0: the KL term is not a policy term)."""
    options = dict(loss_type=loss_type, beta=0.0)
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", **options)
    sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", strategies="grpo_sg",
                  weight_placement="loss", **options)
    inputs = make_inputs(parent, 13, sampled=True, with_ref=False)
    with torch.no_grad():
        logps, _, _ = parent._get_per_token_logps_and_entropies(
            parent.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            T,
        )
    weights = probability_shaping_weights(logps.exp(), 2.0, 0.25, 1 / 9, 1.0, 1.4)
    assert weights[inputs["completion_mask"].bool()].std() > 0.01  # the weights really vary
    scaled = {**inputs, "advantages": weights * inputs["advantages"].unsqueeze(1)}
    assert_same(loss_and_grads(parent, scaled, 1), loss_and_grads(sharp, inputs, 1), atol=1e-6)


@pytest.mark.parametrize("kl_weighting", ["loss", "inside", "none"])
def test_equal_strategy_any_kl_weighting_is_parent(tiny_model_path, tmp_path, kl_weighting):
    options = dict(loss_type="dapo", beta=0.04)
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", **options)
    sharp = build(
        SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", strategies="equal",
        kl_weighting=kl_weighting, weight_placement="loss", **options,
    )
    inputs = make_inputs(parent, 7)
    assert_same(loss_and_grads(parent, inputs, 1), loss_and_grads(sharp, inputs, 1))


def reference_loss(logps, inputs, weights, placement, kl_weighting, beta, eps_low, eps_high):
    """float64 loops over tokens: docs/methods.md §1 surrogate and KL, aggregated as TRL's `dapo` (sum / tokens)."""
    assert B * T < 100  # a loop reference: keep it small
    old, ref = inputs["old_per_token_logps"].double(), inputs["ref_per_token_logps"].double()
    mask, advantages = inputs["completion_mask"], inputs["advantages"].double()
    total = 0.0
    for i in range(B):
        a = advantages[i].item()
        for t in range(T):
            if not mask[i, t]:
                continue
            r = math.exp(logps[i][t] - old[i, t].item())
            w = weights[i, t].item()
            if placement == "ratio":
                term = -min(w * r * a, min(max(w * r, 1 - eps_low), 1 + eps_high) * a)
            else:
                term = -w * min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)
            x = math.exp(ref[i, t].item() - logps[i][t])  # pref / p
            if kl_weighting == "inside":
                kl = w * x - math.log(w * x) - 1
            elif kl_weighting == "loss":
                kl = w * (x - math.log(x) - 1)
            else:
                kl = x - math.log(x) - 1
            total += term + beta * kl * r  # TRL's default use_bias_correction_kl: KL times the ratio
    return total / mask.sum().item()


@pytest.mark.parametrize("placement", ["ratio", "loss"])
@pytest.mark.parametrize("kl_weighting", ["loss", "inside", "none"])
def test_grpo_sg_loss_matches_float64_reference(tiny_model_path, tmp_path, placement, kl_weighting):
    sharp = build(
        SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path, strategies="grpo_sg", beta=0.04,
        weight_placement=placement, kl_weighting=kl_weighting,
    )
    inputs = make_inputs(sharp, 3, sampled=True)
    sharp.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        loss = sharp._compute_loss(sharp.model, inputs).item()
        logps, _, _ = sharp._get_per_token_logps_and_entropies(
            sharp.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            T,
        )
    weights = probability_shaping_weights(logps.double().exp(), 2.0, 0.25, 1 / 9, 1.0, 1.4)
    assert weights[inputs["completion_mask"].bool()].std() > 0.01  # the weights really vary
    expected = reference_loss(logps.double().tolist(), inputs, weights, placement, kl_weighting, 0.04, 0.2, 0.2)
    assert loss == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_ratio_placement_clips_heavy_positive_tokens_on_policy(tiny_model_path, tmp_path):
    """docs/methods.md §1: on-policy, w > 1 + eps_high with A > 0 lands in the clipped branch: no gradient at all."""
    options = dict(strategies="grpo_sg", sg_lower=1.4, sg_upper=1.4, beta=0.0)  # w = 1.4 everywhere
    ratio = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "r", weight_placement="ratio",
                  **options)
    loss_placed = build(
        SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "l", weight_placement="loss", **options
    )
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "p", beta=0.0)
    inputs = make_inputs(parent, 5, off_policy=False, with_ref=False)
    inputs["advantages"] = inputs["advantages"].abs() + 0.1
    _, ratio_grads = loss_and_grads(ratio, inputs, 1)
    assert all(g.abs().max() == 0 for g in ratio_grads.values())
    ratio_metrics = ratio._metrics["train"]
    assert ratio_metrics["token_weight/frac_grad_clipped"][-1] == 1.0
    assert ratio_metrics["token_weight/mean"][-1] == pytest.approx(1.4)
    assert "token_weight/frac_at_upper" not in ratio_metrics  # a constant weight sits at no clip bound
    # With the weight on the loss instead, the gradient is the parent's times 1.4.
    parent_loss, parent_grads = loss_and_grads(parent, inputs, 1)
    placed_loss, placed_grads = loss_and_grads(loss_placed, inputs, 1)
    torch.testing.assert_close(placed_loss, 1.4 * parent_loss)
    for name, grad in parent_grads.items():
        # All advantages are positive here, so gradients reach |g| ~ 20: fp32 rounding of w * grad vs grad(w * loss)
        # scales with the tensor's magnitude (seen: 3e-7 of max |g|), hence an absolute tolerance relative to it.
        scale = max(1.0, grad.abs().max().item())
        torch.testing.assert_close(placed_grads[name], 1.4 * grad, atol=1e-6 * scale, rtol=1e-5)


def test_sequence_token_level_is_gspo_token(tiny_model_path, tmp_path):
    """GSPO-token: the value of the sequence ratio with per-token gradients. With an advantage constant over a
    sequence it equals GSPO (TRL's `sequence` level) in loss and gradients; with token advantages it differs."""
    options = dict(strategies="equal", beta=0.0, loss_type="grpo")
    sequence = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "s",
                     importance_sampling_level="sequence", **options)
    sequence_token = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "st",
                           importance_sampling_level="sequence_token", **options)
    inputs = make_inputs(sequence, 11, off_policy=False, with_ref=False)
    with torch.no_grad():
        logps, _, _ = sequence._get_per_token_logps_and_entropies(
            sequence.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            T,
        )
    # Slightly off-policy, ratios near 1 so that no sequence is clipped.
    inputs["old_per_token_logps"] = logps + 0.01 * torch.randn(B, T, generator=torch.Generator().manual_seed(0))
    assert_same(loss_and_grads(sequence, inputs, 1), loss_and_grads(sequence_token, inputs, 1), atol=1e-6)
    token_inputs = {**inputs, "advantages": torch.randn(B, T, generator=torch.Generator().manual_seed(1))}
    _, grads_sequence = loss_and_grads(sequence, token_inputs, 1)
    _, grads_token = loss_and_grads(sequence_token, token_inputs, 1)
    assert any(not torch.allclose(grads_sequence[n], grads_token[n], atol=1e-5) for n in grads_sequence)


class HostReads:
    """Counts reads of tensor values on the host (``.item()``, ``.tolist()``, ``bool``/``float``/``int``) and
    tensors built on a device from host values: each is a host synchronisation on a GPU."""

    METHODS = ("item", "tolist", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original))

    def _counted(self, original):
        def wrapper(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)
        return wrapper


@pytest.mark.parametrize("strategy", ["equal", "grpo_sg", "random"])
def test_weight_strategy_adds_at_most_one_host_read_per_micro_batch(tiny_model_path, tmp_path, strategy,
                                                                    monkeypatch):
    """the weight strategies read their metrics and the check of their output (finite, > 0) with one
    synchronisation per micro-batch beyond TRL's own."""
    parent = build(GRPOTrainer, GRPOConfig, tiny_model_path, tmp_path / "parent", loss_type="dapo")
    sharp = build(SharpGRPOTrainer, SharpGRPOConfig, tiny_model_path, tmp_path / "sharp", loss_type="dapo",
                  strategies=strategy)
    inputs = make_inputs(parent, 3)
    counts = {}
    for name, trainer in (("parent", parent), ("sharp", sharp)):
        for micro_batch in range(2):  # the second shows the steady state (nothing cached on the first)
            trainer.current_gradient_accumulation_steps = 1
            reads = HostReads(monkeypatch)
            trainer._compute_loss(trainer.model, dict(inputs))
            counts[name, micro_batch] = reads.count
            monkeypatch.undo()
    assert counts["sharp", 0] <= counts["parent", 0] + 1, counts
    assert counts["sharp", 1] <= counts["parent", 1] + 1, counts
