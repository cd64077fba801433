"""The entropy-aware strategies in the trainer (docs/methods.md §11): the "80/20" composition with TRL's
``top_entropy_quantile``, and a few real training steps of the tiny model with each new advantage strategy.

80/20 (Wang et al. 2025, "Beyond the 80/20 Rule", arXiv 2506.01939) is TRL's own ``top_entropy_quantile``: the loss
keeps only the tokens at or above the given quantile of the micro-batch's entropies. Composed with our strategies it
multiplies their per-token terms: a token below the quantile gets no gradient whatever its weight or advantage, a
token above it keeps the strategy's."""

from __future__ import annotations

import pytest
import torch
from helpers import binary_letters_reward, cpu_config, make_trainer, tiny_config

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.training.generation import policy_inputs


def sampling_trainer(model_path, output_dir, **kwargs):
    args = cpu_config(output_dir, per_device_train_batch_size=16, num_generations=8, max_completion_length=8,
                      temperature=1.0, seed=0, **kwargs)
    trainer = make_trainer(model_path, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    trainer.model.train()
    return trainer


@pytest.mark.parametrize("strategies", [["grpo_sg", "entropy_shaping"], ["gtpo"]], ids="+".join)
def test_top_entropy_quantile_composes_with_strategies(tiny_model_path, tmp_path, monkeypatch, strategies):
    """One micro-batch's loss with top_entropy_quantile 0.2: the gradient reaching the log-probability of every
    token below TRL's entropy threshold is exactly 0, tokens above it get the strategy's gradient (equal to the one
    without the mask, up to the loss's normaliser, here the same: `bnpo` divides by all masked tokens either way)."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=strategies, top_entropy_quantile=0.2,
                               loss_type="bnpo")
    torch.manual_seed(3)
    inputs = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    trainer.current_gradient_accumulation_steps = 1
    captured = {}
    original = trainer._get_per_token_logps_and_entropies

    def recording(*args, **kwargs):
        logps, entropies, *rest = original(*args, **kwargs)
        if kwargs.get("compute_entropy"):
            logps.retain_grad()
            captured["logps"], captured["entropies"] = logps, entropies
        return (logps, entropies, *rest)

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", recording)
    grads = {}
    for quantile in (0.2, 1.0):
        trainer.top_entropy_quantile = quantile
        trainer.model.zero_grad()
        trainer._compute_loss(trainer.model, inputs).backward()
        grads[quantile] = captured["logps"].grad.clone()
    mask = inputs["completion_mask"].bool()
    entropies = captured["entropies"]
    threshold = torch.quantile(entropies[mask].float(), 0.8)
    below, above = mask & (entropies < threshold), mask & (entropies >= threshold)
    assert below.sum() > above.sum() > 0
    assert bool((grads[0.2][below] == 0).all())
    assert (grads[1.0][below] != 0).any()  # without the mask those tokens do get gradient
    torch.testing.assert_close(grads[0.2][above], grads[1.0][above], atol=1e-7, rtol=1e-5)
    assert (grads[0.2][above] != 0).any()


def train_and_check(trainer):
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == trainer.args.max_steps
    return logs


METRICS = {
    "entropy_shaping": ["entropy_shaping/bonus_mean", "entropy_shaping/frac_capped", "entropy_shaping/entropy_mean"],
    "gtpo": ["gtpo/frac_positive", "gtpo/abs_mean", "gtpo/entropy_mean"],
    "ktae": ["ktae/score_abs_mean", "ktae/frac_positive", "ktae/frac_groups_scored"],
    "archer": ["archer/frac_high_entropy", "archer/entropy_threshold", "archer/kl_weight_mean"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", [
    {"strategies": ["entropy_shaping"]},
    {"strategies": ["gtpo"]},
    {"strategies": ["gtpo"], "gtpo_level": "sequence", "gtpo_normalization": "separate"},
    {"strategies": ["ktae"]},
    {"strategies": ["grpo_sg", "ktae", "entropy_shaping"], "top_entropy_quantile": 0.2},
    {"strategies": ["archer"], "beta": 0.001},
    {"strategies": ["grpo_sg", "archer"], "beta": 0.001},
], ids=lambda c: "+".join(c["strategies"]) + ("-" + c.get("gtpo_level", "") if "gtpo_level" in c else ""))
def test_entropy_strategies_train_and_log(tiny_model_path, tmp_path, case):
    """Two steps of the tiny model (two groups of 8, binary rewards): parameters change, each strategy's metrics are
    logged every step, TRL's metric names stay, and the metrics say the strategy acted (a positive entropy bonus,
    KTAE scores on the mixed groups)."""
    args = tiny_config(tmp_path, max_steps=2, **case)
    logs = train_and_check(make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward]))
    for name in case["strategies"]:
        for key in METRICS.get(name, []):
            assert all(key in entry for entry in logs), f"{key} missing"
    for key in ["reward", "entropy", "grad_norm"]:
        assert all(key in entry for entry in logs)
    if "entropy_shaping" in case["strategies"]:
        assert all(entry["entropy_shaping/bonus_mean"] > 0 for entry in logs)
        assert all(entry["entropy_shaping/entropy_mean"] > 0 for entry in logs)
    if "archer" in case["strategies"]:  # the top 20% of each response's tokens by entropy get the wide range
        assert all(0.0 < entry["archer/frac_high_entropy"] < 0.5 for entry in logs)
    if "ktae" in case["strategies"]:
        scored = [entry for entry in logs if entry["ktae/frac_groups_scored"] > 0]
        assert all(entry["ktae/score_abs_mean"] > 0 for entry in scored)


def test_hidden_state_fallback_serves_entropy_and_log_probabilities_with_one_forward(tiny_model_path, tmp_path,
                                                                                      monkeypatch):
    """Without capture (the vLLM path), `entropy_shaping` + `cw_grpo` run one backbone forward for both the entropies
    and the old log-probabilities: no log-probability forward."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["cw_grpo", "entropy_shaping"],
                               generation_capture=False)
    calls = []
    hidden_states = policy_inputs.completion_hidden_states
    monkeypatch.setattr(policy_inputs, "completion_hidden_states",
                        lambda *a: calls.append("backbone") or hidden_states(*a))
    monkeypatch.setattr(trainer, "_sampling_logps", lambda output: pytest.fail("second forward"))
    torch.manual_seed(3)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    assert calls == ["backbone"] and output["advantages"].dim() == 2
