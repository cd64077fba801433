"""Every strategy with every TRL 1.16 loss type, on the tiny model.

The grid shares one trainer: for each strategy it generates and scores a real batch (two groups of 8 completions,
binary rewards so that every advantage strategy applies), then for each loss type computes the loss, backpropagates
and takes an SGD step, checking the loss and gradients are finite, the gradient is not zero and the parameters move.
A few representative combinations then train end to end through `Trainer.train` with gradient accumulation and the
entropy bonus (as TRL's own `test_training_loss_types` does for the parent).
"""

import math

import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.training.generation.inputs import input_providers

# Placement per loss type: `ratio` where it is defined (README), so both placements are exercised.
PLACEMENT = {"dapo": "loss", "grpo": "ratio", "bnpo": "loss", "dr_grpo": "ratio",
             "luspo": "loss", "cispo": "ratio", "sapo": "ratio", "vespo": "loss"}
# Every registered weight and advantage strategy (the loss-side ones: tests/integration/test_loss_strategies.py).
ALL_STRATEGIES = [name for name in STRATEGIES.names() if STRATEGIES.get(name).kind in ("weight", "advantage")]


def binary_reward_trainer(model_path, output_dir, **kwargs):
    """The tiny model's training config (``tiny_config``) with ``binary_letters_reward``."""
    return make_trainer(model_path, tiny_config(output_dir, **kwargs), reward_funcs=[binary_letters_reward])


@pytest.fixture(scope="module")
def grid_trainer(tiny_model_path, tmp_path_factory):
    trainer = binary_reward_trainer(tiny_model_path, tmp_path_factory.mktemp("grid"), strategies="equal",
                                    loss_type="cispo", epsilon_high=5.0, weight_placement="loss")
    trainer.current_gradient_accumulation_steps = 1
    return trainer


@pytest.mark.every_strategy  # one run per registered strategy grows with the registry: `-m every_strategy` (CI)
@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_loss_type_grid(grid_trainer, strategy):
    trainer = grid_trainer
    instance = STRATEGIES.get(strategy)(trainer.args)
    trainer.weight_strategy = instance if instance.kind == "weight" else None
    trainer.advantage_strategies = [instance] if instance.kind == "advantage" else []
    if getattr(instance, "needs_inputs", ()):  # a distillation teacher (docs/methods.md §16): the policy's checkpoint
        trainer.args.teacher_model = trainer.model.config._name_or_path
    trainer._input_providers = input_providers(trainer, getattr(instance, "needs_inputs", ()))
    dataset = trainer.train_dataset
    rows = [dataset[i] for i in [1] * 8 + [2] * 8]  # two groups of 8, as TRL's RepeatSampler lays them out
    torch.manual_seed(0)
    inputs = trainer._generate_and_score_completions(rows)
    assert inputs["advantages"].abs().max() > 0, "no group had mixed rewards"
    if instance.kind == "advantage" and trainer._folded_strategy() is None:  # on-policy `ar` acts in the loss instead
        assert inputs["advantages"].shape == inputs["completion_ids"].shape  # token advantages
    initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.model.train()
    try:
        for loss_type, placement in PLACEMENT.items():
            trainer.loss_type, trainer.args.loss_type, trainer.args.weight_placement = loss_type, loss_type, placement
            trainer.model.zero_grad()
            loss = trainer._compute_loss(trainer.model, inputs)
            loss.backward()
            assert math.isfinite(loss.item()), loss_type
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            assert all(torch.isfinite(g).all() for g in grads), loss_type
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            assert norm > 0, f"{strategy} with {loss_type}: zero gradient"
            with torch.no_grad():  # a plain SGD step on the gradient, then the parameters must have moved
                before = [p.detach().clone() for p in trainer.model.parameters()]
                for parameter in trainer.model.parameters():
                    if parameter.grad is not None:
                        parameter -= 1e-2 * parameter.grad / norm
                assert any(not torch.equal(p, b) for p, b in zip(trainer.model.parameters(), before, strict=True))
    finally:
        with torch.no_grad():
            for name, parameter in trainer.model.named_parameters():
                parameter.copy_(initial[name])
        trainer.model.zero_grad()


@pytest.mark.parametrize(
    "options",
    [
        dict(loss_type="cispo", epsilon_high=5.0, strategies=["grpo_sg"], weight_placement="ratio", entropy_coef=0.01),
        dict(loss_type="vespo", strategies=["grpo_sg", "cw_grpo"], weight_placement="loss", use_adaptive_entropy=True,
             entropy_target=100.0, entropy_coef=0.01),
    ],
    ids=["cispo-grpo_sg-ratio-static_entropy", "vespo-grpo_sg+cw_grpo-loss-adaptive_entropy"],
)
def test_representative_combinations_train(tiny_model_path, tmp_path, options):
    trainer = binary_reward_trainer(tiny_model_path, tmp_path, per_device_train_batch_size=8,
                                    gradient_accumulation_steps=2, max_steps=2, **options)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before), "some parameters did not change"
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert all("policy_loss" in entry and "entropy_coef" in entry for entry in logs)
    if options["loss_type"] == "cispo":
        assert all("cispo_clip_ratio" in entry for entry in logs)
    else:
        assert all(0.0 <= entry["vespo/phi_seq_mean"] <= 1.0 + 1e-6 for entry in logs)
    if options.get("use_adaptive_entropy"):  # entropy (~log vocab) is far below the target 100: the coef grows
        assert [entry["entropy_coef"] for entry in logs] == pytest.approx([0.015, 0.02])


def test_sharpness_probe_leaves_adaptive_entropy_control_alone(tiny_model_path, tmp_path):
    """The probe's extra loss passes must not step the adaptive entropy controller: same coefficients, same
    measured entropy and same losses as the run without the probe."""
    options = dict(strategies="grpo_sg", loss_type="sapo", weight_placement="ratio", use_adaptive_entropy=True,
                   entropy_coef=0.01, entropy_target=100.0, max_steps=2)
    plain = binary_reward_trainer(tiny_model_path, tmp_path / "plain", **options)
    plain.train()
    probed = binary_reward_trainer(tiny_model_path, tmp_path / "probed", sharpness_probe_steps=1, **options)
    probed.train()
    plain_logs, probed_logs = ([e for e in t.state.log_history if "loss" in e] for t in (plain, probed))
    assert all("sharpness/ascent_loss_increase" in entry for entry in probed_logs)
    for key in ("loss", "entropy_coef", "policy_loss"):
        assert [e[key] for e in probed_logs] == pytest.approx([e[key] for e in plain_logs], abs=1e-7), key
    assert probed.entropy_coef == plain.entropy_coef == pytest.approx(0.01 + 2 * 0.005)  # two steps below target
    assert probed._last_world_entropy == pytest.approx(plain._last_world_entropy, rel=1e-6)


@pytest.mark.parametrize("loss_type", ["cispo", "dapo"])
def test_parent_warns_on_sequence_level_with_token_summed_loss(tiny_model_path, tmp_path, caplog, loss_type):
    """TRL's own check (its test_warning_raised_sequence_level_with_token_summed_loss) runs for SharpGRPOTrainer."""
    import logging

    with caplog.at_level(logging.WARNING, logger="trl.trainer.grpo_trainer"):
        binary_reward_trainer(tiny_model_path, tmp_path, strategies="equal", weight_placement="loss",
                              loss_type=loss_type, importance_sampling_level="sequence")
    assert any(f"the `'{loss_type}'` loss sums per-token" in record.getMessage() for record in caplog.records)
