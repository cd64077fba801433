"""LoRA through train.py: `use_peft: true` with rank, alpha and target modules in the YAML trains the adapters only,
saves the adapters, reloads them onto the base model for evaluation, and merges them on request (tiny model, CPU).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run_train_py(config: dict, tmp_path: Path):
    """train.py's own parser and main(), in this process."""
    sys.path.insert(0, str(REPO))
    try:
        from sharpgrpo.cli import train
    finally:
        sys.path.remove(str(REPO))
    from trl import ModelConfig, TrlParser

    from sharpgrpo import SharpGRPOConfig

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    parser = TrlParser((train.TaskArguments, SharpGRPOConfig, ModelConfig))
    return train.main(*parser.parse_args_and_config(args=["--config", str(path)]))


def logits(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(["letters: a b c\nword: abc", "letters: d e f\nword:"], return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**batch).logits.float()


def test_lora_trains_saves_reloads_and_merges(tiny_model_path, tmp_path):
    from transformers import AutoModelForCausalLM

    from sharpgrpo.evaluation.models import load_model_and_tokenizer, merged_model_directory

    output_dir = tmp_path / "lora"
    config = {
        "model_name_or_path": tiny_model_path,
        "dataset_name": "demo",
        "dataset_kwargs": {"num_prompts": 64},
        "reward_funcs": ["allowed_letters"],
        "strategies": "grpo_sg",
        # LoRA (TRL's ModelConfig fields)
        "use_peft": True,
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "lora_target_modules": ["q_proj", "v_proj"],
        # A reference model is the base with the adapter disabled (beta > 0 exercises it).
        "beta": 0.04,
        "output_dir": str(output_dir),
        "max_steps": 2,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 0.05,
        "use_cpu": True,
        "bf16": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "seed": 0,
        "plot": False,
    }
    trainer = run_train_py(config, tmp_path)

    # Only the adapters train: every trainable parameter is a LoRA matrix of a targeted module, and the base weights
    # equal the checkpoint's.
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert {name.split(".lora_")[0].split(".")[-1] for name in trainable} == {"q_proj", "v_proj"}
    base = load_file(str(Path(tiny_model_path) / "model.safetensors"))
    lora_b = []
    for name, parameter in trainer.model.named_parameters():
        if "lora_" in name:
            lora_b += [parameter] if "lora_B" in name else []
            continue
        key = name.replace("base_model.model.", "").replace(".base_layer", "")
        torch.testing.assert_close(parameter.detach(), base[key], rtol=0, atol=0, msg=key)
    assert any(p.abs().max() > 0 for p in lora_b)  # lora_B starts at 0: training moved it

    # The saved model is the adapter: its config names the rank, alpha, targets and the base model; no full weights.
    adapter_config = json.loads((output_dir / "adapter_config.json").read_text())
    assert (adapter_config["r"], adapter_config["lora_alpha"]) == (4, 8)
    assert set(adapter_config["target_modules"]) == {"q_proj", "v_proj"}
    assert adapter_config["base_model_name_or_path"] == tiny_model_path
    assert (output_dir / "adapter_model.safetensors").is_file()
    assert not (output_dir / "model.safetensors").exists()
    assert "grpo_sg" in (output_dir / "README.md").read_text()

    # Evaluation loads base + adapter and reproduces the trained policy; merging folds the adapter into the weights.
    trained = trainer.model.eval()
    reloaded, tokenizer = load_model_and_tokenizer(str(output_dir), device="cpu", dtype="float32")
    expected = logits(trained, tokenizer)
    torch.testing.assert_close(logits(reloaded, tokenizer), expected, atol=1e-5, rtol=1e-5)
    base_model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert (logits(base_model, tokenizer) - expected).abs().max() > 1e-4  # the adapter changes the policy
    merged, _ = load_model_and_tokenizer(str(output_dir), device="cpu", dtype="float32", merge=True)
    assert not hasattr(merged, "peft_config")
    torch.testing.assert_close(logits(merged, tokenizer), expected, atol=1e-5, rtol=1e-5)
    merged_dir = merged_model_directory(str(output_dir), tmp_path / "merged")  # what vLLM evaluation loads
    assert (Path(merged_dir) / "model.safetensors").is_file()
    reloaded_merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    torch.testing.assert_close(logits(reloaded_merged, tokenizer), expected, atol=2e-2, rtol=2e-2)  # saved in bf16
