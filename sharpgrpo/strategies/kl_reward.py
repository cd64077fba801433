"""KL in the reward (verl's ``algorithm.use_kl_in_reward``; docs/methods.md §15.7).

Each completion's reward is charged its KL from the reference policy before the group normalisation:

    r'_i = r_i - beta_r sum_t KL_t,    KL_t = kl_estimate(log pi_old(y_t), log pi_ref(y_t))

with ``beta_r`` = ``kl_in_reward_coef`` and the estimator ``kl_in_reward_estimator`` (default ``k1``, verl's
``algorithm.kl_penalty: kl``), summed over the completion's loss tokens; then GRPO's advantage of r' as TRL computes
it (``(r' - mean_g r') / (std_g r' + 1e-4)``, or per TRL's ``scale_rewards``: ``batch`` divides by the batch's
standard deviation, ``none`` by nothing), broadcast over the completion's tokens. This is verl's ``apply_kl_penalty``
(``verl/trainer/ppo/ray_trainer.py``: ``token_level_rewards = token_level_scores - beta * kld``, ``kld =
kl_penalty(old_log_probs, ref_log_prob) * response_mask``, fixed ``kl_ctrl``) followed by its GRPO outcome advantage
(``core_algos.compute_grpo_outcome_advantage``, which sums the token-level rewards). The KL term in TRL's loss
(``beta``) is independent of it: set ``beta: 0`` for KL in the reward only (verl's ``use_kl_loss: false``), as the
reference log-probabilities come from the generation input ``reference_logps`` (TRL's reference model where it loaded
one, a LoRA run's frozen base, else the initial checkpoint loaded again and frozen).
"""

from __future__ import annotations

import torch

from sharpgrpo.strategies.base import GenerationBatch, StrategyPaper, group_slices, register_strategy
from sharpgrpo.strategies.baselines import RewardBaseline, scale_by_return_std
from sharpgrpo.strategies.kl_estimators import kl_estimate

def kl_charged_rewards(rewards: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor,
                       coef: float, estimator: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(r - coef * sum_t KL_t over the mask, the per-token KL on the mask). rewards (B,), logps (B, T), mask (B, T)."""
    kl = kl_estimate(old_logps, ref_logps, estimator) * mask
    return rewards - coef * kl.sum(dim=1), kl


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, scale: str) -> torch.Tensor:
    """TRL 1.16's GRPO advantage of ``rewards`` (B,): minus the group mean, divided by the group's (``group``) or the
    batch's (``batch``) unbiased standard deviation plus 1e-4, or not divided (``none``)."""
    centred = torch.empty_like(rewards)
    for rows in group_slices(group_ids):
        centred[rows] = rewards[rows] - rewards[rows].mean()
    return scale_by_return_std(centred, rewards, group_ids, scale)


@register_strategy("kl_in_reward")
class KLInRewardStrategy(RewardBaseline):
    """The reward charged its KL from the reference, then GRPO's advantage (docs/methods.md §15.7). Metrics:
    ``kl_in_reward/kl_sum_mean`` (mean over completions of sum_t KL_t) and ``kl_in_reward/reward_mean`` (mean r')."""

    params = ("kl_in_reward_coef", "kl_in_reward_estimator")
    needs_old_logps = True
    needs_inputs = ("reference_logps",)
    metrics = ("kl_in_reward/kl_sum_mean", "kl_in_reward/reward_mean")
    paper = StrategyPaper(
        "HybridFlow: A Flexible and Efficient RLHF Framework",
        "Sheng et al. 2024, HybridFlow: A Flexible and Efficient RLHF Framework (verl), KL in the reward.",
        "2409.19256",
    )

    @classmethod
    def inert(cls, args) -> str | None:
        if float(args.kl_in_reward_coef) == 0.0:
            return "kl_in_reward_coef=0: the reward is charged no KL, and the advantage is TRL's own"
        return None

    def token_advantages(self, batch: GenerationBatch) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch.completion_mask.double()
        ref_logps = batch.extras["reference_logps"].double().masked_fill(mask == 0, 0.0)
        old_logps = batch.old_logps.double().masked_fill(mask == 0, 0.0)
        charged, kl = kl_charged_rewards(batch.rewards.double(), old_logps, ref_logps, mask,
                                         float(self.args.kl_in_reward_coef), str(self.args.kl_in_reward_estimator))
        advantages = grpo_advantages(charged, batch.group_ids, str(self.args.scale_rewards))
        out = advantages[:, None].expand_as(batch.advantages).to(batch.advantages.dtype).clone()
        return out, {"kl_in_reward/kl_sum_mean": float(kl.sum(dim=1).mean()),
                     "kl_in_reward/reward_mean": float(charged.mean())}
