"""What advantage strategies read from the policy besides TRL's generation batch: the sampling log-probabilities,
the last hidden states at the positions that predict each completion token, the sampling entropies and the LM head
(unembedding).

Each is taken from the cheapest source available, in this order: TRL's own ``old_per_token_logps``; the values
read from transformers' decoding steps (`sharpgrpo.training.generation.capture`); vLLM's sampling log-probabilities;
the hidden states THR already computed (through the unembedding); a no-grad forward. Functions of the model and the
batch only: no trainer state; ``Policy`` bundles what the trainer knows about its model for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sharpgrpo.training.generation.entropy_inputs import entropies_from_hidden_states
from sharpgrpo.training.generation.capture import logps_from_hidden_states


def prompt_completion(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of the prompts followed by their completions (TRL's batch layout)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return input_ids, attention_mask


def zero3_enabled(accelerator) -> bool:
    """Parameters are partitioned by DeepSpeed ZeRO-3 (a parameter read outside its module's forward must be
    gathered: :func:`full_unembedding`)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return accelerator.distributed_type == "DEEPSPEED" and plugin is not None and plugin.zero_stage == 3


def causal_lm(accelerator, model):
    """The bare causal LM under accelerate's wrappers and a peft adapter."""
    model = accelerator.unwrap_model(model)
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@torch.no_grad()
def completion_hidden_states(lm, output: dict[str, Any], rows_per_chunk: int) -> torch.Tensor:
    """(B, T, H) last-layer hidden states at the positions that predict each completion token.

    TRL's forward returns neither hidden states nor full logits, so the backbone runs here (no gradient, in chunks
    of ``rows_per_chunk`` rows). Under FSDP2 (DTensor parameters) the model runs as a whole instead (``lm(...)``
    with ``logits_to_keep=1``: one (rows, 1, V) logit block) and the backbone's output is read by a forward hook:
    the parameters that the root unit owns (embeddings, final norm) are gathered by the root's forward only, and a
    backbone called alone meets them as shards (``aten.mm got mixed torch.Tensor and DTensor``). Elsewhere the
    backbone is called alone: under DeepSpeed ZeRO-3 every module gathers its own parameters, and calling the LM
    head module there (which TRL's fused head never calls) breaks ZeRO-3's prefetch order ("Cannot partition a
    param in flight" in TRL's next head gather).
    """
    backbone = getattr(lm, lm.base_model_prefix)
    input_ids, attention_mask = prompt_completion(output)
    length = output["completion_ids"].size(1)
    chunks: list[torch.Tensor] = []

    def keep(module, args, out):
        if not torch.is_tensor(out):
            out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        chunks.append(out[:, -length - 1 : -1].detach())

    first = next(lm.parameters(), None)
    whole_model = first is not None and hasattr(first, "full_tensor")  # FSDP2: the root unit must gather
    handle = backbone.register_forward_hook(keep)
    try:
        for start in range(0, input_ids.size(0), rows_per_chunk):
            rows = slice(start, start + rows_per_chunk)
            if whole_model:
                lm(input_ids=input_ids[rows], attention_mask=attention_mask[rows], logits_to_keep=1, use_cache=False)
            else:
                backbone(input_ids=input_ids[rows], attention_mask=attention_mask[rows])
    finally:
        handle.remove()
    return torch.cat(chunks, dim=0)


def gathered_parameter(parameter: torch.Tensor | None, expected_numel: int | None = None) -> torch.Tensor | None:
    """The whole value of a parameter that FSDP2 may have sharded: a DTensor is gathered with ``full_tensor()`` (a
    collective: every process must call it); anything else is returned as is. With ``expected_numel`` the result's
    element count is checked: a DTensor's ``.shape`` names the full size while it holds a shard, so only the count
    of elements held says the value is whole."""
    if parameter is None:
        return None
    value = parameter.detach()
    if hasattr(value, "full_tensor"):  # torch.distributed.tensor.DTensor (FSDP2's fully_shard, tensor parallel)
        value = value.full_tensor()
    if expected_numel is not None and value.numel() != expected_numel:
        raise RuntimeError(
            f"the LM head holds {value.numel()} of its {expected_numel} elements on this process (a sharded or "
            "partitioned parameter that was not gathered)"
        )
    return value


