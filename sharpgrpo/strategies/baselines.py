"""The RLOO and REINFORCE++ baselines as advantage strategies (docs/methods.md §15).

Both replace TRL's group-normalised advantage ``(r_i - mean_g r) / (std_g r + eps)`` by another estimator of the same
rewards, so a recipe moved from verl or OpenRLHF keeps its advantage estimator; they must come first among the
advantage strategies (a strategy before them would be overwritten), and the ones after them (``thr``, ``passk_mixed``,
``ar``, ...) transform their output as they transform TRL's.

* ``rloo`` (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740, Eq. 5): per group of n completions,

      A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean_g r),

  broadcast over the completion's tokens; a group of one keeps A_i = r_i. As verl's
  ``compute_rloo_outcome_advantage`` (verl-project/verl@1dda039 ``verl/trainer/ppo/core_algos.py`` L587-636).
* ``reinforce_pp`` (Hu 2025, "REINFORCE++", arXiv:2501.03262): the outcome reward is placed on the last loss token of
  each completion, discounted returns ``G_t = r_t + gamma G_{t+1}`` are accumulated backwards (a token outside the loss
  mask, such as a tool result, carries the return through unchanged), and the returns are whitened over every loss
  token of the whole generation batch: ``(G - mean) / sqrt(var + 1e-8)`` with the unbiased (Bessel) variance. No
  group baseline. As verl's ``compute_reinforce_plus_plus_outcome_advantage`` (same file, L693-731) with
  ``verl_F.masked_whiten`` (``verl/utils/torch_functional.py`` L294-346).
* ``reinforce_pp_baseline`` (the same paper's "REINFORCE++-baseline" for group sampling): the group's mean reward is
  subtracted from each reward, the result broadcast over the completion's loss tokens and whitened over every loss
  token of the batch. As verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage`` (same file, L533-584).

The batch seen here is the whole generation batch gathered from every process (``GenerationBatch``), so the
whitening statistics are the global ones, as verl computes them on its driver.
"""

from __future__ import annotations

from typing import Any

import torch

from sharpgrpo.strategies.base import (
    STRATEGIES,
    AdvantageStrategy,
    GenerationBatch,
    StrategyPaper,
    group_slices,
    register_strategy,
)
from sharpgrpo.validation import ConfigError

WHITEN_EPS = 1e-8  # verl_F.masked_whiten: (x - mean) * rsqrt(var + 1e-8)
SCALE_EPS = 1e-4  # TRL 1.16 GRPOTrainer: advantages / (std_rewards + 1e-4)


def rloo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO advantages (Ahmadian et al. 2024, Eq. 5): r_i minus the mean reward of the other completions of its group,
    n/(n-1) (r_i - mean_g r); a group of one keeps r_i (verl's convention). rewards (B,), group_ids (B,) with
    consecutive groups -> (B,), in the rewards' dtype."""
    out = rewards.clone()
    for rows in group_slices(group_ids):
        group = rewards[rows]
        n = group.numel()
        if n > 1:
            out[rows] = (group - group.mean()) * (n / (n - 1))
    return out


def masked_whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) over the positions where ``mask`` is 1, var the unbiased (Bessel-corrected)
    masked variance, both means over ``mask.sum() + 1e-8`` as ``verl_F.masked_whiten`` computes them; the same shape
    as ``values``, any value off the mask. Raises ValueError with fewer than two masked positions (the unbiased
    variance is undefined)."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    if float(count) < 2:
        raise ValueError(f"whitening needs at least two loss tokens in the batch, got {int(count)}.")
    mean = (values * mask).sum() / (count + WHITEN_EPS)  # verl_F.masked_mean's guarded denominator, kept
    var = ((values - mean) ** 2 * mask).sum() / (count + WHITEN_EPS) * (count / (count - 1))
    return (values - mean) * torch.rsqrt(var + WHITEN_EPS)


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) outcome rewards placed on each row's last loss token -> (B, T) token rewards (0 elsewhere; a row without
    loss tokens gets none)."""
    token_rewards = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=1).values
    rows = torch.nonzero(last >= 0).squeeze(1)
    token_rewards[rows, last[rows]] = rewards[rows]
    return token_rewards


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Returns G_t = r_t + gamma G_{t+1} over loss tokens, backwards; a position off the mask gets 0 and passes the
    running return through unchanged (REINFORCE++; verl core_algos.py L718-726). (B, T), (B, T) -> (B, T)."""
    mask = mask.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.size(1))):
        step = token_rewards[:, t] + gamma * running
        returns[:, t] = step * mask[:, t]
        running = step * mask[:, t] + running * (1 - mask[:, t])
    return returns


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ token advantages: discounted returns whitened over every loss token of the batch, 0 off the mask.
    token_rewards (B, T), mask (B, T) -> (B, T)."""
    return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask) * mask.to(token_rewards.dtype)


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_ids: torch.Tensor,
                                     mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline: r_i minus its group's mean reward (a group of one: minus 0), broadcast over the loss
    tokens and whitened over every loss token of the batch, 0 off the mask. rewards (B,), group_ids (B,),
    mask (B, T) -> (B, T)."""
    mask = mask.to(rewards.dtype)
    return masked_whiten(group_centred(rewards, group_ids)[:, None] * mask, mask) * mask


