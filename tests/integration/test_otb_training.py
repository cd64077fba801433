"""``otb`` and ``tir_otb`` in the trainer (docs/methods.md §14): the advantages of a real generation batch of the
tiny model equal the optimal token baseline recomputed from an independent full-logit forward (float64 softmax), and
two training steps run with finite variance proxies."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import binary_letters_reward, make_trainer, tiny_config

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.strategies.optimal_baseline import optimal_token_baseline_advantages


@pytest.mark.parametrize("strategy", ["otb", "tir_otb"])
def test_generation_batch_advantages_are_the_optimal_token_baseline(tiny_model_path, tmp_path, strategy):
    args = tiny_config(tmp_path, strategies=[strategy], temperature=0.8)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward], train_dataset=16)
    seen = {}
    otb = trainer.advantage_strategies[0]
    original = otb.token_advantages
    otb.token_advantages = lambda batch: seen.setdefault("batch", batch) and original(batch)
    torch.manual_seed(1)
    output = trainer._generate_and_score_completions([demo_dataset(16)[i // 8] for i in range(16)])
    batch = seen["batch"]

    with torch.no_grad():  # the sampling distribution from a whole forward, in float64
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        positions = (attention.cumsum(-1) - 1).clamp_min(0)  # as generate numbers left-padded prompts
        logits = trainer.model(input_ids=ids, attention_mask=attention, position_ids=positions).logits.double()
        length = output["completion_ids"].size(1)
        logp = torch.log_softmax(logits[:, -length - 1 : -1] / 0.8, dim=-1)
    ids = output["completion_ids"]
    p = logp.exp()
    others = (p**2).masked_fill(torch.nn.functional.one_hot(ids, p.shape[-1]).bool(), 0.0).sum(-1)
    # (1 - p(y))^2 from the sampling log-probabilities the strategy was given (read from the decoding steps; an
    # independent forward differs from them by ~1e-6, all of a near-certain token's 1 - p), the rest from the forward
    w = torch.expm1(batch.old_logps.double()) ** 2 + others
    mask = output["completion_mask"].double()
    expected = optimal_token_baseline_advantages(batch.rewards.double(), mask, batch.group_ids, w,
                                                 align="position" if strategy == "otb" else "token")
    torch.testing.assert_close(output["advantages"].double() * mask, expected, atol=1e-5, rtol=0)
    assert bool((batch.rewards.view(2, 8).std(dim=1) > 0).any())  # a group with a non-zero advantage
    assert (expected.abs() > 1e-3).any()


@pytest.mark.slow
@pytest.mark.parametrize("strategies", [["otb"], ["grpo_sg", "tir_otb", "passk_mixed"]], ids="+".join)
def test_otb_trains_with_finite_variance_proxies(tiny_model_path, tmp_path, strategies):
    args = tiny_config(tmp_path, max_steps=2, strategies=strategies)
    trainer = make_trainer(tiny_model_path, args, reward_funcs=[binary_letters_reward])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters())
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    prefix = "otb" if "otb" in strategies else "tir_otb"
    assert len(logs) == 2
    for entry in logs:
        for key in ("proxy2_total_power", "proxy2_total_power_input", "expected_a_squared", "expected_w"):
            assert math.isfinite(entry[f"{prefix}/{key}"])
        assert entry[f"{prefix}/expected_w"] > 0
