"""Per-token and per-turn rewards from reward functions, placed on the completion's tokens for the strategies that
read them (``dense_returns``; docs/methods.md §15.6).

A reward function returns, per completion, a number (or None) as TRL expects, or a dict with one key:
``{"per_token": [r_0, ..., r_{L-1}]}`` (one reward per completion token, ``L = len(completion_ids[i])``) or
``{"per_turn": [r_0, ..., r_{K-1}]}`` (one per model turn: a turn is a maximal run of sampled tokens between tool or
retrieval outputs; a single-turn completion has one). Each function is wrapped once (:class:`DenseRewardCollector`,
inside ``checked_reward_functions``): a dict becomes its sum, which TRL weights, sums and logs as usual, and the list
is kept for this batch. The generation inputs ``token_rewards`` and ``reward_units`` then place, for every local
completion, the weighted rewards of every function on tokens (a per-token reward on its token, or, on a tool or
retrieval token, on the last sampled token before it; a per-turn reward on the turn's last sampled token, a plain reward on the completion's last sampled token; None counts 0, as TRL's nansum)
and number each loss token's unit (its turn, or with ``dense_returns_unit: token`` its position among the sampled
tokens; -1 off the loss mask). A dict where no configured strategy reads them is refused naming the function.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch

from sharpgrpo.training.generation.inputs import loss_mask, register_generation_input

DENSE_KINDS = ("per_token", "per_turn")
DENSE_INPUTS = ("token_rewards", "reward_units")


class DenseRewardError(ValueError):
    """A reward function's per-token or per-turn output that cannot be placed."""


def dense_rewards_read(args: Any) -> bool:
    """Whether a configured strategy reads the placed rewards (declares ``token_rewards`` in ``needs_inputs``)."""
    from sharpgrpo.strategies import STRATEGIES

    def needs(name: str) -> bool:
        try:
            return "token_rewards" in getattr(STRATEGIES.get(name), "needs_inputs", ())
        except (ValueError, ImportError, AttributeError):  # not a strategy: the config check names it
            return False

    return any(needs(name) for name in list(getattr(args, "strategies", None) or []))


class DenseRewardCollector:
    """Wraps one reward function's output: dicts -> their sums (for TRL), with the lists kept for the batch."""

    def __init__(self, name: str, enabled: bool):
        self.name, self.enabled = name, enabled
        self.kind: str | None = None  # "scalar", "per_token" or "per_turn" (of the last call)
        self.values: list = []  # the last call's value per completion: a number, None or a list

    def convert(self, output: Any, completion_ids: list[list[int]] | None) -> Any:
        if hasattr(output, "tolist") and not isinstance(output, (str, bytes)):
            output = output.tolist()
        if not isinstance(output, (list, tuple)) or not any(isinstance(value, dict) for value in output):
            self.kind, self.values = "scalar", list(output) if isinstance(output, (list, tuple)) else []
            return output
        kinds = {next(iter(value)) for value in output if isinstance(value, dict) and len(value) == 1}
        for index, value in enumerate(output):
            self._check_entry(index, value, len(output), completion_ids)
        if len(kinds) > 1:
            raise DenseRewardError(f"Reward function {self.name!r} returned both per_token and per_turn rewards in "
                                   "one batch; return one kind per function.")
        if not self.enabled:
            raise DenseRewardError(
                f"Reward function {self.name!r} returned {next(iter(kinds))} rewards; they are read by the "
                "`dense_returns` strategy: add it first to `strategies`, or return one number per completion.")
        self.kind = kinds.pop()
        self.values = [value[self.kind] if isinstance(value, dict) else value for value in output]
        return [None if value is None else (float(sum(value)) if isinstance(value, list) else value)
                for value in self.values]

    def _check_entry(self, index: int, value: Any, expected: int, completion_ids) -> None:
        where = f"Reward function {self.name!r}, completion {index} of {expected}"
        if value is None or isinstance(value, Real):
            return
        if not isinstance(value, dict) or len(value) != 1 or next(iter(value)) not in DENSE_KINDS:
            raise DenseRewardError(f"{where}: {value!r:.80}; a reward is a number, None, {{'per_token': [...]}} or "
                                   "{'per_turn': [...]}.")
        kind, rewards = next(iter(value.items()))
        if not isinstance(rewards, (list, tuple)) or not all(isinstance(r, Real) and math.isfinite(r) for r in rewards):
            raise DenseRewardError(f"{where}: {kind} must be a list of finite numbers, got {rewards!r:.80}.")
        value[kind] = [float(r) for r in rewards]
        if kind == "per_token" and completion_ids is not None and len(rewards) != len(completion_ids[index]):
            raise DenseRewardError(f"{where}: {len(rewards)} per_token rewards for a completion of "
                                   f"{len(completion_ids[index])} tokens; give one per completion token.")


