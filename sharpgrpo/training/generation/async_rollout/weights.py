"""The weight transfer between the trainer and the rollout process: the policy's state dict in shared memory.

``SharedMemoryWeights`` holds one shared-memory copy of every tensor of the policy's state dict (made once, before the
rollout process starts, and inherited by it), a version counter and a lock. The trainer ``publish``es: it copies its
current weights in, under the lock, and sets the version; the rollout process ``load_into`` its own model before a job
when the version moved. This is the weight-transfer role that NCCL plays between TRL's trainer and a vLLM server on
GPUs; on CPU, where the processes share a machine, shared memory moves the weights without a copy through a pipe.
"""

from __future__ import annotations

import torch


class SharedMemoryWeights:
    """One version of the policy's weights in shared memory. Build it in the trainer from the model, pass it to the
    rollout process (the tensors are shared, not copied), then ``publish`` and ``load_into``."""

    def __init__(self, model: torch.nn.Module, context):
        self.tensors = {name: tensor.detach().to("cpu", copy=True).share_memory_()
                        for name, tensor in model.state_dict().items()}  # on the CPU whatever the model's device
        self.version = context.Value("q", -1)
        self.lock = context.Lock()

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Copy ``model``'s current weights in and mark them ``version``."""
        state = model.state_dict()
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
