"""The per-token entropy every strategy reads (docs/methods.md §11.1): chunked computation against a float64 loop,
the generation capture and the hidden-state path against a full forward, weight strategies given the loss's own
entropies, and the one-line refusal of a generation path that cannot provide the sampling entropy.

Tolerances as in tests/test_generation_capture.py: the captured values come from KV-cache decoding, the reference
from one full forward (fp32 rounding, measured about 1e-6; 1e-4 allowed)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import binary_letters_reward, cpu_config, generate_batch, sampling_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.strategies.base import TokenWeightStrategy
from sharpgrpo.training.generation import entropy_inputs, policy_inputs
from sharpgrpo.training.generation.entropy_inputs import (
    entropies_from_hidden_states,
    entropy_from_step_logits,
    refuse_unavailable_sampling_entropy,
    strategy_loss_weights,
)
from sharpgrpo.training.generation.capture import GenerationCapture


def loop_entropy(logits_row: list[float]) -> float:
    top = max(logits_row)
    z = sum(math.exp(v - top) for v in logits_row)
    return -sum(math.exp(v - top) / z * (v - top - math.log(z)) for v in logits_row)


def test_chunked_entropy_matches_float64_loop_and_never_builds_full_logits(monkeypatch):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 5, 16, generator=g)
    weight, bias = torch.randn(1000, 16, generator=g), torch.randn(1000, generator=g)
    sizes = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a: sizes.append(a[1].shape[0]) or linear(*a))
    got = entropies_from_hidden_states(hidden, weight, bias, 0.7, rows_per_chunk=2, vocab_chunk=96)
    assert max(sizes) == 96 and len(sizes) == 2 * math.ceil(1000 / 96)  # two row chunks, 11 vocabulary chunks each
    logits = (hidden.double() @ weight.double().T + bias.double()) / 0.7
    for i in range(3):
        for t in range(5):
            assert float(got[i, t]) == pytest.approx(loop_entropy(logits[i, t].tolist()), abs=2e-5)
    scaled = logits[0].float()
    torch.testing.assert_close(entropy_from_step_logits(scaled, torch.logsumexp(scaled, -1), vocab_chunk=77),
                               got[0], atol=2e-5, rtol=0)


def test_capture_entropy_matches_full_forward(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    prompts = torch.randint(3, model.config.vocab_size, (4, 6), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    with GenerationCapture(model, 0.7, logps=False, entropy=True) as capture:
        sequences = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                                   top_k=5, temperature=0.7, max_new_tokens=9, eos_token_id=None,
                                   pad_token_id=tokenizer.pad_token_id)
    completions = sequences[:, 6:]
    captured = capture.result(completions.tolist())
    assert set(captured) == {"entropy"}
    with torch.no_grad():
        hidden = model.model(input_ids=sequences).last_hidden_state[:, -10:-1]
        reference = torch.distributions.Categorical(logits=model.lm_head(hidden).double() / 0.7).entropy()
    torch.testing.assert_close(captured["entropy"].double(), reference, atol=1e-4, rtol=0)
    from_hidden = entropies_from_hidden_states(hidden, model.lm_head.weight, None, 0.7, vocab_chunk=50)
    torch.testing.assert_close(from_hidden.double(), reference, atol=1e-5, rtol=0)


def test_advantage_strategies_get_the_sampling_entropy(tiny_model_path, tmp_path, monkeypatch):
    """entropy_shaping on one generation batch: the entropies in its GenerationBatch, captured from `generate` (no
    backbone forward) and from the hidden-state fallback (the vLLM path), equal the entropy of a full forward of the
    sampling policy; the shaped advantages agree."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["entropy_shaping"])
    seen = []
    strategy = trainer.advantage_strategies[0]
    original = strategy.token_advantages
    monkeypatch.setattr(strategy, "token_advantages", lambda batch: seen.append(batch.entropies) or original(batch))
    forward = generate_batch(trainer, capture=False)
    calls = []
    hidden_states = policy_inputs.completion_hidden_states
    monkeypatch.setattr(policy_inputs, "completion_hidden_states",
                        lambda *a: calls.append("forward") or hidden_states(*a))
    captured = generate_batch(trainer, capture=True)
    assert calls == [] and torch.equal(captured["completion_ids"], forward["completion_ids"])
    with torch.no_grad():
        reference = trainer._get_per_token_logps_and_entropies(
            trainer.model, *policy_inputs.prompt_completion(forward), forward["completion_ids"].size(1),
            compute_entropy=True)[1]
    mask = forward["completion_mask"].bool()
    for entropies in seen:
        torch.testing.assert_close(entropies[mask], reference[mask].float(), atol=1e-4, rtol=0)
    torch.testing.assert_close(captured["advantages"], forward["advantages"], atol=1e-4, rtol=1e-4)
    assert (forward["advantages"][mask] != forward["advantages"][:, :1].expand_as(mask)[mask]).any()


