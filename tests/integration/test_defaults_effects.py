"""Effects of the issue-10 defaults on the tiny model (real hidden states, real training steps).

* THR with its default threshold keeps a fraction of tokens strictly between 0 and 1 on completions of >= 64 tokens
  (the old threshold, |y| times larger than the scores, kept 0%);
* the trainer fills ``GenerationBatch.correct`` from the reward functions' answer checks (THR's positive set);
* the sharpness probe leaves the `random` strategy's generator alone: a run with the probe is bit-identical.
"""

from __future__ import annotations

import torch
from helpers import make_trainer, tiny_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from sharpgrpo.data.demo import allowed_letters_reward, demo_prompt
from sharpgrpo.diagnostics.thr_retention import thr_retention
from sharpgrpo.strategies.probability_shaping import probability_shaping_weights


def test_thr_default_threshold_retains_a_fraction_on_long_completions(tiny_model_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    probs = []
    for length, letters in ((64, "abc"), (128, "deh")):
        fraction, tau, sampled = thr_retention(model, tokenizer, demo_prompt(letters), length, group_size=8, seed=1)
        print(f"L = {length}: thr/frac_retained = {fraction:.3f}, tau = {tau:.4g}")
        assert 0.0 < fraction < 1.0, (length, fraction, tau)
        assert tau > 0  # a negative tau would keep every token trivially
        probs.append(sampled.flatten().double())
    # GRPO-SG Theorem 3.5's mechanism on the model's own sampled-token probabilities.
    p = torch.cat(probs)
    w = probability_shaping_weights(p, 2.0, 0.25, 1 / 9, 1.0, 1.4)
    plain = float((1 - p).std() / (1 - p).mean())
    shaped = float((w * (1 - p)).std() / (w * (1 - p)).mean())
    print(f"tiny model's sampled tokens: CV(1 - p) = {plain:.4f}, CV(w (1 - p)) = {shaped:.4f}")
    assert shaped < plain


def letters_reward(prompts, completions, allowed, **kwargs):
    """A reward with a format-like bonus on top of the answer: A > 0 does not mean correct."""
    return [r + (0.5 if c.startswith(" ") else 0.0)
            for r, c in zip(allowed_letters_reward(prompts, completions, allowed), completions, strict=True)]


def letters_check(prompts, completions, allowed, **kwargs):
    return [r >= 0.75 for r in allowed_letters_reward(prompts, completions, allowed)]


letters_reward.answer_check = letters_check


def one_step_trainer(model_path, output_dir, reward, **kwargs):
    """The tiny model's training config (``tiny_config``) for one step, with ``reward`` alone."""
    return make_trainer(model_path, tiny_config(output_dir, **{"max_steps": 1, **kwargs}), reward_funcs=[reward])


def test_trainer_positive_set_comes_from_the_answer_check(tiny_model_path, tmp_path):
    trainer = one_step_trainer(tiny_model_path, tmp_path / "thr", letters_reward, strategies="thr")
    strategy = trainer.advantage_strategies[0]
    seen = []
    original = strategy.token_advantages

    def spy(batch):
        seen.append(batch)
        return original(batch)

    strategy.token_advantages = spy
    trainer.train()
    assert seen and all(batch.correct is not None for batch in seen)
    batch = seen[0]
    texts = trainer.processing_class.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(batch.completion_ids, batch.completion_mask)]
    )
    # The prompts' allowed letters are not in the batch; recover them through the reward: the check is reward-only.
    rewards = batch.rewards.tolist()
    expected = [r - (0.5 if t.startswith(" ") else 0.0) >= 0.75 for r, t in zip(rewards, texts, strict=True)]
    assert batch.correct.tolist() == expected


def test_random_strategy_run_is_bit_identical_with_the_probe(tiny_model_path, tmp_path):
    runs = {}
    for probe in (0, 1):
        trainer = one_step_trainer(tiny_model_path, tmp_path / f"probe{probe}", allowed_letters_reward,
                                   strategies="random", max_steps=3, sharpness_probe_steps=probe)
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "loss" in entry]
        runs[probe] = (logs, {n: p.detach().clone() for n, p in trainer.model.named_parameters()},
                       trainer.weight_strategy.generator.get_state())
    (plain_logs, plain_params, plain_state), (probed_logs, probed_params, probed_state) = runs[0], runs[1]
    assert any("sharpness/ascent_loss_increase" in entry for entry in probed_logs)
    assert [e["loss"] for e in probed_logs] == [e["loss"] for e in plain_logs]
    for key in ("token_weight/mean", "token_weight/min", "token_weight/max"):
        assert [e[key] for e in probed_logs] == [e[key] for e in plain_logs]
    assert all(torch.equal(plain_params[n], probed_params[n]) for n in plain_params)
    assert torch.equal(plain_state, probed_state)
