"""Per-token and per-turn rewards: returns-to-go with a group baseline that stays unbiased when the policy decides how
many turns it takes (docs/methods.md §15.6).

A reward function may return, for a completion, a list of rewards instead of one number: ``{"per_token": [...]}``
(one per completion token) or ``{"per_turn": [...]}`` (one per model turn of a multi-turn rollout; a single-turn
completion has one turn). ``sharpgrpo.training.generation.dense_rewards`` places them on tokens: a per-token reward on
its token, a per-turn reward on the turn's last model token, a plain reward on the completion's last model token;
TRL receives each completion's sum, so its logged reward and every other strategy see the same total.

``dense_returns`` turns the placed rewards into token advantages. For completion ``i`` of a group of ``n``, unit ``k``
(a turn, or with ``dense_returns_unit: token`` a token position among the completion's model tokens) and a token ``t``
of that unit:

    R[i, t] = sum_{s >= t} r[i, s]                          (the reward-to-go from token t)
    S[j, k] = R[j, first token of unit k of j]              (0 where completion j has no unit k)
    A[i, t] = R[i, t] - 1/(n - 1) sum_{j != i} S[j, k]      (a group of one keeps R)

then divided by the group's (or batch's) standard deviation of the total returns ``S[., 0]`` as TRL's
``scale_rewards`` says (``"none"``: not divided). The baseline of completion ``i`` is computed from the other
completions only, so it does not depend on anything completion ``i`` sampled, in particular not on when it stopped:
the policy-gradient estimate stays unbiased. The construction usually used instead, normalising each turn's reward
over the completions that reached that turn index and summing the normalised rewards of the remaining turns, subtracts
a number of baseline terms set by the completion's own stopping turn, an action-dependent baseline whose bias equals
the accumulated mean intermediate reward (verl-project/verl#7244, "a turn-level baseline that stays unbiased under
variable turn counts"); the tests show that baseline moving with a completion's own turn count while this one does
not. With one plain reward per completion and single-turn completions, ``A`` is RLOO's advantage (§15.1).
"""

from __future__ import annotations

from typing import Any

import torch

from sharpgrpo.strategies.base import GenerationBatch, StrategyPaper, group_slices, register_strategy
from sharpgrpo.strategies.baselines import RewardBaseline, scale_by_return_std
from sharpgrpo.validation import ConfigError

def rewards_to_go(token_rewards: torch.Tensor) -> torch.Tensor:
    """R[i, t] = sum_{s >= t} r[i, s] over every position of the row. (B, T) -> (B, T)."""
    return token_rewards.flip(1).cumsum(1).flip(1)


def unit_start_returns(returns: torch.Tensor, units: torch.Tensor, num_units: int) -> torch.Tensor:
    """S[i, k]: the reward-to-go at the first token of unit k of row i, 0 where the row has no unit k. returns (B, T),
    units (B, T) long (the unit index of each token, -1 off the units) -> (B, num_units)."""
    starts = torch.zeros(returns.size(0), num_units, dtype=returns.dtype, device=returns.device)
    positions = torch.arange(units.size(1), device=units.device).expand_as(units)
    first = torch.full((units.size(0), num_units), units.size(1), dtype=torch.long, device=units.device)
    valid = units >= 0
    first.scatter_reduce_(1, units.clamp(min=0), torch.where(valid, positions, units.size(1)), reduce="amin")
    present = first < units.size(1)
    starts[present] = returns.gather(1, first.clamp(max=units.size(1) - 1))[present]
    return starts


def dense_return_advantages(token_rewards: torch.Tensor, units: torch.Tensor,
                            group_ids: torch.Tensor) -> torch.Tensor:
    """A[i, t] = R[i, t] minus the mean over the other completions of the group of their return from the start of the
    same unit (module docstring), unscaled; 0 off the units. token_rewards (B, T), units (B, T) long (-1 off),
    group_ids (B,) consecutive -> (B, T)."""
    returns = rewards_to_go(token_rewards)
    num_units = int(units.max().item()) + 1 if units.numel() and bool((units >= 0).any()) else 0
    advantages = torch.zeros_like(returns)
    if num_units == 0:
        return advantages
    starts = unit_start_returns(returns, units, num_units)
    for rows in group_slices(group_ids):
        n = rows.stop - rows.start
        baseline = torch.zeros_like(starts[rows])
        if n > 1:
            baseline = (starts[rows].sum(0, keepdim=True) - starts[rows]) / (n - 1)  # leave-one-out, per unit
        row_units = units[rows]
        per_token = baseline.gather(1, row_units.clamp(min=0))
        advantages[rows] = torch.where(row_units >= 0, returns[rows] - per_token, torch.zeros_like(per_token))
    return advantages


@register_strategy("dense_returns")
class DenseReturnsStrategy(RewardBaseline):
    """Returns-to-go of per-token / per-turn rewards with the leave-one-out unit baseline (docs/methods.md §15.6),
    scaled as TRL's ``scale_rewards``; it replaces TRL's advantage, so it comes first among the advantage strategies.
    Metrics: ``dense_returns/return_mean`` (mean total return), ``dense_returns/units_mean`` (mean number of units per
    completion), ``dense_returns/dense_fraction`` (fraction of completions with a reward on more than one token)."""

    params = ("dense_returns_unit",)
    needs_inputs = ("token_rewards", "reward_units")
    metrics = ("dense_returns/return_mean", "dense_returns/units_mean", "dense_returns/dense_fraction")
    paper = StrategyPaper(
        "Per-turn reward support for multi-turn RL: a turn-level baseline that stays unbiased under variable turn "
        "counts",
        "verl-project/verl#7244 (2026), per-turn rewards with an unbiased turn-level baseline.",
        None,
    )

    @classmethod
    def check_config(cls, args: Any) -> None:
        super().check_config(args)
        if getattr(args, "dynamic_sampling", False):
            raise ConfigError("strategies: dense_returns reads the per-token rewards of the batch's own reward call, "
                              "which dynamic_sampling's refill rounds replace; set dynamic_sampling to false.")

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        token_rewards = batch.extras["token_rewards"].double() * batch.completion_mask  # placed on loss tokens only
        units = torch.where(batch.completion_mask.bool(), batch.extras["reward_units"].long(), -1)  # padding: -1
        advantages = dense_return_advantages(token_rewards, units, batch.group_ids)
        total = token_rewards.sum(1)
        scaled = scale_by_return_std(advantages, total, batch.group_ids, str(self.args.scale_rewards))
        counts = (units.max(dim=1).values + 1).clamp(min=0).double()
        dense = ((token_rewards != 0).sum(1) > 1).double()
        metrics = {"dense_returns/return_mean": float(total.mean()), "dense_returns/units_mean": float(counts.mean()),
                   "dense_returns/dense_fraction": float(dense.mean())}
        return scaled.to(batch.advantages.dtype), metrics
