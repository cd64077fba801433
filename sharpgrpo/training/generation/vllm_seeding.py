"""Sampling seeds for vLLM generation: TRL seeds its colocated engine with the process index only, so runs that differ
only in ``seed`` would sample the same completions (docs/scale.md, "Seeds with vLLM")."""

from __future__ import annotations


def colocated_vllm_seed(seed: int, process_index: int, tensor_parallel_size: int = 1) -> int:
    """Seed of a process's colocated vLLM sampling: the training seed plus the process's tensor-parallel group.

    The processes of one tensor-parallel group must draw the same samples (TRL seeds them alike); with
    ``tensor_parallel_size = 1`` this is ``seed + process_index``, TRL's own per-process training seed."""
    return int(seed) + process_index // max(int(tensor_parallel_size), 1)


def server_request_seed(seed: int, generation_index: int) -> int:
    """Per-request vLLM seed for server mode: distinct for every generation batch and every training seed."""
    return (int(seed) * 1_000_003 + int(generation_index)) % (2**31 - 1)


def seed_colocated_vllm(args, process_index: int) -> None:
    """Reseed this process's random streams from ``seed`` after TRL started the colocated vLLM engine, which
    samples requests without a seed from the global streams it reseeded with the process index only."""
    from accelerate.utils import set_seed

    set_seed(colocated_vllm_seed(args.seed, process_index, args.vllm_tensor_parallel_size))


def server_generation_kwargs(args, generation_index: int) -> dict:
    """The user's vLLM ``generation_kwargs`` plus, unless given, a ``seed`` per generation batch and training seed
    (the server samples a prompt's G completions as one request, seeded seed + i by vLLM)."""
    kwargs = dict(args.generation_kwargs or {})
    kwargs.setdefault("seed", server_request_seed(args.seed, generation_index))
    return kwargs


def refuse_vllm_request_seed(args) -> None:
    """Refuse a fixed ``seed`` in ``generation_kwargs`` with colocated vLLM.

    Colocated vLLM generates each of the G copies of a prompt as its own request (``n = 1``); a ``seed`` in the
    sampling parameters gives every request the same generator, so the G completions of a prompt would be identical
    and every advantage 0. The trainer seeds colocated sampling from ``seed`` instead (``seed_colocated_vllm``).
    """
    if args.use_vllm and args.vllm_mode == "colocate" and "seed" in (args.generation_kwargs or {}):
        raise ValueError(
            "`generation_kwargs` sets `seed` with `vllm_mode='colocate'`: vLLM would give each of the "
            f"num_generations={args.num_generations} copies of a prompt the same random stream, so every group's "
            "completions would be identical and its advantages 0. Remove it: SharpGRPOTrainer seeds colocated "
            "sampling from `seed` and the process index."
        )
