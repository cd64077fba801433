"""The loss types of TRL 1.16's ``GRPOTrainer`` that sharpgrpo supports, by family: one home for the trainer's losses
(``sharpgrpo.training.loss.surrogates``), the config's checks and the strategies that declare which loss types they compose
with (``TokenLossStrategy.loss_types``)."""

# Loss types whose surrogate is PPO's clipped objective (they differ only in how tokens are aggregated).
PPO_CLIP_LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "luspo")
LOSS_TYPES = PPO_CLIP_LOSS_TYPES + ("cispo", "sapo", "vespo")
# Loss types whose surrogate has a per-token importance ratio for `weight_placement='ratio'` to scale.
RATIO_PLACEMENT_LOSS_TYPES = PPO_CLIP_LOSS_TYPES + ("cispo", "sapo")
