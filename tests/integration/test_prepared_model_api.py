"""The library API takes what train.py takes: ``SharpGRPOTrainer(model="sharpgrpo-tiny")`` resolves the prepared name
(no Hub), trains, and names the model as given on what it saves; a LoRA adapter trained on a prepared model records
that name as its base, so the adapter loads from another folder on a machine whose cache is empty."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import tiny_config

from sharpgrpo.models.tiny import TINY_MODEL_NAME


def test_trainer_takes_a_prepared_models_name(tmp_path):
    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset

    trainer = SharpGRPOTrainer(model=TINY_MODEL_NAME, reward_funcs=[allowed_letters_reward],
                               args=tiny_config(tmp_path, max_steps=1), train_dataset=demo_dataset(32))  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.base_model_name == TINY_MODEL_NAME
    assert trainer.processing_class is not None  # the tokenizer came from the prepared folder too
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


@pytest.mark.slow
def test_lora_adapter_names_the_prepared_model_and_loads_elsewhere(tmp_path, monkeypatch):
    from peft import LoraConfig

    from sharpgrpo import SharpGRPOTrainer
    from sharpgrpo.data.demo import allowed_letters_reward, demo_dataset
    from sharpgrpo.evaluation.models import load_model_and_tokenizer

    args = tiny_config(tmp_path / "run", max_steps=1, learning_rate=0.05)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = SharpGRPOTrainer(model=TINY_MODEL_NAME, reward_funcs=[allowed_letters_reward], args=args,
                               train_dataset=demo_dataset(32), peft_config=lora)  # fmt: skip
    trainer.train()
    trainer.save_model(str(tmp_path / "run"))
    adapter_config = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == TINY_MODEL_NAME  # not a folder in this machine's cache

    moved = shutil.copytree(tmp_path / "run", tmp_path / "elsewhere" / "adapter")
    monkeypatch.setenv("SHARPGRPO_CACHE", str(tmp_path / "empty-cache"))  # another machine: nothing prepared yet
    reloaded, tokenizer = load_model_and_tokenizer(str(moved), device="cpu", dtype="float32")
    assert (tmp_path / "empty-cache").is_dir()  # the base model was prepared there, from its name
    batch = tokenizer(["letters: a b c\nword: abc"], return_tensors="pt")
    with torch.no_grad():
        expected = trainer.model.eval()(**batch).logits
        torch.testing.assert_close(reloaded(**batch).logits, expected, atol=1e-5, rtol=1e-5)
