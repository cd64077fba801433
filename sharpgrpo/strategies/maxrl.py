"""MaxRL: the group-mean-normalised advantage of Maximum Likelihood RL (docs/methods.md §18).

Tajwar, Zeng et al. 2026, "Maximum Likelihood Reinforcement Learning" (arXiv 2602.02710): with binary rewards, the
gradient of log pass@1's maximum-likelihood objective is the mean score function of the successful rollouts; with
the group mean as control variate it is GRPO's advantage divided by the group's mean reward instead of its standard
deviation (the paper's Algorithm 1):

    A_i = (r_i - mean_g r) / (mean_g r + eps),    eps = 1e-6,

broadcast over the completion's tokens. As the authors release it: tajwarfahim/maxrl@c0698eb
``verl/trainer/ppo/core_algos.py`` ``compute_maxrl_outcome_advantage`` L402-441 (group mean ``torch.mean`` of the
summed token rewards L424-426, the advantage L435-436, ``epsilon=1e-6`` L406, the caller passing no epsilon:
``verl/trainer/ppo/ray_trainer.py`` L270-286). A group whose completions all fail (mean 0) gets A = 0 / eps = 0, as
there: no gradient, as in GRPO; an all-correct group gets 0 too.

Two rules the released function does not have, both documented in docs/methods.md §18.2:

* rewards must be binary, exactly 0 or 1 (the paper: "Our work currently assumes a binary reward setting and does not
  extend directly to continuous or arbitrarily valued rewards"; the review of TRL's PR #5026 asked for this guard):
  a batch with another reward is refused in one line naming the completion and its reward. With rewards below 0 or
  a mean near 0 the advantage changes sign or grows without bound.
* a group of one completion is refused (the released function gives it mean 0, so A = r / 1e-6; prime-rl's
  PR #2985 uses the raw reward); ``num_generations`` >= 2 already keeps groups whole and larger than one.
"""

from __future__ import annotations

import torch

from sharpgrpo.strategies.base import GenerationBatch, StrategyPaper, group_slices, register_strategy
from sharpgrpo.strategies.baselines import RewardBaseline

MAXRL_EPS = 1e-6  # tajwarfahim/maxrl core_algos.py L406: epsilon: float = 1e-6 (ray_trainer.py L279-284 passes none)


def check_binary_rewards(name: str, rewards: torch.Tensor) -> None:
    """Raise ValueError in one line, naming ``name``, the first completion and its reward, unless every reward of
    ``rewards`` (B,) is exactly 0 or 1."""
    wrong = torch.nonzero((rewards != 0) & (rewards != 1)).flatten()
    if wrong.numel():
        row = int(wrong[0])
        raise ValueError(
            f"{name} needs binary rewards, each completion's total reward exactly 0 or 1 (MaxRL, arXiv 2602.02710, "
            f"assumes a binary reward); completion {row} of the generation batch has reward {float(rewards[row])!r} "
            f"({wrong.numel()} of {rewards.numel()} are not 0 or 1): use an answer check that returns 0 or 1 "
            f"(reward_weights summing to 1 over such checks keep it binary only when they agree), or drop {name}."
        )


def maxrl_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = MAXRL_EPS) -> torch.Tensor:
    """MaxRL's advantage (arXiv 2602.02710, Algorithm 1; tajwarfahim/maxrl core_algos.py L402-441):
    A_i = (r_i - mean_g r) / (mean_g r + eps) within each group, 0 for a group whose rewards are all 0. rewards (B,),
    group_ids (B,) with consecutive groups of at least two -> (B,), in the rewards' dtype. Raises ValueError for a
    group of one (the released code divides its reward by eps)."""
    out = torch.empty_like(rewards)
    for rows in group_slices(group_ids):
        group = rewards[rows]
        if group.numel() < 2:
            raise ValueError("maxrl needs groups of at least two completions (its baseline is the group's mean); got "
                             "a group of one.")
        mean = group.mean()
        out[rows] = (group - mean) / (mean + eps)
    return out


@register_strategy("maxrl")
class MaxRLStrategy(RewardBaseline):
    """MaxRL's advantage (docs/methods.md §18), replacing TRL's: the group-centred binary reward divided by the
    group's mean reward (its success rate), broadcast over tokens. Metrics: ``maxrl/frac_all_fail_groups`` (groups
    with mean reward 0, whose advantages are 0) and ``maxrl/max_advantage`` (the largest, (1 - p) / p for the hardest
    group that has a success). Per-token column ``group_mean``."""

    metrics = ("maxrl/frac_all_fail_groups", "maxrl/max_advantage")
    columns = {"group_mean": "the completion's group mean reward (its success rate), MaxRL's denominator, on every "
                             "token of the completion"}
    paper = StrategyPaper(
        "Maximum Likelihood Reinforcement Learning",
        "Tajwar, Zeng et al. 2026, Maximum Likelihood Reinforcement Learning.",
        "2602.02710",
    )

    def __init__(self, args):
        super().__init__(args)
        self._columns: dict[str, torch.Tensor] = {}

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        rewards = batch.rewards.double()
        check_binary_rewards("maxrl", rewards)
        advantages = maxrl_advantages(rewards, batch.group_ids)
        means = torch.stack([rewards[rows].mean() for rows in group_slices(batch.group_ids)])
        counts = torch.unique_consecutive(batch.group_ids, return_counts=True)[1]
        self._columns = {"group_mean": means.repeat_interleave(counts)[:, None].expand_as(batch.advantages)
                         .to(batch.advantages.dtype)}
        out = advantages[:, None].expand_as(batch.advantages).to(batch.advantages.dtype).clone()
        return out, {"maxrl/frac_all_fail_groups": float((means == 0).double().mean()),
                     "maxrl/max_advantage": float(advantages.max())}

    def token_columns(self) -> dict[str, torch.Tensor]:
        return self._columns
