"""What advantage strategies read from the policy besides TRL's generation batch: the sampling log-probabilities,
the last hidden states at the positions that predict each completion token, the sampling entropies and the LM head
(unembedding).

Each is taken from the cheapest source available, in this order: TRL's own ``old_per_token_logps``; the values
read from transformers' decoding steps (`sharpgrpo.training.generation_capture`); vLLM's sampling log-probabilities; the
hidden states THR already computed (through the unembedding); a no-grad forward. Functions of the model and the
batch only: no trainer state; ``Policy`` bundles what the trainer knows about its model for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.training.entropy_inputs import entropies_from_hidden_states
from sharpgrpo.training.generation_capture import logps_from_hidden_states


def prompt_completion(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of the prompts followed by their completions (TRL's batch layout)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return input_ids, attention_mask


def causal_lm(accelerator, model):
    """The bare causal LM under accelerate's wrappers and a peft adapter."""
    model = accelerator.unwrap_model(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@torch.no_grad()
def completion_hidden_states(lm, output: dict[str, Any], rows_per_chunk: int) -> torch.Tensor:
    """(B, T, H) last-layer hidden states at the positions that predict each completion token.

    TRL's forward returns neither hidden states nor full logits, so the backbone runs here (no gradient, in chunks
    of ``rows_per_chunk`` rows).
    """
    backbone = getattr(lm, lm.base_model_prefix)
    input_ids, attention_mask = prompt_completion(output)
    length = output["completion_ids"].size(1)
    chunks = []
    for start in range(0, input_ids.size(0), rows_per_chunk):
        hidden = backbone(
            input_ids=input_ids[start : start + rows_per_chunk],
            attention_mask=attention_mask[start : start + rows_per_chunk],
        ).last_hidden_state
        chunks.append(hidden[:, -length - 1 : -1])
    return torch.cat(chunks, dim=0)


@contextlib.contextmanager
def full_unembedding(lm, zero3: bool, needed: bool = True):
    """Yield the LM head's (weight (V, H), bias (V,) or None), whole for the duration of the block.

    Under DeepSpeed ZeRO-3 (``zero3``) a parameter outside its module's forward is an empty placeholder (shape
    (0,)), so the head is gathered (read-only) on every process; all processes must enter the block together.
    """
    if not needed:
        yield None, None
        return
    head = lm.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for p in (weight, bias) if p is not None], modifier_rank=None):
            yield weight, bias
    else:
        yield weight, bias


def strategy_old_logps(
    output: dict[str, Any],
    captured: dict[str, torch.Tensor],
    hidden_states: torch.Tensor | None,
    unembedding: Callable[[], contextlib.AbstractContextManager],
    forward_logps: Callable[[dict[str, Any]], torch.Tensor],
    temperature: float,
    rows_per_chunk: int,
) -> torch.Tensor | None:
    """The sampling policy's log-probabilities (B, T) for strategies that set ``needs_old_logps``, from the
    cheapest source (module docstring); ``forward_logps(output)`` is the fallback forward."""
    old_logps = output.get("old_per_token_logps")
    if old_logps is not None:
        return old_logps
    sampling = output.get("sampling_per_token_logps")  # vLLM's own log-probabilities
    if "logps" in captured:
        return captured["logps"]
    if sampling is not None and not bool(torch.isnan(sampling).any()):
        return sampling
    if hidden_states is not None:  # the backbone forward THR ran serves the log-probabilities too
        with unembedding() as (weight, bias):
            return logps_from_hidden_states(hidden_states, output["completion_ids"], weight, bias, temperature,
                                            rows_per_chunk)
    return forward_logps(output)


@dataclass
class Policy:
    """The policy as the advantage strategies read it.

    Attributes:
        lm: the bare causal LM (``causal_lm``).
        zero3: parameters are partitioned by DeepSpeed ZeRO-3 (the LM head is gathered to be read).
        temperature: the sampling temperature (log-probabilities are of the temperature-scaled distribution).
        rows_per_chunk: rows per no-grad forward.
        forward_logps: ``output -> (B, T)`` the trainer's own log-probability forward, the last fallback.
    """

    lm: Any
    zero3: bool
    temperature: float
    rows_per_chunk: int
    forward_logps: Callable[[dict[str, Any]], torch.Tensor]

    def unembedding(self, needed: bool = True):
        return full_unembedding(self.lm, self.zero3, needed)

    def strategy_inputs(self, output: dict[str, Any], captured: dict[str, torch.Tensor], needs_hidden_states: bool,
                        needs_old_logps: bool, needs_entropies: bool = False
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(old log-probabilities, last hidden states, sampling entropies)`` of the local rows, each None unless
        needed, from the cheapest source (module docstring). Entropies come from the decoding steps when captured,
        else from the hidden states through the LM head, chunked over rows and vocabulary
        (``sharpgrpo.training.entropy_inputs``); a backbone forward run for them also serves the log-probabilities."""
        hidden_states = None
        entropies = captured.get("entropy") if needs_entropies else None
        if needs_hidden_states or (needs_entropies and entropies is None):
            hidden_states = captured["hidden"] if "hidden" in captured else completion_hidden_states(
                self.lm, output, self.rows_per_chunk)
        if needs_entropies and entropies is None:
            with self.unembedding() as (weight, bias):
                entropies = entropies_from_hidden_states(hidden_states, weight, bias, self.temperature,
                                                         self.rows_per_chunk)
        old_logps = output.get("old_per_token_logps")
        if old_logps is None and needs_old_logps:  # TRL skips them on-policy
            old_logps = strategy_old_logps(output, captured, hidden_states, self.unembedding, self.forward_logps,
                                           self.temperature, self.rows_per_chunk)
        return old_logps, hidden_states if needs_hidden_states else None, entropies