def scale_by_return_std(advantages: torch.Tensor, total_returns: torch.Tensor, group_ids: torch.Tensor,
                        scale: str) -> torch.Tensor:
    """Divide ``advantages`` ((B,) or (B, T)) by the standard deviation (unbiased, as ``torch.std``) of the total
    returns (B,), per group (``"group"``; 0 for a group of one) or over the batch (``"batch"``), plus 1e-4, as TRL's
    ``scale_rewards`` scales its advantages; ``"none"`` returns them as they are."""
    if scale == "none":
        return advantages
    if scale == "batch":
        return advantages / (total_returns.std() + SCALE_EPS)
    std = torch.zeros_like(total_returns)
    for rows in group_slices(group_ids):
        if rows.stop - rows.start > 1:
            std[rows] = total_returns[rows].std()
    return advantages / (std.view(-1, *[1] * (advantages.dim() - 1)) + SCALE_EPS)


def group_centred(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """r_i minus the mean reward of its group; a group of one keeps r_i (verl core_algos.py L564-579). (B,) -> (B,)."""
    centred = rewards.clone()
    for rows in group_slices(group_ids):
        if rows.stop - rows.start > 1:
            centred[rows] = rewards[rows] - rewards[rows].mean()
    return centred


class RewardBaseline(AdvantageStrategy):
    """An advantage estimator computed from the rewards: it replaces TRL's advantage, so it must be the first
    advantage strategy of the list."""

    needs_old_logps = False
    _replaces_advantage = True  # another baseline in the same list is refused

    @classmethod
    def check_config(cls, args: Any) -> None:
        names = list(args.strategies)
        own = next(name for name in names if STRATEGIES.get(name) is cls)
        before = [name for name in names[: names.index(own)] if STRATEGIES.get(name).kind == "advantage"]
        if before:
            raise ConfigError(
                f"strategies: {own} computes the advantage from the rewards and would discard what "
                f"{', '.join(before)} computed before it; list {own} first among the advantage strategies."
            )
        others = [name for name in names
                  if name != own and getattr(STRATEGIES.get(name), "_replaces_advantage", False)]
        if others:
            raise ConfigError(f"strategies: {own} and {others[0]} are both advantage estimators; choose one.")


@register_strategy("rloo")
class RLOOStrategy(RewardBaseline):
    """RLOO's leave-one-out advantage (docs/methods.md §15.1), broadcast over tokens (padding included; the loss masks
    it). Metric: ``rloo/frac_zero_advantage`` (completions whose advantage is exactly 0: groups with equal rewards)."""

    metrics = ("rloo/frac_zero_advantage",)
    paper = StrategyPaper(
        "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs",
        "Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
        "Feedback in LLMs.",
        "2402.14740",
    )

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        advantages = rloo_advantages(batch.rewards.double(), batch.group_ids)
        out = advantages[:, None].expand_as(batch.advantages).to(batch.advantages.dtype).clone()
        return out, {"rloo/frac_zero_advantage": float((advantages == 0).double().mean())}


_REINFORCE_PP_PAPER = StrategyPaper(
    "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward Model",
    "Hu 2025, REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and Reward Model.",
    "2501.03262",
)


@register_strategy("reinforce_pp")
class ReinforcePPStrategy(RewardBaseline):
    """REINFORCE++ (docs/methods.md §15.2): discounted returns of the outcome reward (``reinforce_pp_gamma``, default
    1 as verl's ``algorithm.gamma``: every loss token's return is then the reward) whitened over the batch's loss
    tokens; 0 on padding. Metrics: ``reinforce_pp/return_mean`` and ``reinforce_pp/return_std`` (the whitening
    statistics)."""

    metrics = ("reinforce_pp/return_mean", "reinforce_pp/return_std")
    params = ("reinforce_pp_gamma",)
    paper = _REINFORCE_PP_PAPER

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.completion_mask.double()
        token_rewards = last_token_rewards(batch.rewards.double(), mask)
        returns = discounted_returns(token_rewards, mask, float(self.args.reinforce_pp_gamma))
        advantages = masked_whiten(returns, mask) * mask
        return advantages.to(batch.advantages.dtype), _return_metrics("reinforce_pp", returns, mask)


@register_strategy("reinforce_pp_baseline")
class ReinforcePPBaselineStrategy(RewardBaseline):
    """REINFORCE++-baseline (docs/methods.md §15.2): reward minus the group's mean, whitened over the batch's loss
    tokens; 0 on padding. Metrics: ``reinforce_pp_baseline/return_mean`` and ``reinforce_pp_baseline/return_std``."""

    metrics = ("reinforce_pp_baseline/return_mean", "reinforce_pp_baseline/return_std")
    paper = _REINFORCE_PP_PAPER

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.completion_mask.double()
        rewards = batch.rewards.double()
        advantages = reinforce_pp_baseline_advantages(rewards, batch.group_ids, mask)
        centred = group_centred(rewards, batch.group_ids)[:, None] * mask
        return advantages.to(batch.advantages.dtype), _return_metrics("reinforce_pp_baseline", centred, mask)


def _return_metrics(prefix: str, returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The masked mean and (unbiased) standard deviation the whitening divided by."""
    count = mask.sum().clamp(min=2)
    mean = (returns * mask).sum() / count
    var = ((returns - mean) ** 2 * mask).sum() / (count - 1)
    return {f"{prefix}/return_mean": float(mean), f"{prefix}/return_std": float(var.sqrt())}
