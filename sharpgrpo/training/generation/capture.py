"""Read what advantage strategies need from the generation itself, instead of a second forward pass.

TRL 1.16 computes no old log-probabilities on-policy (``num_iterations`` 1, aligned ``steps_per_generation``, no vLLM
importance-sampling correction), and its fused LM head returns no hidden states. ``cw_grpo`` (and ``ar`` where it
cannot be folded into the loss) needs the sampling log-probabilities, ``thr``/``nthr`` the last hidden states (the
input of the unembedding) at the positions that predict each completion token. Both exist during transformers'
``generate``: every decoding step runs the LM head on exactly those hidden states. :class:`GenerationCapture` hooks
the LM head for the duration of one ``generate`` call and keeps, per step,

* the input of the LM head at the last position (B, H), when hidden states are wanted;
* ``log_softmax(logits / T)`` of the *raw* logits (before any logits processor: top-k, top-p, ``min_new_tokens``
  change the sampling distribution, not the policy's) at the token sampled from them (B,), when log-probabilities
  are wanted;
* the entropy of ``softmax(logits / T)`` (B,), when entropies are wanted (``sharpgrpo.training.generation.entropy_inputs``). Only one step's (B, V) logits are alive at a time: the sampled token is read from the ``input_ids`` of
  the next step's forward (a pre-hook on the model), and the last step's token from the returned completions.

The values differ from a full forward over prompt + completion by the rounding of KV-cache decoding (attention over
cached keys in another order / shape): about 1e-6 in fp32, about 1e-2 in bf16 (tests/test_generation_capture.py).

:func:`logps_from_hidden_states` turns hidden states into the sampling log-probabilities, so that where the hidden
states come from a separate backbone forward (vLLM, continuous batching) that one forward also serves ``cw_grpo``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sharpgrpo.strategies.thr_vocab import slice_width
from sharpgrpo.training.generation.entropy_inputs import entropy_from_step_logits


class GenerationCapture:
    """Context manager: hooks on a causal LM that record, at each decoding step, the LM head's last-position input
    and the temperature-scaled log-probability of the sampled token. Use around one ``generate`` call, then call
    :meth:`result` with the completion ids.

    Args:
        causal_lm: the ``*ForCausalLM`` module whose ``forward`` ``generate`` calls (for PEFT: the base model).
        temperature: sampling temperature T (log-probabilities of softmax(logits / T), as TRL computes them).
        logps: record log-probabilities.
        hidden: record hidden states.
        entropy: record the per-step entropy of the temperature-scaled distribution.
    """

    def __init__(self, causal_lm: torch.nn.Module, temperature: float, logps: bool = True, hidden: bool = False,
                 entropy: bool = False):
        self.causal_lm = causal_lm
        self.head = causal_lm.get_output_embeddings()
        self.temperature = float(temperature)
        self.want_logps, self.want_hidden, self.want_entropy = logps, hidden, entropy
        self.step_logps: list[torch.Tensor] = []
        self.step_hidden: list[torch.Tensor] = []
        self.step_entropy: list[torch.Tensor] = []
        self._pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (scaled logits (B, V), lse (B,))
        self._handles: list[Any] = []

    # hooks ------------------------------------------------------------------------------------------------------
    def _model_pre_hook(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if self._pending is not None and input_ids is not None:
            self._resolve(input_ids[:, -1])

    def _head_pre_hook(self, module, args):
        if self.want_hidden:
            self.step_hidden.append(args[0][:, -1].detach().clone())

    def _head_hook(self, module, args, output):
        if not (self.want_logps or self.want_entropy):
            return
        scaled = output[:, -1].detach().float()
        if self.temperature != 1.0:
            scaled = scaled / self.temperature
        lse = torch.logsumexp(scaled, dim=-1)
        if self.want_entropy:
            self.step_entropy.append(entropy_from_step_logits(scaled, lse))
        if self.want_logps:
            self._pending = (scaled, lse)

    def _resolve(self, tokens: torch.Tensor) -> None:
        scaled, lse = self._pending
        self.step_logps.append(scaled.gather(1, tokens.long().view(-1, 1)).squeeze(1) - lse)
        self._pending = None

    def __enter__(self) -> GenerationCapture:
        self._handles = [
            self.causal_lm.register_forward_pre_hook(self._model_pre_hook, with_kwargs=True),
            self.head.register_forward_pre_hook(self._head_pre_hook),
            self.head.register_forward_hook(self._head_hook),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # result -----------------------------------------------------------------------------------------------------
    def result(self, completion_ids: list[list[int]]) -> dict[str, torch.Tensor]:
        """Per-row tensors aligned with the completions: ``logps`` (B, S) float32, ``hidden`` (B, S, H) and/or
        ``entropy`` (B, S) float32, S the number of decoding steps. Row b's entries beyond ``len(completion_ids[b])`` are padding (any value).

        Raises ValueError when the hooks did not see one LM head call per generated token (another generation
        backend, or a model whose LM head is not called once per step)."""
        num_steps = max((len(c) for c in completion_ids), default=0)
        if self._pending is not None:  # last step: its token is not fed back, read it from the completions
            scaled = self._pending[0]
            last = [c[num_steps - 1] if len(c) == num_steps else 0 for c in completion_ids]
            self._resolve(torch.tensor(last, device=scaled.device))
        out: dict[str, torch.Tensor] = {}
        for name, steps in (("logps", self.step_logps), ("hidden", self.step_hidden),
                            ("entropy", self.step_entropy)):
            if not getattr(self, f"want_{name}"):
                continue
            if len(steps) != num_steps or (steps and steps[0].shape[0] != len(completion_ids)):
                raise ValueError(
                    f"generation capture saw {len(steps)} LM-head calls for {num_steps} generated tokens "
                    f"({len(completion_ids)} rows)"
                )
            out[name] = torch.stack(steps, dim=1)
        return out


def fit_width(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """Right-pad with zeros or truncate dim 1 of ``tensor`` to ``width`` (TRL pads completions to the longest one,
    possibly rounded up by ``pad_to_multiple_of``)."""
    if tensor.shape[1] >= width:
        return tensor[:, :width]
    pad = tensor.new_zeros((tensor.shape[0], width - tensor.shape[1], *tensor.shape[2:]))
    return torch.cat([tensor, pad], dim=1)


@torch.no_grad()
def logps_from_hidden_states(
    hidden: torch.Tensor,
    completion_ids: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    temperature: float,
    rows_per_chunk: int = 8,
    chunk_size: int = 512,
) -> torch.Tensor:
    """Sampling log-probabilities log softmax((h W^T + b) / T)[y] from hidden states, chunked over the vocabulary.

    Shapes: hidden (B, L, H), completion_ids (B, L), weight (V, H), bias (V,) or None -> (B, L) float32.

    No (rows x L x V) logits are built (at B x L = 8 x 4096 and Qwen's V = 151,936 those are 20 GB in fp32): the
    N = B L tokens are scored against one vocabulary slice of width w at a time, with the log-normaliser
    lse = log sum_v exp(z_v) accumulated online (running max m, mass s <- s exp(m - m') + sum_slice exp(z - m'))
    and z_y read from the slice holding y, as THR's score does (``sharpgrpo.strategies.thr_vocab``). w is chosen so
    that an (N, w) temporary holds at most ``chunk_size * V`` elements (``chunk_size`` tokens' worth of logits);
    ``rows_per_chunk`` rows of hidden states are processed at a time on top of that. The logits are computed in the
    weight's dtype and accumulated in fp32, as the unchunked ``F.linear(h, W, b).float()`` did."""
    rows, length = completion_ids.shape
    vocab_size = weight.shape[0]
    out = torch.empty((rows, length), dtype=torch.float32, device=hidden.device)
    for start in range(0, rows, rows_per_chunk):
        block = slice(start, start + rows_per_chunk)
        h = hidden[block].reshape(-1, hidden.shape[-1]).to(weight.dtype)
        ids = completion_ids[block].reshape(-1).long().to(h.device)
        num_tokens = h.shape[0]
        width = slice_width(chunk_size, vocab_size, num_tokens)
        running_max = torch.full((num_tokens,), -math.inf, device=h.device)
        mass = torch.zeros(num_tokens, device=h.device)
        chosen = torch.zeros(num_tokens, device=h.device)
        for first in range(0, vocab_size, width):
            last = min(first + width, vocab_size)
            z = torch.nn.functional.linear(h, weight[first:last], None if bias is None else bias[first:last]).float()
            if temperature != 1.0:
                z /= temperature
            new_max = torch.maximum(running_max, z.amax(dim=1))
            mass = mass * torch.exp(running_max - new_max) + torch.exp(z - new_max[:, None]).sum(dim=1)
            running_max = new_max
            hit = ((ids >= first) & (ids < last)).nonzero().flatten()
            if hit.numel():
                chosen[hit] = z[hit, ids[hit] - first]
        out[block] = (chosen - running_max - torch.log(mass)).view(-1, length)
    return out