def reward_collectors(trainer) -> list[tuple[DenseRewardCollector | None, float]]:
    """(collector, weight) per reward function of ``trainer``; a reward model or Hub id has no collector."""
    weights = trainer.reward_weights.tolist()
    return [(getattr(fn, "__dense_rewards__", None), float(weight))
            for fn, weight in zip(trainer.reward_funcs, weights, strict=True)]


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """The turn of each loss token: turns are the maximal runs of 1 in each row, numbered from 0; -1 off the mask.
    (B, T) -> (B, T) long."""
    mask = mask.long()
    previous = torch.nn.functional.pad(mask[:, :-1], (1, 0))
    starts = (mask == 1) & (previous == 0)
    return torch.where(mask == 1, starts.long().cumsum(1) - 1, torch.full_like(mask, -1))


def token_index(mask: torch.Tensor) -> torch.Tensor:
    """The position of each loss token among its row's loss tokens; -1 off the mask. (B, T) -> (B, T) long."""
    mask = mask.long()
    return torch.where(mask == 1, mask.cumsum(1) - 1, torch.full_like(mask, -1))


def last_loss_token_at_or_before(mask: torch.Tensor) -> torch.Tensor:
    """For each position of a row, the last loss token at or before it (-1 where none). (T,) -> (T,) long."""
    positions = torch.arange(mask.size(0))
    return torch.where(mask.bool(), positions, -1).cummax(0).values


def place_rewards(collectors: list[tuple[DenseRewardCollector | None, float]], mask: torch.Tensor,
                  dtype=torch.float64) -> torch.Tensor:
    """The weighted rewards of every function placed on tokens (module docstring). mask (B, T) -> (B, T)."""
    turns = turn_index(mask)
    placed = torch.zeros(mask.shape, dtype=dtype)
    last = turns.max(dim=1).values
    for collector, weight in collectors:
        if collector is None:
            raise DenseRewardError("dense_returns places every reward function's rewards on tokens; a reward model or "
                                   "a Hub reward id cannot be placed: use Python reward functions with it.")
        if len(collector.values) != mask.size(0):
            raise DenseRewardError(f"Reward function {collector.name!r} scored {len(collector.values)} completions "
                                   f"of a batch of {mask.size(0)}.")
        for row, value in enumerate(collector.values):
            if value is None or last[row] < 0:
                continue
            if collector.kind == "per_token" and isinstance(value, list):
                width = min(len(value), placed.size(1))
                owner = last_loss_token_at_or_before(mask[row, :width])  # a tool token's reward: its turn's end
                keep = owner >= 0
                placed[row].index_add_(0, owner[keep], weight * torch.tensor(value[:width], dtype=dtype)[keep])
            elif collector.kind == "per_turn" and isinstance(value, list):
                count = int(last[row]) + 1
                if len(value) != count:
                    raise DenseRewardError(f"Reward function {collector.name!r}, completion {row}: {len(value)} "
                                           f"per_turn rewards for a completion of {count} turn(s).")
                ends = [int(torch.nonzero(turns[row] == k).max()) for k in range(count)]
                placed[row, ends] += weight * torch.tensor(value, dtype=dtype)
            else:
                end = int(torch.nonzero(turns[row] >= 0).max())
                placed[row, end] += weight * float(value)
    return placed


@register_generation_input("token_rewards")
def token_rewards_input(trainer):
    """Every reward function's weighted rewards placed on this process's completion tokens (module docstring)."""
    def provide(output: dict) -> torch.Tensor:
        mask = loss_mask(output)
        return place_rewards(reward_collectors(trainer), mask.cpu()).to(mask.device, torch.float32)

    return provide


@register_generation_input("reward_units")
def reward_units_input(trainer):
    """The unit of each loss token (``dense_returns_unit``: turn or token), -1 off the loss mask."""
    by_token = getattr(trainer.args, "dense_returns_unit", "turn") == "token"

    def provide(output: dict) -> torch.Tensor:
        mask = loss_mask(output)
        return token_index(mask) if by_token else turn_index(mask)

    return provide
