"""Weights to a vLLM server without CUDA: the ``sharpgrpo_file`` weight-transfer engine, both of its sides.

Why a new engine. TRL 1.16 pushes the policy to a ``vllm serve`` server only through vLLM's NCCL weight-transfer
engine (``VLLMClient.init_communicator``, ``trl/generation/vllm_client.py`` lines 726-775, refuses any device but
CUDA at line 756). vLLM 0.31 registers its engines by name (``vllm/distributed/weight_transfer/factory.py``:
``nccl``, ``ipc``, ``sparse_nccl``, ``sharded_rdt``, ``nccl_m2n``) and none of them runs on its CPU backend: NCCL
needs CUDA; ``ipc`` shares CUDA tensors (``ipc_engine.py``: ``rebuild_cuda_tensor``,
``torch.cuda.get_device_properties``, line 223); and every engine inherits ``WeightTransferEngine.update_weights``
(``base.py`` line 491), which ends with ``torch.accelerator.synchronize()`` (line 502), an error on a machine without
an accelerator ("Cannot access accelerator device when none is available").

The engine. The trainer writes the tensors TRL would broadcast into one safetensors file in shared memory
(``/dev/shm`` where it exists) and posts its path through the same endpoints TRL's NCCL path uses
(``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``); the
server's worker reads the file and loads the tensors with vLLM's layerwise reload, as ``ipc_engine.py`` does
(``initialize_layerwise_reload`` at the start, ``model.load_weights`` per update, ``finalize_layerwise_reload`` at the
finish), which repacks the CPU backend's linear weights (``vllm_sync``'s docstring); a tied LM head is repacked after
it (:func:`~sharpgrpo.training.generation.vllm_sync.repack_shared_weights`). ``update_weights`` synchronises an
accelerator only where there is one. The trainer deletes the file once the server answered ``/update_weights`` (the
load is done by then: vLLM's ``Worker.update_weights`` runs it inside the request).

Where it runs. The server registers the engine when it starts through ``sharpgrpo vllm-serve``
(``sharpgrpo.cli.vllm_serve``), which picks it where CUDA is absent and leaves NCCL everywhere else. The trainer's side
is :class:`FileWeightTransferClient`, TRL's ``VLLMClient`` with the same interface (``init_communicator``,
``update_named_params``, ``close_communicator``): it takes the file path when the server reports this engine
(``/server_info``) and is TRL's own client otherwise. Trainer and server must share the file system (one machine).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

FILE_BACKEND = "sharpgrpo_file"
SHARED_MEMORY_DIR = Path("/dev/shm")


def server_weight_transfer_backend(server_info: dict) -> str | None:
    """The weight-transfer engine a server reports in ``/server_info`` (TRL's ``get_server_info``), or None."""
    config = server_info.get("weight_transfer_config")
    return config.get("backend") if isinstance(config, dict) else None


def register_file_engine() -> bool:
    """Register the ``sharpgrpo_file`` engine with vLLM's weight-transfer factory in this process (needed in the
    process that runs vLLM's worker). Returns whether it was registered now (False: already there)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if FILE_BACKEND in WeightTransferEngineFactory._registry:
        return False
    WeightTransferEngineFactory.register_engine(FILE_BACKEND, file_engine_class())
    return True


def file_engine_class():
    """The server side: a vLLM ``WeightTransferEngine`` that loads the tensors of the file each update names."""
    import torch
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclass
    class FileInitInfo(WeightTransferInitInfo):
        """No rendezvous: the files carry everything."""

    @dataclass
    class FileUpdateInfo(WeightTransferUpdateInfo):
        path: str
        names: list[str] = field(default_factory=list)

    class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
        init_info_cls = FileInitInfo
        update_info_cls = FileUpdateInfo

        def init_transfer_engine(self, init_info: FileInitInfo) -> None:
            pass

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def update_weights(self, update_info: dict) -> None:
            self.receive_weights(self.parse_update_info(update_info))
            if torch.accelerator.is_available():  # the base class synchronises unconditionally (module docstring)
                torch.accelerator.synchronize()

        def receive_weights(self, update_info: FileUpdateInfo) -> None:
            from safetensors.torch import load_file
            from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

            tensors = load_file(update_info.path, device=str(self.device))
            names = update_info.names or list(tensors)
            with disable_mtp_completeness_check():
                self.model.load_weights((name, tensors[name]) for name in names)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            from sharpgrpo.training.generation.vllm_sync import repack_shared_weights, vllm_platform_repacks_weights

            finalize_layerwise_reload(self.model, self.model_config)
            if vllm_platform_repacks_weights():
                repack_shared_weights(self.model)

        def shutdown(self) -> None:
            pass

    return FileWeightTransferEngine


def weight_file_dir() -> Path:
    """Where the trainer writes weight files: shared memory (``/dev/shm``) where it exists, else the temp directory."""
    if SHARED_MEMORY_DIR.is_dir() and os.access(SHARED_MEMORY_DIR, os.W_OK):
        return SHARED_MEMORY_DIR
    return Path(tempfile.gettempdir())


def file_weight_transfer_client_class():
    """The trainer side: TRL's ``VLLMClient`` that sends weights as files to a ``sharpgrpo_file`` server, and is TRL's
    client unchanged (NCCL) for any other server."""
    from trl.generation.vllm_client import VLLMClient

    class FileWeightTransferClient(VLLMClient):
        weight_dir: Path | None = None

        def init_communicator(self, device=0):
            if server_weight_transfer_backend(self.get_server_info()) != FILE_BACKEND:
                return super().init_communicator(device)
            self.weight_dir = Path(tempfile.mkdtemp(prefix="sharpgrpo-weights-", dir=weight_file_dir()))
            self._post(f"{self.base_url}/init_weight_transfer_engine", json={"init_info": {}})
            atexit.register(self.close_communicator)  # the folder goes at exit, as TRL closes its NCCL group
            return None

        def update_named_params(self, metadata, named_params):
            if self.weight_dir is None:
                return super().update_named_params(metadata, named_params)
            from safetensors.torch import save_file

            tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in named_params}
            names = [name for name, _, _ in metadata] or list(tensors)
            handle, path = tempfile.mkstemp(suffix=".safetensors", dir=self.weight_dir)
            os.close(handle)
            try:
                save_file(tensors, path)
                if not self._updating_weights:
                    self._start_weight_update()
                self._post(f"{self.base_url}/update_weights", json={"update_info": {"path": path, "names": names}})
                if not self._updating_weights:
                    self._finish_weight_update()
            finally:
                os.unlink(path)
            return None

        def close_communicator(self):
            if self.weight_dir is None:
                return super().close_communicator()
            import shutil

            shutil.rmtree(self.weight_dir, ignore_errors=True)
            self.weight_dir = None
            return None

    return FileWeightTransferClient


def use_file_weight_transfer_client() -> None:
    """Make TRL's server-mode generation (``VLLMGeneration``, which builds ``VLLMClient`` by its module's name,
    ``trl/generation/vllm_generation.py`` line 306) build :func:`file_weight_transfer_client_class`'s client, which
    is TRL's own for an NCCL server."""
    import trl.generation.vllm_generation as vllm_generation

    if getattr(vllm_generation.VLLMClient, "weight_dir", False) is False:
        vllm_generation.VLLMClient = file_weight_transfer_client_class()
