"""The weight transfer between the trainer and the rollout process: the policy's state dict in shared memory.

``SharedMemoryWeights`` holds one shared-memory copy of every tensor of the policy's state dict (made once, before the
rollout process starts, and inherited by it), a version counter and a lock. The trainer ``publish``es: it copies its
current weights in, under the lock, and sets the version; the rollout process ``load_into`` its own model before a job
when the version moved. This is the weight-transfer role that NCCL plays between TRL's trainer and a vLLM server on
GPUs; on CPU, where the processes share a machine, shared memory moves the weights without a copy through a pipe.

A LoRA (peft) policy is published as the plain model it stands for (:func:`plain_state_dict`): each adapted layer's
base weight plus its adapters' delta, under the plain model's names, so the rollout process generates with exactly
the weights TRL merges into vLLM (``VLLMGeneration._iter_named_params``: ``merge_adapter``, ``.base_layer`` dropped,
``lora_`` and ``original_module`` tensors skipped, ``modules_to_save.default.`` removed). The delta comes from peft's
own ``get_delta_weight``, computed beside the model rather than merged into it and out again, so publishing never
rounds the trainer's weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from sharpgrpo.training.generation.policy_inputs import gathered_parameter, zero3_enabled


@torch.no_grad()
def plain_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the plain causal LM that ``model`` stands for: its own without a peft adapter; with one, the
    base model's with every LoRA layer's delta added to its base weight (see the module docstring)."""
    if not hasattr(model, "get_base_model"):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            adapters = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if adapters and not module.disable_adapters:
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in adapters)
    state = {}
    for name, tensor in base.state_dict().items():
        if "lora_" in name or "original_module" in name:
            continue
        plain = name.replace(".base_layer", "").replace("modules_to_save.default.", "")
        state[plain] = tensor + deltas[plain].to(tensor.dtype) if plain in deltas else tensor
    return state


@contextlib.contextmanager
def whole_policy(trainer) -> Iterator[dict[str, torch.Tensor]]:
    """The trainer's policy as its :func:`plain_state_dict`, whole for the duration of the block, on every process
    (all must enter together): under DeepSpeed ZeRO-3 every parameter is gathered (the whole model is held once on
    each process meanwhile, as when ZeRO-3 saves a 16-bit model), under FSDP2 each DTensor with ``full_tensor()``;
    without sharding it is the policy's own tensors."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    gathered = contextlib.nullcontext()
    if zero3_enabled(trainer.accelerator):
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    with gathered:
        yield {name: gathered_parameter(tensor) for name, tensor in plain_state_dict(model).items()}


class SharedMemoryWeights:
    """One version of the policy's weights in shared memory. Build it in the trainer from the policy's
    :func:`plain_state_dict`, pass it to the rollout process (the tensors are shared, not copied), then ``publish``
    and ``load_into``."""

    def __init__(self, state: dict[str, torch.Tensor], context):
        self.tensors = {name: tensor.detach().to("cpu", copy=True).share_memory_()
                        for name, tensor in state.items()}  # on the CPU whatever the model's device
        self.version = context.Value("q", -1)
        self.lock = context.Lock()

    def publish(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Copy the policy's current weights (its :func:`plain_state_dict`) in and mark them ``version``."""
        with self.lock, torch.no_grad():
            for name, tensor in self.tensors.items():
                tensor.copy_(state[name].detach())
            self.version.value = version

    def load_into(self, model: torch.nn.Module, loaded: int) -> int:
        """Copy the published weights into ``model`` if their version differs from ``loaded``; returns the version
        ``model`` now holds."""
        if self.version.value == loaded:
            return loaded
        with self.lock, torch.no_grad():
            state = model.state_dict()
            for name, tensor in self.tensors.items():
                state[name].copy_(tensor)
            return self.version.value
