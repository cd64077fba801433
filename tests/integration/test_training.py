"""Really train the tiny model a few steps with every strategy and check what changed.

Rewards are binary (the demo reward thresholded at 0.5) so that every strategy applies, pass@k included, and
groups are mixed (THR reweights only groups with correct and incorrect completions).
"""

import math

import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config

from sharpgrpo.strategies import STRATEGIES
from sharpgrpo.strategies.covariance import covariance_gaussian_weights
from sharpgrpo.validation import ConfigError

pytestmark = pytest.mark.slow


def binary_reward_trainer(model_path, output_dir, **kwargs):
    """The tiny model's training config (``tiny_config``) for two steps, with ``binary_letters_reward``."""
    args = tiny_config(output_dir, **{"max_steps": 2, **kwargs})
    return make_trainer(model_path, args, reward_funcs=[binary_letters_reward])


def train_and_check(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter changed"
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == trainer.args.max_steps
    return logs


WEIGHT_METRICS = [
    "token_weight/mean",
    "token_weight/std",
    "token_weight/min",
    "token_weight/max",
    "token_weight/frac_at_lower",
    "token_weight/frac_at_upper",
    "token_weight/frac_grad_clipped",
]
# Every strategy the package registers, from the registry (a new one is trained here with no edit), and two
# compositions.
BUILTIN = [name for name in STRATEGIES.names() if STRATEGIES.get(name).__module__.startswith("sharpgrpo.strategies.")]
DECLARED = {metric for name in STRATEGIES.names() for metric in STRATEGIES.get(name).metrics}


def strategy_config(strategies: list[str]) -> dict:
    """What the strategies need of the tiny run: a loss strategy defined on some loss types only gets the first;
    archer a KL term (on-policy with beta 0 it would do nothing, and is refused: ``Strategy.inert``)."""
    options = {"beta": 0.04} if "archer" in strategies else {}
    for name in strategies:
        loss_types = getattr(STRATEGIES.get(name), "loss_types", None)
        if STRATEGIES.get(name).kind == "loss" and loss_types:
            return {**options, "loss_type": loss_types[0]}
    return options


@pytest.mark.parametrize(
    "strategies",
    # one run per registered strategy grows with the registry: `-m every_strategy` (CI); compositions by default
    [pytest.param([name], marks=pytest.mark.every_strategy) for name in BUILTIN]
    + [["grpo_sg", "cw_grpo"], ["grpo_sg", "passk_mixed", "thr"]],
    ids=lambda s: "+".join(s),
)
def test_strategy_trains_and_logs(tiny_model_path, tmp_path, strategies):
    """Each strategy trains, logs TRL's metrics, the weight metrics (weight strategies) and only the metrics it
    declares (``Strategy.metrics``; the trainer refuses an undeclared one), at least one of them when it declares
    any."""
    try:
        options = strategy_config(strategies)
        trainer = binary_reward_trainer(tiny_model_path, tmp_path, strategies=strategies, **options)
    except ConfigError as error:  # e.g. a rollout correction needs vLLM's sampling log-probabilities
        pytest.skip(f"{strategies} cannot run on the CPU demo: {error}")
    logs = train_and_check(trainer)
    for key in ["reward", "entropy", "grad_norm"]:  # TRL's own metric names stay
        assert all(key in entry for entry in logs)
    declared = {metric for name in strategies for metric in STRATEGIES.get(name).metrics}
    logged = {key for entry in logs for key in entry}
    assert logged & DECLARED <= declared, f"metrics of another strategy: {sorted((logged & DECLARED) - declared)}"
    for name in strategies:
        if STRATEGIES.get(name).metrics and STRATEGIES.get(name).kind != "weight":
            assert logged & set(STRATEGIES.get(name).metrics), f"{name} logged none of its metrics"
    weight = trainer.weight_strategy
    if weight is not None:
        lower, upper = weight.bounds()
        expected = [m for m in WEIGHT_METRICS if lower < upper or "frac_at" not in m]
        assert all(key in entry for entry in logs for key in expected)
        assert all(lower - 1e-6 <= entry["token_weight/min"] <= entry["token_weight/max"] <= upper + 1e-6
                   for entry in logs)
    if strategies == ["equal"]:
        assert all(entry["token_weight/std"] == 0.0 for entry in logs)
        # w = 1 everywhere is no clip bound: "all tokens at both bounds" would be logged otherwise.
        assert not any("token_weight/frac_at_lower" in e or "token_weight/frac_at_upper" in e for e in logs)


@pytest.mark.every_strategy
@pytest.mark.parametrize("strategy", BUILTIN)
def test_strategy_trains_the_tiny_moe_with_routing_replay(tiny_moe_path, tmp_path, strategy):
    """Every strategy trains the tiny mixture of experts (one step, four completions of six tokens) with routing
    replay on (docs/methods.md §23): finite loss and routing agreement, parameters changed."""
    try:
        trainer = binary_reward_trainer(tiny_moe_path, tmp_path, strategies=[strategy], routing_replay=True,
                                        max_steps=1, per_device_train_batch_size=4, num_generations=4,
                                        max_completion_length=6, **strategy_config([strategy]))
    except ConfigError as error:  # e.g. a rollout correction needs vLLM's sampling log-probabilities
        pytest.skip(f"{strategy} cannot run on the CPU demo: {error}")
    (logs,) = train_and_check(trainer)
    assert math.isfinite(logs["loss"]) and math.isfinite(logs["routing_replay/agreement"])


@pytest.mark.parametrize("p", [0.1, -0.1])
def test_thr_exploit_and_explore_train(tiny_model_path, tmp_path, p):
    trainer = binary_reward_trainer(tiny_model_path, tmp_path, strategies="thr", thr_p=p, dump_token_scores=True)
    logs = train_and_check(trainer)
    assert all(0.0 <= entry["thr/frac_retained"] <= 1.0 for entry in logs)
    dumps = sorted((tmp_path / "token_scores").glob("*.jsonl"))
    assert dumps, "dump_token_scores wrote nothing"
    import json

    rows = [json.loads(line) for line in dumps[0].read_text().splitlines()]
    assert len(rows) == 16 and all(len(r["tokens"]) == len(r["scores"]) == len(r["advantages"]) for r in rows)


class Recorder:
    """Wraps an advantage strategy and keeps every batch it saw and the token advantages it returned."""

    def __init__(self, strategy):
        self.strategy, self.calls = strategy, []

    def __getattr__(self, name):
        return getattr(self.strategy, name)

    def token_advantages(self, batch):
        advantages, metrics = self.strategy.token_advantages(batch)
        self.calls.append((batch, advantages, metrics))
        return advantages, metrics


def record_cw_run(model_path, output_dir, **kwargs):
    trainer = binary_reward_trainer(model_path, output_dir, strategies="cw_grpo", max_steps=4, **kwargs)
    recorder = Recorder(trainer.advantage_strategies[0])
    trainer.advantage_strategies = [recorder]
    trainer.train()
    return recorder.calls


@pytest.mark.parametrize(
    "variant",
    [
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=4),  # GA = 4, one generation per step
        dict(per_device_train_batch_size=4, steps_per_generation=4, num_iterations=1),  # 4 steps per generation
        dict(per_device_train_batch_size=16, num_iterations=2),  # each generation batch used twice
    ],
    ids=["ga4", "steps_per_generation4", "num_iterations2"],
)
def test_cw_weights_do_not_depend_on_batching(tiny_model_path, tmp_path, variant):
    """CW-GRPO statistics are those of whole groups of the generation batch, whatever TRL does to it afterwards:
    the first generation batch (same seed, same 16 completions) gets the same token advantages."""
    reference = record_cw_run(tiny_model_path, tmp_path / "reference")  # per_device 16, GA 1
    other = record_cw_run(tiny_model_path, tmp_path / "other", **variant)
    (ref_batch, ref_advantages, ref_metrics), (batch, advantages, metrics) = reference[0], other[0]
    assert torch.equal(ref_batch.completion_ids, batch.completion_ids)  # the same generation batch
    torch.testing.assert_close(advantages, ref_advantages, atol=1e-6, rtol=1e-5)
    assert metrics == pytest.approx(ref_metrics, rel=1e-5)
    # And the trainer's wiring equals the formula applied to whole groups directly.
    expected, _ = covariance_gaussian_weights(batch.old_logps, batch.advantages, batch.completion_mask, batch.group_ids)
    torch.testing.assert_close(advantages, expected * batch.advantages, atol=1e-6, rtol=1e-5)
    assert torch.equal(batch.group_ids, torch.arange(16) // 8)
    assert (advantages.abs() > 0).any()


def test_rows_keep_their_group_through_shuffling_and_splitting(tiny_model_path, tmp_path):
    """Every buffered micro-batch row carries its group id and index in the group (TRL shuffles and splits)."""
    trainer = binary_reward_trainer(
        tiny_model_path, tmp_path, strategies="grpo_sg", per_device_train_batch_size=4, steps_per_generation=4,
        max_steps=1,
    )
    trainer.train()
    rows = {}
    for micro_batch in trainer._buffered_inputs:
        for group, index, prompt in zip(micro_batch["group_ids"], micro_batch["group_index"], micro_batch["prompt_ids"]):
            rows[(int(group), int(index))] = prompt
    assert sorted(rows) == [(g, i) for g in range(2) for i in range(8)]  # 16 rows: 2 whole groups of 8
    for group in range(2):
        for index in range(8):  # a group shares its prompt
            assert torch.equal(rows[(group, index)], rows[(group, 0)])
    assert not torch.equal(rows[(0, 0)], rows[(1, 0)])


def test_sharpness_probe_logs_and_leaves_training_unchanged(tiny_model_path, tmp_path):
    """The probe runs on the current batch every N steps, logs sharpness/*, and restores parameters and random
    streams exactly: the run's losses are those of the same run without the probe."""
    plain = binary_reward_trainer(tiny_model_path, tmp_path / "plain", strategies="grpo_sg", max_steps=3)
    plain_logs = train_and_check(plain)  # each trainer is built right before it trains, as TRL seeds at build time
    probed = binary_reward_trainer(
        tiny_model_path, tmp_path / "probed", strategies="grpo_sg", max_steps=3, sharpness_probe_steps=2
    )
    probed_logs = train_and_check(probed)
    assert [e["loss"] for e in probed_logs] == pytest.approx([e["loss"] for e in plain_logs], abs=1e-7)
    probe_steps = [e["step"] for e in probed_logs if "sharpness/ascent_loss_increase" in e]
    assert probe_steps == [1, 3]  # global steps 0 and 2, logged at steps 1 and 3
    for entry in probed_logs:
        if "sharpness/rho" in entry:
            assert entry["sharpness/rho"] == 0.05 and entry["sharpness/grad_norm"] > 0
    for name, parameter in plain.model.named_parameters():
        torch.testing.assert_close(parameter, dict(probed.model.named_parameters())[name], atol=1e-6, rtol=0)