def _head_numels(head) -> tuple[int | None, int | None]:
    """Element counts of the whole LM head's weight and bias, from the module's own sizes (``nn.Linear``'s
    ``out_features`` x ``in_features``), which sharding does not change; (None, None) for another head."""
    out_features, in_features = getattr(head, "out_features", None), getattr(head, "in_features", None)
    if out_features is None or in_features is None:
        return None, None
    return out_features * in_features, out_features


@contextlib.contextmanager
def full_unembedding(lm, zero3: bool, needed: bool = True):
    """Yield the LM head's (weight (V, H), bias (V,) or None), whole for the duration of the block.

    Under DeepSpeed ZeRO-3 (``zero3``) a parameter outside its module's forward is an empty placeholder (shape
    (0,)), so the head is gathered (read-only) on every process; under FSDP2 (the head a ``fully_shard`` unit of its
    own) it is a DTensor holding a row shard while its ``.shape`` says (V, H), and is gathered with
    ``full_tensor()``. Either way the yielded weight is checked to hold V x H elements. All processes must enter
    the block together.
    """
    if not needed:
        yield None, None
        return
    head = lm.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    weight_numel, bias_numel = _head_numels(head)
    if zero3:
        import deepspeed

        with deepspeed.zero.GatheredParameters([p for p in (weight, bias) if p is not None], modifier_rank=None):
            yield gathered_parameter(weight, weight_numel), gathered_parameter(bias, bias_numel)
    else:
        yield gathered_parameter(weight, weight_numel), gathered_parameter(bias, bias_numel)


def strategy_old_logps(
    output: dict[str, Any],
    captured: dict[str, torch.Tensor],
    hidden_states: torch.Tensor | None,
    unembedding: Callable[[], contextlib.AbstractContextManager],
    forward_logps: Callable[[dict[str, Any]], torch.Tensor],
    temperature: float,
    rows_per_chunk: int,
    backend_logps_usable: bool = True,
) -> torch.Tensor | None:
    """The sampling policy's log-probabilities (B, T) for strategies that set ``needs_old_logps``, from the
    cheapest source (module docstring); ``forward_logps(output)`` is the fallback forward. vLLM's own
    ``sampling_per_token_logps`` are used only where ``backend_logps_usable`` (see :func:`vllm_logps_problem`)."""
    old_logps = output.get("old_per_token_logps")
    if old_logps is not None:
        return old_logps
    sampling = output.get("sampling_per_token_logps")  # vLLM's own log-probabilities
    if "logps" in captured:
        return captured["logps"]
    if backend_logps_usable and sampling is not None and not bool(torch.isnan(sampling).any()):
        return sampling
    if hidden_states is not None:  # the backbone forward THR ran serves the log-probabilities too
        with unembedding() as (weight, bias):
            return logps_from_hidden_states(hidden_states, output["completion_ids"], weight, bias, temperature,
                                            rows_per_chunk)
    return forward_logps(output)


def sampling_truncation(top_p: float | None, top_k: int | None, min_p: float | None,
                        generation_kwargs: dict | None = None) -> str | None:
    """The truncation of the sampling distribution ("top_p=0.9, top_k=20"), or None when sampling is from the whole
    temperature-scaled distribution. ``generation_kwargs`` (passed to vLLM's ``SamplingParams``) override the fields;
    ``top_k`` 0 or -1 and ``min_p`` 0 mean off, as in TRL and vLLM."""
    kwargs = dict(generation_kwargs or {})
    top_p, top_k, min_p = kwargs.get("top_p", top_p), kwargs.get("top_k", top_k), kwargs.get("min_p", min_p)
    parts = []
    if top_p is not None and float(top_p) < 1.0:
        parts.append(f"top_p={top_p}")
    if top_k is not None and int(top_k) > 0:
        parts.append(f"top_k={top_k}")
    if min_p is not None and float(min_p) > 0.0:
        parts.append(f"min_p={min_p}")
    return ", ".join(parts) or None


