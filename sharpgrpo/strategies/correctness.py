"""One notion of a "correct completion" (docs/methods.md §3 "Positive set"), for THR's and NTHR's positive set P and for
the number of correct completions c of ``passk_mixed``.

Correctness comes from the task's **answer check**, not from the sign of the advantage of a total reward that may
also hold format terms (with the K&K reward's +-1 format term a wrong answer with good format can have A > 0). A
reward function declares its check with ``register_reward(name, answer_check=...)`` (``reward_fns``); the check has
the reward's signature and returns one ``bool | None`` per completion (None: the row is not its task's). Several
reward functions combine: a completion is correct when every check that gives a verdict says so.

Fallback, for completions no check gives a verdict on (a user's reward without ``answer_check``), with a one-time
warning naming the rule used:

* ``binary rewards``: the batch's total rewards lie in {0, 1}, or take exactly two values: correct = the higher
  value (in every mixed group, the group's maximum reward);
* otherwise ``A > 0``: correct = positive group-normalised advantage.

A group falls back as a whole when any of its completions has no verdict.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

FALLBACK_BINARY = "binary rewards: correct = the higher of the two reward values (the group's maximum reward)"
FALLBACK_ADVANTAGE = "A > 0: correct = positive group-normalised advantage"
_warned: set[str] = set()


def answer_checks(reward_funcs: Sequence[Any]) -> list[Callable | None]:
    """The answer check each reward function declared (``register_reward(answer_check=...)``), or None each."""
    from reward_fns import answer_check

    return [None if isinstance(fn, torch.nn.Module) else answer_check(fn) for fn in reward_funcs]


def answer_verdicts(
    reward_funcs: Sequence[Any], prompts: list, completions: list, columns: dict[str, Any] | None = None
) -> torch.Tensor | None:
    """(B,) float32 verdicts of the reward functions' answer checks: 1 correct, 0 wrong, NaN no verdict; None when
    no reward function has an answer check.

    ``columns`` are the keyword arguments the reward functions get (the dataset columns, one value per completion,
    and anything else TRL passes, e.g. ``completion_ids``). A completion is correct when every check that returns a
    bool for it returns True."""
    checks = [check for check in answer_checks(reward_funcs) if check is not None]
    if not checks:
        return None
    verdicts = torch.full((len(completions),), math.nan)
    for check in checks:
        results = list(check(prompts=prompts, completions=completions, **(columns or {})))
        if len(results) != len(completions):
            raise ValueError(
                f"The answer check {getattr(check, '__name__', check)!r} returned {len(results)} verdicts for "
                f"{len(completions)} completions; it must return one bool | None per completion."
            )
        for row, result in enumerate(results):
            if result is None:
                continue
            previous = verdicts[row].item()
            verdicts[row] = float(bool(result)) if math.isnan(previous) else min(previous, float(bool(result)))
    return verdicts


def fallback_rule(rewards: torch.Tensor) -> str:
    """Which fallback applies to these total rewards (docs/methods.md §3): ``FALLBACK_BINARY`` or ``FALLBACK_ADVANTAGE``."""
    values = torch.unique(rewards.detach().float())
    if bool(((values == 0) | (values == 1)).all()) or values.numel() == 2:
        return FALLBACK_BINARY
    return FALLBACK_ADVANTAGE


def fallback_correct(rewards: torch.Tensor, advantages: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Correctness without an answer check (docs/methods.md §3). rewards (B,), advantages (B,) -> ((B,) bool, rule)."""
    rule = fallback_rule(rewards)
    if rule == FALLBACK_BINARY:
        values = torch.unique(rewards.detach().float())
        top = 1.0 if bool(((values == 0) | (values == 1)).all()) else float(values.max())
        return rewards.float() == top, rule
    return advantages > 0, rule


def correct_completions(
    verdicts: torch.Tensor | None, rewards: torch.Tensor, advantages: torch.Tensor, group_ids: torch.Tensor
) -> torch.Tensor:
    """(B,) bool "correct" of every completion of whole groups (the one definition used by ``thr``, ``nthr`` and
    ``passk_mixed``).

    Shapes: verdicts (B,) float (1, 0, NaN = no verdict; see :func:`answer_verdicts`) or None; rewards (B,) total
    rewards; advantages (B,) TRL's group-normalised advantages; group_ids (B,). Groups in which some completion has
    no verdict use the fallback rule of :func:`fallback_correct` (decided on those groups' rewards) and warn once
    per process, naming the rule."""
    rewards = rewards.to(advantages.device)
    group_ids = group_ids.to(advantages.device)
    if verdicts is None:
        undecided = torch.ones_like(advantages, dtype=torch.bool)
        correct = torch.zeros_like(undecided)
    else:
        verdicts = verdicts.to(advantages.device)
        undecided = verdicts.isnan()
        correct = verdicts == 1
    if bool(undecided.any()):
        _, inverse = torch.unique(group_ids, return_inverse=True)
        group_undecided = torch.zeros(int(inverse.max()) + 1, dtype=torch.bool, device=advantages.device)
        group_undecided[inverse[undecided]] = True
        fallback_rows = group_undecided[inverse]
        fallback, rule = fallback_correct(rewards[fallback_rows], advantages[fallback_rows])
        correct = correct.clone()
        correct[fallback_rows] = fallback
        if rule not in _warned:
            _warned.add(rule)
            warnings.warn(
                "No answer check gives a verdict on some completions (declare one with "
                "`register_reward(name, answer_check=...)`, see reward_fns): their groups define \"correct\" (THR's "
                f"positive set, pass@k's c) by the fallback of docs/methods.md §3, {rule}.",
                UserWarning,
                stacklevel=2,
            )
    return correct


def batch_correct(batch) -> torch.Tensor:
    """(B,) bool correctness of a ``GenerationBatch``: ``batch.correct`` when the trainer filled it, else the
    fallback on ``batch.rewards`` and each row's masked mean advantage."""
    if batch.correct is not None:
        return batch.correct.to(batch.advantages.device).bool()
    advantages = batch.advantages
    if advantages.dim() == 2:
        valid = batch.completion_mask.to(advantages.dtype)
        advantages = (advantages * valid).sum(dim=1) / valid.sum(dim=1).clamp(min=1)
    return correct_completions(None, batch.rewards.float(), advantages.float(), batch.group_ids)