class EntropyRecordingWeights(TokenWeightStrategy):
    """w = 1 + H / 10 from the entropies the loss hands over (a strategy of the kind a user would write)."""

    def __init__(self, args):
        super().__init__(args)
        self.seen = []

    def loss_weights(self, logps, mask, advantages, *, entropies=None):
        self.seen.append(entropies)
        return 1.0 + entropies / 10

    def bounds(self):
        return 1.0, math.inf


class OldStyleWeights(TokenWeightStrategy):
    def loss_weights(self, logps, mask, advantages):
        return torch.ones_like(logps)


def test_weight_strategies_get_the_trained_policys_entropy(tiny_model_path, tmp_path):
    """The loss passes TRL's own (detached) entropies of the micro-batch to `loss_weights`; an override without the
    keyword is called as before."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["equal"])
    inputs = generate_batch(trainer, capture=True)
    inputs = {k: v[:8] if torch.is_tensor(v) and v.dim() else v for k, v in inputs.items()}
    trainer.current_gradient_accumulation_steps = 1
    trainer.weight_strategy = EntropyRecordingWeights(trainer.args)
    loss = trainer._compute_loss(trainer.model, inputs)
    (entropies,) = trainer.weight_strategy.seen
    with torch.no_grad():
        reference = trainer._get_per_token_logps_and_entropies(
            trainer.model, *policy_inputs.prompt_completion(inputs), inputs["completion_ids"].size(1),
            compute_entropy=True)[1]
    assert not entropies.requires_grad and entropies.shape == inputs["completion_mask"].shape
    torch.testing.assert_close(entropies, reference, atol=1e-6, rtol=0)
    assert bool((entropies >= 0).all()) and torch.isfinite(loss)
    logps, mask = torch.zeros(2, 3), torch.ones(2, 3)
    assert torch.equal(strategy_loss_weights(OldStyleWeights(trainer.args), logps, mask, mask, entropies=mask),
                       torch.ones(2, 3))
    assert not entropy_inputs.accepts_entropies(OldStyleWeights(trainer.args))


def test_refuses_sampling_entropy_from_a_custom_rollout_in_one_line(tiny_model_path, tmp_path):
    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.strategies import STRATEGIES

    def my_rollout(prompts, trainer):
        raise AssertionError("not called")

    strategies = [STRATEGIES.get("gtpo")(None), STRATEGIES.get("ktae")(None)]
    with pytest.raises(ValueError, match=r"^GTPOStrategy needs the sampling .* rollout_func=.*my_rollout") as error:
        refuse_unavailable_sampling_entropy(strategies, my_rollout)
    assert "\n" not in str(error.value)
    refuse_unavailable_sampling_entropy(strategies, None)  # the trainer's own generation provides it
    refuse_unavailable_sampling_entropy(strategies[1:], my_rollout)  # ktae needs no entropy
    args = cpu_config(tmp_path, per_device_train_batch_size=8, num_generations=8, strategies=["entropy_shaping"])
    with pytest.raises(ValueError, match="EntropyShapingStrategy needs .* rollout_func=.*my_rollout"):
        SharpGRPOTrainer(model=str(tiny_model_path), reward_funcs=[binary_letters_reward], args=args,
                         train_dataset=demo_dataset(8), processing_class=AutoTokenizer.from_pretrained(tiny_model_path),
                         rollout_func=my_rollout)
