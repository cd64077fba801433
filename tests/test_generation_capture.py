"""No extra forward: log-probabilities and hidden states read from `generate`, `ar` folded in the loss.

Tolerance. The captured values come from KV-cache decoding (one new position per step, attention against cached
keys), the reference from one full forward over prompt + completion: the same function of the same fp32 weights,
evaluated with differently shaped matmuls and reductions, so they agree to fp32 rounding accumulated over the
tiny model's layers: measured max |diff| about 1e-6; the tests allow 2e-5 absolute (log-probabilities) and 1e-4
relative (hidden states). In bf16 the same comparison differs by about 1e-2.
"""

import pytest
import torch
from helpers import generate_batch, sampling_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from sharpgrpo.data.demo import demo_dataset
from sharpgrpo.strategies.probability_shaping import ar_token_advantages
from sharpgrpo.training.generation import policy_inputs
from sharpgrpo.training.generation.capture import GenerationCapture, fit_width, logps_from_hidden_states

LOGP_ATOL = 2e-5


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_path)


def test_capture_matches_full_forward(tiny):
    """Left-padded prompts, temperature 0.7, top-k 5 and min_new_tokens (processors that change the sampling
    distribution but not the policy's log-probabilities), rows that stop early at EOS."""
    model, tokenizer = tiny
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, model.config.vocab_size, (6, 7), generator=generator)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[:2, :3] = 0
    prompts[:2, :3] = tokenizer.pad_token_id
    temperature = 0.7
    options = dict(input_ids=prompts, attention_mask=prompt_mask, do_sample=True, top_k=5, temperature=temperature,
                   max_new_tokens=12, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(1)
    free = model.generate(**options, eos_token_id=None)[:, prompts.shape[1] + 2 :]
    rows_with = {t: sum(t in row for row in free.tolist()) for t in free.unique().tolist()}
    eos = min(rows_with, key=lambda t: abs(rows_with[t] - 3))  # a token that about half of the rows sample
    torch.manual_seed(1)
    with GenerationCapture(model, temperature, logps=True, hidden=True) as capture:
        sequences = model.generate(**options, min_new_tokens=2, eos_token_id=eos)
    completions = sequences[:, prompts.shape[1]:]
    lists = []
    for row in completions.tolist():
        lists.append(row[: row.index(eos) + 1] if eos in row else row)
    captured = capture.result(lists)
    steps = completions.shape[1]
    assert captured["logps"].shape == (6, steps) and captured["hidden"].shape == (6, steps, model.config.hidden_size)

    mask = torch.zeros_like(completions)
    for row, tokens in enumerate(lists):
        mask[row, : len(tokens)] = 1
    with torch.no_grad():
        full_mask = torch.cat([prompt_mask, mask], 1)
        hidden = model.model(input_ids=sequences, attention_mask=full_mask).last_hidden_state[:, -steps - 1 : -1]
        logits = model.lm_head(hidden).float() / temperature
        reference = logits.log_softmax(-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    valid = mask.bool()
    assert valid.sum() > 15 and (~valid).any()  # some rows stopped early
    torch.testing.assert_close(captured["logps"][valid], reference[valid], atol=LOGP_ATOL, rtol=0)
    torch.testing.assert_close(captured["hidden"][valid], hidden[valid], atol=1e-4, rtol=1e-4)
    # the same hidden states also give the log-probabilities (the one-forward fallback for vLLM)
    from_hidden = logps_from_hidden_states(hidden, completions, model.lm_head.weight, None, temperature, 4)
    torch.testing.assert_close(from_hidden, reference, atol=1e-6, rtol=0)
    assert fit_width(captured["logps"], steps + 3).shape == (6, steps + 3)
    assert fit_width(captured["hidden"], steps - 2).shape == (6, steps - 2, model.config.hidden_size)


def test_capture_refuses_a_mismatched_step_count(tiny):
    model, _ = tiny
    with GenerationCapture(model, 1.0) as capture:
        model.generate(input_ids=torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=3, eos_token_id=None)
    with pytest.raises(ValueError, match="LM-head calls"):
        capture.result([[1, 2, 3, 4, 5]])


def test_trainer_strategies_without_extra_forward_match_forward_path(tiny_model_path, tmp_path, monkeypatch):
    """cw_grpo, then thr, on one generation batch: token advantages with captured log-probabilities / hidden states
    equal those of the previous forward-based path (same completions), within the KV-cache rounding; the forward
    passes are not called when capturing."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["cw_grpo", "thr"])
    reference = generate_batch(trainer, capture=False)
    calls = []
    original = trainer._sampling_logps
    monkeypatch.setattr(trainer, "_sampling_logps", lambda output: calls.append("_sampling_logps") or original(output))
    hidden_states = policy_inputs.completion_hidden_states
    monkeypatch.setattr(policy_inputs, "completion_hidden_states",
                        lambda *a: calls.append("completion_hidden_states") or hidden_states(*a))
    captured = generate_batch(trainer, capture=True)
    assert calls == []
    assert torch.equal(captured["completion_ids"], reference["completion_ids"])
    assert reference["advantages"].dim() == 2 and (reference["advantages"] != 0).any()
    torch.testing.assert_close(captured["advantages"], reference["advantages"], atol=1e-4, rtol=1e-4)


def test_thr_fallback_forward_serves_log_probabilities(tiny_model_path, tmp_path, monkeypatch):
    """Without capture (the vLLM case), cw_grpo + thr run one backbone forward and no log-probability forward."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["cw_grpo", "thr"])
    with_forward = generate_batch(trainer, capture=False)
    monkeypatch.setattr(trainer, "_sampling_logps", lambda output: pytest.fail("second forward"))
    fallback = generate_batch(trainer, capture=False)
    torch.testing.assert_close(fallback["advantages"], with_forward["advantages"], atol=0, rtol=0)


def test_ar_folded_in_loss_equals_generation_time_ar(tiny_model_path, tmp_path):
    """On-policy `ar` as a loss factor from the loss's own log-probabilities equals AR applied at generation with
    old log-probabilities from a forward (loss and gradients)."""
    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies=["passk_mixed", "ar"], passk_k=2)
    assert trainer._folded_strategy() is trainer.advantage_strategies[-1]
    inputs = generate_batch(trainer, capture=True)
    advantages = inputs["advantages"]
    assert torch.equal(advantages, advantages[:, :1].expand_as(advantages))  # ar is left to the loss
    assert (advantages != 0).any()
    inputs = {k: v[:8] if torch.is_tensor(v) and v.dim() else v for k, v in inputs.items()}

    trainer.current_gradient_accumulation_steps = 1

    def loss_and_grads(batch, fold):
        trainer.model.zero_grad()
        trainer._folded_strategy = (lambda: trainer.advantage_strategies[-1]) if fold else (lambda: None)
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]

    folded_loss, folded_grads = loss_and_grads(inputs, fold=True)
    with torch.no_grad():
        old = trainer._sampling_logps(inputs)
    mask = inputs["completion_mask"].float()
    expected_inputs = dict(inputs, advantages=ar_token_advantages(old.exp(), inputs["advantages"] * mask,
                                                                  trainer.args.ar_alpha))
    loss, grads = loss_and_grads(expected_inputs, fold=False)
    assert loss.abs() > 0
    torch.testing.assert_close(folded_loss, loss, atol=1e-6, rtol=1e-5)
    for got, want in zip(folded_grads, grads):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_vllm_sampling_log_probabilities_are_used_without_forward(tiny_model_path, tmp_path, monkeypatch):
    """Where the backend returned its own sampling log-probabilities (vLLM: `sampling_per_token_logps`) and TRL
    computed no old ones, cw_grpo uses them: no forward, and the same advantages as from the forward's values."""
    from trl import GRPOTrainer

    trainer = sampling_trainer(tiny_model_path, tmp_path, strategies="cw_grpo", generation_capture=False)
    torch.manual_seed(3)
    output = GRPOTrainer._generate_and_score_completions(trainer, [demo_dataset(16)[i // 8] for i in range(16)])
    output["group_ids"] = torch.arange(16) // 8
    reference = trainer._apply_advantage_strategies(output, 8, "train")  # old log-probabilities from a forward
    with torch.no_grad():
        sampling = trainer._sampling_logps(output)
    monkeypatch.setattr(trainer, "_sampling_logps", lambda output: pytest.fail("second forward"))
    advantages = trainer._apply_advantage_strategies(dict(output, sampling_per_token_logps=sampling), 8, "train")
    assert (reference != output["advantages"][:, None]).any()  # cw_grpo changed them
    torch.testing.assert_close(advantages, reference, atol=0, rtol=0)
