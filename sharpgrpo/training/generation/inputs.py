"""Extra per-token inputs of advantage strategies, computed at generation by a registered provider.

A strategy that needs a per-token tensor the trainer does not compute itself (e.g. a teacher model's log-probabilities
of the sampled tokens, for on-policy distillation) names it in ``AdvantageStrategy.needs_inputs``; a provider
registered under that name supplies it, and the advantage pipeline hands it to the strategy gathered over processes as
``GenerationBatch.extras[name]`` (B, T). Neither the trainer nor the strategy set is edited for a new input:

    from sharpgrpo.training.generation.inputs import register_generation_input

    @register_generation_input("teacher_logps")
    def teacher_logps(trainer):                 # called once, when the trainer is built
        teacher = load_teacher(trainer.args)    # e.g. from a config field the strategy declares
        def provide(output):                    # every generation batch, on every process
            return teacher_logps_of(teacher, output)   # (B_local, T_local) float, one row per local completion
        return provide

A provider is a factory ``factory(trainer) -> provide``; ``provide(output)`` receives TRL's generation output of this
process (``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``, ...) and returns a (B, T) tensor
aligned with ``completion_ids``. Providers live in modules of this package (``sharpgrpo.training.generation``),
which the registry imports before a lookup; a provider elsewhere is named by its dotted import path. The config refuses
a strategy whose input is not registered (``StrategySet.check_config``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import torch

from sharpgrpo.registry import Registry


def _load_providers() -> None:
    import sharpgrpo.training.generation as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{module.name}")


GENERATION_INPUTS: Registry[Callable[[Any], Callable[[dict[str, Any]], torch.Tensor]]] = Registry(
    "generation input", load=_load_providers
)
register_generation_input = GENERATION_INPUTS.register


def loss_mask(batch: dict[str, Any]) -> torch.Tensor:
    """The tokens of a TRL generation output (or a micro-batch of it) that enter the loss: ``completion_mask``, times
    ``tool_mask`` where tool or retrieval outputs sit inside the completions (B, T)."""
    mask = batch["completion_mask"]
    return mask if batch.get("tool_mask") is None else mask * batch["tool_mask"]


def environment_mask(batch: dict[str, Any]) -> torch.Tensor | None:
    """The completion tokens the environment wrote (tool results, retrieved passages: ``tool_mask`` 0), (B, T), or
    None when the batch has no ``tool_mask``."""
    if batch.get("tool_mask") is None:
        return None
    return batch["completion_mask"] * (1 - batch["tool_mask"])


def environment_inputs(batch: dict[str, Any]) -> dict[str, torch.Tensor | None]:
    """What the loss sees of a micro-batch's environment tokens (``LossBatch``'s fields): ``env_mask``
    (:func:`environment_mask`), ``env_roles`` (the rollout's per-token roles, :func:`environment_roles`; None when it
    gives none) and the ``completion_ids`` (an ECHO filter reads them)."""
    return {"env_mask": environment_mask(batch), "env_roles": batch.get("env_roles"),
            "completion_ids": batch.get("completion_ids")}


def environment_roles(rows: list[dict[str, Any]], output: dict[str, Any]) -> dict[str, Any]:
    """``output`` plus ``env_roles`` (B, T) long where a rollout function gave each row's per-token role codes (its
    extra field ``env_roles``, which TRL copies into the input rows; ``strategies.base.ENVIRONMENT_ROLES``), padded
    with 0 to the completions' width: the rows of the batch, shuffled and split with it, reach the loss."""
    if not rows or any("env_roles" not in row for row in rows):
        return output
    ids = output["completion_ids"]
    roles = torch.zeros(ids.shape, dtype=torch.long)
    for index, row in enumerate(rows):
        codes = list(row["env_roles"])[: ids.size(1)]
        roles[index, : len(codes)] = torch.tensor(codes, dtype=torch.long)
    return {**output, "env_roles": roles.to(ids.device)}


def input_providers(trainer, names: tuple[str, ...]) -> dict[str, Callable[[dict[str, Any]], torch.Tensor]]:
    """The providers of ``names`` for ``trainer``, each factory called once."""
    return {name: GENERATION_INPUTS.get(name)(trainer) for name in names}


def provided_inputs(providers: dict[str, Callable], output: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Each provider's (B, T) tensor for this process's rows of ``output``; a wrong shape is refused naming it."""
    expected = tuple(output["completion_ids"].shape)
    values = {}
    for name, provide in providers.items():
        value = provide(output)
        if not torch.is_tensor(value) or tuple(value.shape) != expected:
            shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
            raise ValueError(f"Generation input {name!r} returned {shape}; expected a tensor of shape {expected} "
                             "(one value per completion token).")
        values[name] = value.detach()
    return values
