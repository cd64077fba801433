"""The per-token entropy every kind of strategy can read (docs/methods.md §11.1).

* Weight strategies get the entropy of the policy being trained, per micro-batch, inside the loss: the detached
  tensor TRL's ``_get_per_token_logps_and_entropies(compute_entropy=True)`` already returns
  (:func:`strategy_loss_weights` passes it to ``TokenWeightStrategy.loss_weights`` when that accepts it).
* Advantage strategies that set ``needs_entropies`` get the entropy of the sampling policy in
  ``GenerationBatch.entropies``, from the pass that already serves their old log-probabilities and hidden states:
  the decoding steps of transformers' ``generate`` (``GenerationCapture(entropy=True)``: one step's (B, V) logits at a
  time), else the last hidden states through the LM head, chunked over rows and over the vocabulary
  (:func:`entropies_from_hidden_states`), so that no (B, T, V) float32 tensor is ever built. Under ZeRO-3 the LM head
  is gathered as for the other head reads (``policy_inputs.full_unembedding``).

H[i, t] = -sum_v p(v) log p(v) with p = softmax(z / T), T the sampling temperature (TRL's ``entropy_from_logits`` of
the temperature-scaled logits). Streaming over vocabulary chunks keeps, per position, the running maximum m, the
scaled sum s = sum_v exp(z_v - m) and the weighted sum u = sum_v exp(z_v - m) z_v; then H = m + log s - u / s.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

DEFAULT_VOCAB_CHUNK = 8192


def streaming_entropy_update(state: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
                             logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one vocabulary chunk of (temperature-scaled, float32) logits (..., V_c) into the running
    ``(m, s, u)`` of the module docstring (each (...,)); ``state`` None starts a new one."""
    chunk_max = logits.amax(dim=-1)
    if state is None:
        shifted = torch.exp(logits - chunk_max.unsqueeze(-1))
        return chunk_max, shifted.sum(-1), (shifted * logits).sum(-1)
    m, s, u = state
    new_m = torch.maximum(m, chunk_max)
    scale = torch.exp(m - new_m)
    shifted = torch.exp(logits - new_m.unsqueeze(-1))
    return new_m, s * scale + shifted.sum(-1), u * scale + (shifted * logits).sum(-1)


def streaming_entropy_result(state: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """H = m + log s - u / s from the running ``(m, s, u)``."""
    m, s, u = state
    return m + torch.log(s) - u / s


@torch.no_grad()
def entropies_from_hidden_states(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                                 temperature: float, rows_per_chunk: int = 8,
                                 vocab_chunk: int = DEFAULT_VOCAB_CHUNK) -> torch.Tensor:
    """Per-token entropy of softmax((h W^T + b) / T). Shapes: hidden (B, L, H), weight (V, H), bias (V,) or None ->
    (B, L) float32. At most ``rows_per_chunk * L * vocab_chunk`` logits are alive at a time."""
    out = torch.empty(hidden.shape[:2], dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], rows_per_chunk):
        rows = hidden[start : start + rows_per_chunk].to(weight.dtype)
        state = None
        for v0 in range(0, weight.shape[0], vocab_chunk):
            chunk_bias = None if bias is None else bias[v0 : v0 + vocab_chunk]
            logits = torch.nn.functional.linear(rows, weight[v0 : v0 + vocab_chunk], chunk_bias).float()
            if temperature != 1.0:
                logits = logits / temperature
            state = streaming_entropy_update(state, logits)
        out[start : start + rows_per_chunk] = streaming_entropy_result(state)
    return out


def entropy_from_step_logits(scaled: torch.Tensor, lse: torch.Tensor, vocab_chunk: int = DEFAULT_VOCAB_CHUNK
                             ) -> torch.Tensor:
    """Entropy of one decoding step: ``scaled`` (B, V) float32 temperature-scaled logits and their logsumexp (B,)
    -> (B,), H = lse - sum_v p(v) z_v, summed over vocabulary chunks (no second (B, V) tensor)."""
    expected = torch.zeros_like(lse)
    for v0 in range(0, scaled.shape[-1], vocab_chunk):
        chunk = scaled[:, v0 : v0 + vocab_chunk]
        expected = expected + (torch.exp(chunk - lse.unsqueeze(-1)) * chunk).sum(-1)
    return lse - expected


def accepts_entropies(strategy) -> bool:
    """Whether ``strategy.loss_weights`` takes the ``entropies`` keyword (a user's override written before it
    existed does not; it is then called without it)."""
    parameters = inspect.signature(strategy.loss_weights).parameters.values()
    return any(p.name == "entropies" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def strategy_loss_weights(strategy, logps: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor,
                          entropies: torch.Tensor | None) -> torch.Tensor:
    """``strategy.loss_weights`` of one micro-batch, with the detached per-token entropies (B, T) where it takes
    them."""
    if entropies is not None and accepts_entropies(strategy):
        return strategy.loss_weights(logps, mask, advantages, entropies=entropies.detach())
    return strategy.loss_weights(logps, mask, advantages)


def refuse_unsupported_rollouts(strategies, environment_factories: Any, tools: Any, rollout_func: Any) -> None:
    """Advantage strategies need the whole groups and the trained model's sampling distribution: refused with
    ``environment_factory`` rollouts and tool calling, and (:func:`refuse_unavailable_sampling_entropy`) where a
    strategy needs the sampling entropy that a custom ``rollout_func`` cannot provide."""
    if strategies and environment_factories is not None:
        raise ValueError("Advantage strategies are not supported with `environment_factory` rollouts.")
    if strategies and tools:
        raise ValueError("Advantage strategies are not supported with tool calling (tool_mask).")
    refuse_unavailable_sampling_entropy(strategies, rollout_func)


def refuse_unavailable_sampling_entropy(strategies, rollout_func: Any) -> None:
    """One line naming both when a strategy needs the sampling policy's entropy and the generation path cannot
    provide it: a custom ``rollout_func`` samples from a distribution the trainer never sees (another model, a
    search, a different decoding), so a forward of the trained model would be the entropy of another policy."""
    needing = [type(s).__name__ for s in strategies if getattr(s, "needs_entropies", False)]
    if needing and rollout_func is not None and not getattr(rollout_func, "samples_trained_model", False):
        name = getattr(rollout_func, "__qualname__", type(rollout_func).__name__)
        raise ValueError(
            f"{', '.join(needing)} needs the sampling policy's per-token entropy, which the generation path "
            f"rollout_func={name} cannot provide (its sampling distribution is not the trained model's); use the "
            "trainer's own generation (transformers or vLLM) or a strategy without `needs_entropies`."
        )