def vllm_logps_problem(vllm_mode: str | None, truncation: str | None) -> str | None:
    """Why vLLM's per-token log-probabilities (TRL's ``sampling_per_token_logps``) are not the policy's own, or None.

    TRL 1.16 starts its colocated engine with ``logprobs_mode="processed_logprobs"``
    (trl/generation/vllm_generation.py, line 361 of the installed trl 1.16.0):
    log-probabilities after temperature *and* after top-p/top-k/min-p truncation and renormalisation, so with a
    truncation they are those of another distribution (trl#6789). A vLLM server reports in whatever
    ``--logprobs-mode`` it was started with (vLLM's default, ``raw_logprobs``, is before the temperature), which
    TRL checks only with the importance-sampling correction on."""
    if truncation:
        return f"vLLM's log-probabilities are of the {truncation}-truncated, renormalised distribution"
    if vllm_mode == "server":
        return "a vLLM server's log-probabilities depend on its --logprobs-mode, which the trainer cannot see"
    return None


def old_logps_source(use_vllm: bool, vllm_mode: str | None, trl_computes_old_logps: bool,
                     truncation: str | None, generation_capture: bool) -> str:
    """One sentence naming where the strategies' old (sampling) log-probabilities come from (docs/methods.md §13)."""
    if trl_computes_old_logps:
        return ("TRL's old_per_token_logps: the policy's own log-probabilities, recomputed by a forward at generation "
                "(off-policy steps or vLLM importance-sampling correction)")
    if use_vllm:
        problem = vllm_logps_problem(vllm_mode, truncation)
        if problem is None:
            return ("vLLM's own per-token log-probabilities (colocate, processed_logprobs: temperature-scaled, "
                    "untruncated)")
        replayed = ("; with colocated vLLM and top_k on, that forward scores vLLM's kept sets (docs/methods.md §17.3)"
                    if truncation and vllm_mode == "colocate" else "")
        return (f"the policy's own log-probabilities, recomputed by a no-grad forward ({problem}, so they are not "
                f"used{replayed})")
    if generation_capture:
        return "read from transformers' decoding steps (log softmax(raw logits / T) at the sampled token)"
    return "the policy's own log-probabilities, recomputed by a no-grad forward"


@dataclass
class Policy:
    """The policy as the advantage strategies read it.

    Attributes:
        lm: the bare causal LM (``causal_lm``).
        zero3: parameters are partitioned by DeepSpeed ZeRO-3 (the LM head is gathered to be read).
        temperature: the sampling temperature (log-probabilities are of the temperature-scaled distribution).
        rows_per_chunk: rows per no-grad forward.
        forward_logps: ``output -> (B, T)`` the trainer's own log-probability forward, the last fallback.
        backend_logps_usable: vLLM's own sampling log-probabilities are the policy's (:func:`vllm_logps_problem`).
    """

    lm: Any
    zero3: bool
    temperature: float
    rows_per_chunk: int
    forward_logps: Callable[[dict[str, Any]], torch.Tensor]
    backend_logps_usable: bool = True

    def unembedding(self, needed: bool = True):
        return full_unembedding(self.lm, self.zero3, needed)

    def strategy_inputs(self, output: dict[str, Any], captured: dict[str, torch.Tensor], needs_hidden_states: bool,
                        needs_old_logps: bool, needs_entropies: bool = False
                        ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """``(old log-probabilities, last hidden states, sampling entropies)`` of the local rows, each None unless
        needed, from the cheapest source (module docstring). Entropies come from the decoding steps when captured,
        else from the hidden states through the LM head, chunked over rows and vocabulary
        (``sharpgrpo.training.generation.entropy_inputs``); a backbone forward run for them also serves the
        log-probabilities."""
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
                                           self.temperature, self.rows_per_chunk, self.backend_logps_usable)
        return old_logps, hidden_states if needs_hidden_states else None, entropies
