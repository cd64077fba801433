"""The embedded default model: a tiny Qwen2 (or Llama) causal LM with a tokenizer trained in memory.

Nothing is downloaded. ``build_tiny_model(directory)`` trains a small character-level tokenizer with
``tokenizers``, creates a randomly initialised model from a config, gives it a short supervised warm start on
synthetic text in the demo task's format (see ``sharpgrpo.data.demo``), and saves both with ``save_pretrained`` so that
the ordinary ``AutoModelForCausalLM.from_pretrained(path)`` loads them, exactly as a hub model would be loaded.

The name ``TINY_MODEL_NAME`` ("sharpgrpo-tiny") is accepted wherever a model name or path is expected by
``train.py`` and ``sharpgrpo eval``: it resolves to a cached build under ``$SHARPGRPO_CACHE`` (default
``~/.cache/sharpgrpo``), registered in :mod:`sharpgrpo.models.prepared`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sharpgrpo.models.prepared import register_prepared_model

TINY_MODEL_NAME = "sharpgrpo-tiny"
TINY_MODEL_VERSION = 2  # bump when the build changes, so cached builds are not reused
# Tags used by the papers' prompts; kept whole so a tiny model can emit them in one step.
TAG_TOKENS = ["<think>", "</think>", "<answer>", "</answer>", "\\boxed{"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer():
    """A byte-level tokenizer with no merges: every byte is one token, plus chat specials and the papers' tags.

    Byte-level like Qwen2's, so transformers' model-specific tokenizer classes rebuild it identically from the
    saved vocabulary; with no merges every text encodes to its bytes, which keeps the vocabulary (about 270)
    small enough for a randomly initialised model to produce task text after a short warm start.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.add_tokens(TAG_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model(
    directory: str | os.PathLike,
    architecture: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    warm_start_steps: int = 300,
    seed: int = 0,
    overwrite: bool = False,
    extra_config: dict | None = None,
) -> Path:
    """Build (or reuse) the tiny model and tokenizer in ``directory`` and return the directory.

    Args:
        directory: where ``config.json``, the weights and the tokenizer are saved.
        architecture: ``qwen2`` (default), ``llama`` or ``qwen3_moe`` (a mixture of experts: ``sharpgrpo-tiny-moe``).
        hidden_size, num_layers: model size (defaults give about 0.1M parameters).
        warm_start_steps: supervised steps on synthetic demo-format text (0 keeps the random initialisation).
        seed: seeds initialisation and warm start.
        overwrite: rebuild even if a model is already there.
        extra_config: further config fields (head size, number of experts, ...).
    """
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3MoeConfig

    directory = Path(directory)
    if (directory / "config.json").exists() and not overwrite:
        return directory
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    config_classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3_moe": Qwen3MoeConfig}
    if architecture not in config_classes:
        raise ValueError(f"Unknown tiny architecture {architecture!r}; choose one of {sorted(config_classes)}.")
    config = config_classes[architecture](
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 3,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,  # byte-level K&K prompts are over 1000 tokens
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **(extra_config or {}),
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if warm_start_steps > 0:
        from sharpgrpo.data.demo import warm_start_texts

        _supervised_warm_start(model, tokenizer, warm_start_texts(seed=seed), warm_start_steps)
    return save_built_model(model, tokenizer, directory)


def save_built_model(model, tokenizer, directory: Path) -> Path:
    """Save a locally built model and tokenizer into ``directory`` atomically (written beside it, then renamed), so
    that concurrent builders and interrupted builds never leave a half-written cached model."""
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    directory.parent.mkdir(parents=True, exist_ok=True)
    if (directory / "config.json").exists():  # another process finished first, or overwrite
        import shutil

        shutil.rmtree(directory)
    os.replace(tmp, directory)
    return directory


def _supervised_warm_start(model, tokenizer, texts, steps: int, batch_size: int = 32, lr: float = 3e-3) -> None:
    """Plain next-token cross-entropy on ``texts`` (the loss covers the whole text, EOS included)."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        index = torch.randint(len(texts), (batch_size,), generator=generator).tolist()
        batch = tokenizer(
            [texts[i] + tokenizer.eos_token for i in index], return_tensors="pt", padding=True, padding_side="right"
        )
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def build_on_first_use(directory: Path, name: str, description: str, **build_kwargs) -> Path:
    """``build_tiny_model(directory, **build_kwargs)`` for the prepared model ``name``, saying on first use what the
    pause is (``description``: what is built)."""
    if not (directory / "config.json").exists():
        import sys

        print(f"[sharpgrpo] building {name} (first use: {description} trained in memory, offline, seconds) into "
              f"{directory}", file=sys.stderr, flush=True)  # fmt: skip
    return build_tiny_model(directory, **build_kwargs)


@register_prepared_model(TINY_MODEL_NAME)
def prepare_tiny_model(cache_dir: Path) -> Path:
    return build_on_first_use(cache_dir / f"tiny-qwen2-v{TINY_MODEL_VERSION}", TINY_MODEL_NAME, "a 2-layer Qwen2")
