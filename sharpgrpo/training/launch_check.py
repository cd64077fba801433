"""The launch is what was asked for: refuse, in one line before the first step, a run whose processes are not
what its launcher asked for.

accelerate quietly builds something else in three cases seen on a CPU machine (issue 30):

* an FSDP (v1 or v2) accelerate config with ``use_cpu`` trains as plain data parallel (accelerate's CPU state is
  ``MULTI_CPU`` whatever the config says), with every process holding the whole model;
* a DeepSpeed config that accelerate could not honour would do the same;
* ``accelerate launch --num_processes N`` with ``use_cpu false`` on a machine without GPUs starts N processes that
  each initialise no process group (``DistributedType.NO``): each trains alone, on its own data, into the same
  ``output_dir``.

What was asked is read from the launcher's environment (``accelerate launch`` exports ``ACCELERATE_USE_FSDP``,
``FSDP_VERSION``, ``ACCELERATE_USE_DEEPSPEED``; torchrun exports ``WORLD_SIZE``) and from the training arguments
(``fsdp``, ``deepspeed``); what was built is the accelerator's ``distributed_type`` and ``num_processes``. The config
file is named where the launcher's command line says it (``--config_file``), otherwise "the accelerate config".

Also here: parameters sharded across processes (DeepSpeed ZeRO-3, FSDP) rule out the sharpness probe, which
perturbs and restores every parameter in place outside the wrapped forward (refused with the field named).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharpgrpo.validation import ConfigError


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class LaunchRequest:
    """What the launcher asked for: ``backend`` "fsdp", "deepspeed" or None (data parallel / one process),
    ``detail`` (e.g. "FSDP_VERSION=2") and ``world_size`` (processes launched, 1 when not launched)."""

    backend: str | None
    detail: str
    world_size: int


def requested_launch(env: Mapping[str, str], fsdp: Sequence | str | None = None,
                     deepspeed: object = None) -> LaunchRequest:
    """Read the request from the launcher's environment and the training arguments' ``fsdp``/``deepspeed``."""
    world_size = int(env.get("WORLD_SIZE", "1") or 1)
    if _flag(env, "ACCELERATE_USE_DEEPSPEED") or deepspeed:
        stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
        return LaunchRequest("deepspeed", f"DeepSpeed ZeRO-{stage}" if stage else "DeepSpeed", world_size)
    if _flag(env, "ACCELERATE_USE_FSDP") or fsdp:
        version = env.get("FSDP_VERSION", "1")
        return LaunchRequest("fsdp", f"FSDP (fsdp_version {version})", world_size)
    return LaunchRequest(None, "", world_size)


def launcher_config_file(cmdline: Sequence[str]) -> str | None:
    """The ``--config_file`` of an ``accelerate launch`` command line (its workers' parent), or None."""
    for index, arg in enumerate(cmdline):
        if arg == "--config_file" and index + 1 < len(cmdline):
            return cmdline[index + 1]
        if arg.startswith("--config_file="):
            return arg.split("=", 1)[1]
    return None


def _parent_cmdline() -> list[str]:
    """The parent process's command line (Linux ``/proc``; empty elsewhere). Under ``accelerate launch`` the
    workers' parent is the launcher itself (torch's elastic agent runs inside it)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def launch_mismatch(request: LaunchRequest, distributed_type: str, num_processes: int,
                    config_name: str = "the accelerate config") -> str | None:
    """One line saying how the built launch differs from the request, or None when it is what was asked.

    ``distributed_type`` is accelerate's ``DistributedType`` name (``FSDP``, ``DEEPSPEED``, ``MULTI_CPU``, ``NO``,
    ...), ``num_processes`` the processes the accelerator sees."""
    built = f"{distributed_type} with {num_processes} process{'es' if num_processes != 1 else ''}"
    if request.backend == "fsdp" and distributed_type != "FSDP":
        hint = (" (accelerate builds FSDP on GPUs only: on the CPU, with use_cpu, it trains plain data parallel with "
                "the whole model in every process)" if distributed_type in ("MULTI_CPU", "NO") else "")
        return (f"{config_name} asks for {request.detail} but accelerate built {built}{hint}; launch on GPUs, or use "
                "configs/accelerate/multi_gpu.yaml for data parallel")
    if request.backend == "deepspeed" and distributed_type != "DEEPSPEED":
        return f"{config_name} asks for {request.detail} but accelerate built {built}"
    if request.world_size > 1 and num_processes != request.world_size:
        hint = (" (on a machine without GPUs set `use_cpu: true` for gloo)" if num_processes == 1 else "")
        return (f"{config_name} launched {request.world_size} processes but each sees {num_processes} "
                f"(accelerate built {built}): each would train alone into the same output_dir{hint}")
    return None


def _config_name(parent_cmdline: Sequence[str] | None) -> str:
    config_file = launcher_config_file(_parent_cmdline() if parent_cmdline is None else parent_cmdline)
    return f"the accelerate config {config_file}" if config_file else "the accelerate config"


def check_launch_request(args, env: Mapping[str, str] | None = None, parent_cmdline: Sequence[str] | None = None,
                         accelerator_available: bool | None = None, head_readers: Sequence[str] = ()) -> None:
    """Before accelerate is set up: refuse FSDP on the CPU (``use_cpu``, or no GPU), where accelerate builds plain
    data parallel or no process group, and some FSDP settings (FSDP1's ``sync_module_states``) crash in accelerate
    with a device error that names neither the config nor FSDP; and FSDP1 with strategies that read the LM head
    outside the forward (``head_readers``: THR, NTHR), since FSDP1 flattens the head into a sharded flat parameter
    that only its own forward gathers (FSDP2 and ZeRO-3 are gathered, `policy_inputs.full_unembedding`)."""
    env = os.environ if env is None else env
    request = requested_launch(env, getattr(args, "fsdp", None), getattr(args, "deepspeed", None))
    if request.backend != "fsdp":
        return
    if head_readers and env.get("FSDP_VERSION", "1") == "1":
        raise ConfigError(
            f"strategies={list(head_readers)}: {_config_name(parent_cmdline)} asks for FSDP1 (fsdp_version 1), which "
            "shards the LM head these strategies read outside the forward; use fsdp_version: 2 "
            "(configs/accelerate/fsdp2.yaml) or DeepSpeed ZeRO-3 (configs/accelerate/zero3.yaml)."
        )
    if accelerator_available is None:
        accelerator_available = _accelerator_available()
    if getattr(args, "use_cpu", False) or not accelerator_available:
        where = "use_cpu is true" if getattr(args, "use_cpu", False) else "this machine has no GPU"
        raise ConfigError(
            f"launch: {_config_name(parent_cmdline)} asks for {request.detail} but {where}, and accelerate builds "
            "FSDP on GPUs only (on the CPU it would train plain data parallel with the whole model in every process); "
            "launch on GPUs, or use configs/accelerate/multi_gpu.yaml for data parallel."
        )


def _accelerator_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def check_launch(accelerator, args, env: Mapping[str, str] | None = None,
                 parent_cmdline: Sequence[str] | None = None) -> None:
    """Raise ConfigError (one line, naming the config and what was built) when the launch is not what was asked
    for, or when ``sharpness_probe_steps`` is set with sharded parameters."""
    env = os.environ if env is None else env
    request = requested_launch(env, getattr(args, "fsdp", None), getattr(args, "deepspeed", None))
    config_name = _config_name(parent_cmdline)
    distributed_type = str(accelerator.distributed_type).split(".")[-1]
    problem = launch_mismatch(request, distributed_type, accelerator.num_processes, config_name)
    if problem:
        raise ConfigError(f"launch: {problem}.")
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    sharded = sharded_parameters(distributed_type, getattr(plugin, "zero_stage", None))
    if sharded and getattr(args, "sharpness_probe_steps", 0):
        raise ConfigError(
            f"sharpness_probe_steps={args.sharpness_probe_steps}: the sharpness probe perturbs every parameter in "
            f"place, which {sharded} shards across processes; set sharpness_probe_steps: 0 (or train data parallel)."
        )


def sharded_parameters(distributed_type: str, zero_stage: int | None = None) -> str | None:
    """"DeepSpeed ZeRO-3" or "FSDP" when accelerate's ``distributed_type`` (with DeepSpeed's ``zero_stage``) shards
    parameters across processes, else None."""
    if distributed_type == "FSDP":
        return "FSDP"
    if distributed_type == "DEEPSPEED" and zero_stage == 3:
        return "DeepSpeed ZeRO-3"
    return None
