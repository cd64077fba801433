"""Batched generation for evaluation: vLLM where it is installed and a GPU is present, else ``model.generate``.

Both backends take rendered prompts and return, per prompt, ``n`` samples as ``{"text", "num_tokens",
"truncated"}`` dicts. Greedy decoding is ``do_sample=False`` (vLLM: temperature 0). Sampling uses exactly the given
temperature and top-p, with top-k and repetition penalty switched off, so that a model's own
``generation_config.json`` (Qwen2.5-Instruct ships top_k=20, repetition_penalty=1.05) does not change the protocol.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.models.vllm_cpu import guard_kernel_rebinding, vllm_cpu_build

Prompt = str | list[dict[str, Any]]


@dataclass(frozen=True)
class DecodingSettings:
    """How to decode: greedy (``n`` = 1) or ``n`` samples at ``temperature`` / ``top_p``."""

    max_new_tokens: int
    greedy: bool = True
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        if self.greedy and self.n != 1:
            raise ValueError(f"Greedy decoding gives one sample per prompt, got n={self.n}.")
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be >= 1.")
        if not self.greedy and (self.temperature <= 0 or not 0 < self.top_p <= 1):
            raise ValueError(
                f"Sampling needs temperature > 0 and top_p in (0, 1], got {self.temperature}, {self.top_p}."
            )


def vllm_available() -> bool:
    """vLLM can generate here: installed, and a GPU present or vLLM's CPU build installed."""
    return importlib.util.find_spec("vllm") is not None and (torch.cuda.is_available() or vllm_cpu_build())


def choose_backend(backend: str) -> str:
    """``auto`` -> ``vllm`` when vLLM can generate here (``vllm_available``), else ``transformers``."""
    if backend == "auto":
        return "vllm" if vllm_available() else "transformers"
    if backend == "vllm" and not vllm_available():
        raise RuntimeError("backend='vllm' needs vLLM with a CUDA GPU, or vLLM's CPU build (pip install -e "
                           "\".[vllm]\"); use backend='transformers'.")
    if backend not in ("vllm", "transformers"):
        raise ValueError(f"Unknown backend {backend!r}; choose auto, vllm or transformers.")
    return backend


def render_prompt(tokenizer, prompt: Prompt, apply_chat_template: bool = False) -> tuple[str, bool]:
    """``(text, add_special_tokens)`` as TRL's GRPOTrainer tokenises prompts for generation.

    A conversational prompt (a list of messages) goes through the chat template: a final assistant message is
    continued (``continue_final_message``, e.g. a ``<think>`` prefill), otherwise a generation prompt is added; the
    rendered text already holds its special tokens. A string prompt is used verbatim (tokenised with the tokenizer's
    special tokens, e.g. a BOS), or wrapped as one user message when ``apply_chat_template`` is set.
    """
    if isinstance(prompt, str):
        if not apply_chat_template:
            return prompt, True
        prompt = [{"role": "user", "content": prompt}]
    continue_final = bool(prompt) and prompt[-1].get("role") == "assistant"
    text = tokenizer.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=not continue_final, continue_final_message=continue_final
    )
    return text, False


def encode_prompts(tokenizer, prompts: Sequence[Prompt], apply_chat_template: bool = False) -> list[list[int]]:
    ids = []
    for prompt in prompts:
        text, add_special = render_prompt(tokenizer, prompt, apply_chat_template)
        ids.append(tokenizer(text, add_special_tokens=add_special)["input_ids"])
    return ids


def eos_token_ids(model, tokenizer) -> list[int]:
    """The union of the model's generation-config EOS ids and the tokenizer's EOS id."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class TransformersGenerator:
    """``model.generate`` over left-padded batches of at most ``batch_size`` sequences (prompts x samples)."""

    def __init__(self, model, tokenizer, batch_size: int = 16, apply_chat_template: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.apply_chat_template = apply_chat_template
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    def prompts_per_call(self, n: int) -> int:
        return max(1, self.batch_size // n)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Prompt], settings: DecodingSettings, seed: int = 0) -> list[list[dict]]:
        from transformers import GenerationConfig

        config = GenerationConfig(
            max_new_tokens=settings.max_new_tokens,
            do_sample=not settings.greedy,
            num_return_sequences=settings.n,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            **({} if settings.greedy else {"temperature": settings.temperature, "top_p": settings.top_p, "top_k": 0}),
            repetition_penalty=1.0,
        )
        device = next(self.model.parameters()).device
        results: list[list[dict]] = []
        encoded = encode_prompts(self.tokenizer, prompts, self.apply_chat_template)
        step = self.prompts_per_call(settings.n)
        for start in range(0, len(encoded), step):
            batch = encoded[start : start + step]
            width = max(len(ids) for ids in batch)
            input_ids = torch.tensor([[self.pad_id] * (width - len(ids)) + ids for ids in batch], device=device)
            attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
            torch.manual_seed(seed + start)
            output = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
            new_tokens = output[:, width:].tolist()
            for index in range(len(batch)):
                rows = new_tokens[index * settings.n : (index + 1) * settings.n]
                results.append([self._sample(row, settings.max_new_tokens) for row in rows])
        return results

    def _sample(self, tokens: list[int], max_new_tokens: int) -> dict:
        end = next((i + 1 for i, token in enumerate(tokens) if token in self.eos_ids), None)
        kept = tokens if end is None else tokens[:end]
        text = self.tokenizer.decode(kept, skip_special_tokens=True)
        return {"text": text, "num_tokens": len(kept), "truncated": end is None and len(tokens) >= max_new_tokens}


class VLLMGenerator:
    """vLLM offline generation; every prompt gets its own seed, so samples do not depend on batching or resuming."""

    def __init__(
        self,
        model_path: str,
        tokenizer,
        dtype: str = "auto",
        seed: int = 0,
        apply_chat_template: bool = False,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
    ):
        from vllm import LLM

        guard_kernel_rebinding()  # an engine start in a process that loaded numba (sharpgrpo.models.vllm_cpu)
        self.tokenizer = tokenizer
        self.apply_chat_template = apply_chat_template
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
        )

    def generate(self, prompts: Sequence[Prompt], settings: DecodingSettings, seed: int = 0) -> list[list[dict]]:
        from vllm import SamplingParams

        encoded = encode_prompts(self.tokenizer, prompts, self.apply_chat_template)
        params = [
            SamplingParams(
                n=settings.n,
                temperature=0.0 if settings.greedy else settings.temperature,
                top_p=1.0 if settings.greedy else settings.top_p,
                top_k=-1,
                repetition_penalty=1.0,
                max_tokens=settings.max_new_tokens,
                seed=seed + index,
            )
            for index in range(len(encoded))
        ]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in encoded], params, use_tqdm=False)
        return [
            [
                {
                    "text": sample.text,
                    "num_tokens": len(sample.token_ids),
                    "truncated": sample.finish_reason == "length",
                }
                for sample in output.outputs
            ]
            for output in outputs
        ]
