"""The colocated vLLM engine's own outputs of a generation batch, beyond what TRL keeps of them.

TRL 1.16's ``VLLMGeneration.generate`` (``trl/generation/vllm_generation.py``, colocate branch, lines 729-733) calls
``llm.generate`` and keeps only the token ids and the sampled tokens' log-probabilities of vLLM's ``RequestOutput``s;
per-token outputs vLLM returns besides (each token's kept set under top-k / top-p, ``CompletionOutput.sampling_mask``;
the experts an MoE routed each token to, ``CompletionOutput.routed_experts``; the top-N log-probabilities) are dropped.
:func:`engine_outputs` wraps that one ``llm.generate`` call of the engine (the instance attribute, nothing in TRL or
vLLM is edited) so that readers registered on it can

* adjust the ``SamplingParams`` of the call before it runs (``EngineOutputReader.request``: e.g. ask for more
  log-probabilities than TRL asks for), and
* read the ``RequestOutput``s after it ran, and hand TRL back what it would have received without the adjustment
  (``EngineOutputReader.read``).

The last call's ``RequestOutput`` objects stay in ``EngineOutputs.last`` until the next call (the objects vLLM
returned; a reader's ``read`` may take out what its ``request`` added, as the kept-set reader does with the extra
log-probabilities, so read per-token outputs of your own in a reader, or ask for them in ``request``). Under tensor
parallelism every process of a group generates the whole group's prompts (TRL slices them afterwards), so ``last``
holds the group's requests; a reader matches rows by their token ids, not by position.
"""

from __future__ import annotations

from typing import Any, Protocol


class EngineOutputReader(Protocol):
    """A reader of the engine's per-request outputs (module docstring)."""

    def request(self, sampling_params: Any) -> Any:
        """The ``SamplingParams`` to run the call with (``sampling_params`` itself or an adjusted copy)."""

    def read(self, outputs: list[Any]) -> list[Any]:
        """Read the call's ``RequestOutput``s; return what TRL receives (``outputs``, or outputs without what
        ``request`` added)."""


class EngineOutputs:
    """``llm.generate`` of one colocated engine, wrapped (module docstring). Build it with :func:`engine_outputs`."""

    def __init__(self, llm: Any):
        self.llm = llm
        self.generate = llm.generate  # vLLM's own bound method
        self.readers: dict[str, EngineOutputReader] = {}
        self.last: list[Any] = []
        llm.generate = self._generate

    def add_reader(self, name: str, reader: EngineOutputReader) -> EngineOutputReader:
        """Register ``reader`` under ``name``, replacing an earlier one of that name (a later trainer on the same
        engine)."""
        self.readers[name] = reader
        return reader

    def _generate(self, prompts: Any, sampling_params: Any = None, *args, **kwargs) -> list[Any]:
        for reader in self.readers.values():
            sampling_params = reader.request(sampling_params)
        outputs = self.generate(prompts, sampling_params, *args, **kwargs)
        self.last = list(outputs)
        for reader in self.readers.values():
            outputs = reader.read(outputs)
        return outputs


def engine_outputs(generation: Any) -> EngineOutputs | None:
    """The :class:`EngineOutputs` of a TRL ``VLLMGeneration``'s colocated engine, installed on first use (one per
    engine, shared by every reader); None where there is no colocated engine (server mode, no vLLM)."""
    llm = getattr(generation, "llm", None) if getattr(generation, "mode", None) == "colocate" else None
    if llm is None:
        return None
    seam = getattr(llm, "_sharpgrpo_engine_outputs", None)
    if seam is None:
        seam = EngineOutputs(llm)
        llm._sharpgrpo_engine_outputs = seam
    return seam
