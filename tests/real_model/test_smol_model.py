"""The prepared real model: a plain float32 Llama checkpoint with SmolLM2's ChatML template, EOS and pad ids, that
answers sensibly; and conversational prompts through training end to end (template applied by TRL, completions
ended by the model's end-of-turn token)."""

import json
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.real_model]

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


def test_prepared_checkpoint_is_plain_and_reused(smol_path):
    from sharpgrpo.models.prepared import resolve_model_name

    config = json.loads((Path(smol_path) / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert (Path(smol_path) / "model.safetensors").is_file()
    stamp = (Path(smol_path) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_name("sharpgrpo-smol") == smol_path  # reused, not rebuilt
    assert (Path(smol_path) / "model.safetensors").stat().st_mtime_ns == stamp


def test_chat_template_eos_and_pad(smol_path, smol_tokenizer):
    from transformers import GenerationConfig

    tokenizer = smol_tokenizer
    assert tokenizer.eos_token == IM_END and tokenizer.pad_token == IM_END
    assert tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(IM_END) == 2
    assert tokenizer.pad_token_id == 2
    generation = GenerationConfig.from_pretrained(smol_path)
    assert (generation.eos_token_id, generation.pad_token_id) == (2, 2)
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        f"{IM_START}system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face{IM_END}\n"
        f"{IM_START}user\nHi{IM_END}\n{IM_START}assistant\n"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 3  # special tokens stay whole


def test_generates_sensible_answers_and_stops_at_end_of_turn(smol_path, smol_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smol_path, dtype=torch.float32).eval()
    questions = ["What is the capital of France?", "What is 3 + 4? Answer with the number only."]
    answers = []
    for question in questions:
        batch = smol_tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=40, do_sample=False)
        new = out[0, batch["input_ids"].shape[1] :].tolist()
        assert new[-1] == smol_tokenizer.eos_token_id, "the reply did not end with <|im_end|>"
        answers.append(smol_tokenizer.decode(new, skip_special_tokens=True))
    assert "Paris" in answers[0]
    assert "7" in answers[1]


def test_conversational_prompts_train_end_to_end(smol_path, smol_tokenizer, tmp_path):
    """TRL renders the chat template for message prompts, generation ends at <|im_end|>, padding uses the pad id
    and is masked, and the reward sees the assistant's message."""
    from helpers import cpu_config

    from reward_fns import get_reward_function
    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data import load_train_dataset

    seen = []
    addition = get_reward_function("addition")

    def recording_reward(prompts, completions, answer, **kwargs):
        seen.extend(completions)
        return addition(prompts, completions, answer)

    dataset = load_train_dataset("addition", num_prompts=8, seed=0)
    args = cpu_config(
        tmp_path, per_device_train_batch_size=8, num_generations=4, max_completion_length=12, max_steps=1,
        learning_rate=1e-5, logging_steps=1, save_strategy="no", seed=0, temperature=0.7, beta=0.0, strategies=["grpo_sg"],
    )  # fmt: skip
    trainer = SharpGRPOTrainer(
        model=smol_path, reward_funcs=[recording_reward], args=args, train_dataset=dataset,
        processing_class=smol_tokenizer,
    )  # fmt: skip
    trainer.train()
    (batch,) = trainer._buffered_inputs
    rendered = {
        smol_tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in dataset["prompt"]
    }
    for prompt_ids, prompt_mask in zip(batch["prompt_ids"], batch["prompt_mask"], strict=True):
        text = smol_tokenizer.decode(prompt_ids[prompt_mask.bool()])
        assert text in rendered  # the whole chat template, system turn included, exactly once
        assert text.count(IM_START) == 3
    eos = smol_tokenizer.eos_token_id
    ended = 0
    for ids, mask in zip(batch["completion_ids"].tolist(), batch["completion_mask"].tolist(), strict=True):
        length = sum(mask)
        if eos in ids:
            ended += 1
            assert length == ids.index(eos) + 1  # the loss covers the reply and its <|im_end|>, not the padding
            assert all(i == smol_tokenizer.pad_token_id for i in ids[length:])
        assert smol_tokenizer.convert_tokens_to_ids(IM_START) not in ids[:length]
    assert ended > 0
    assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in seen)
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and torch.isfinite(torch.tensor(logs[0]["loss"]))
