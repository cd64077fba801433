"""What the trainer's loss hook calls: the policy loss as one function (``policy_loss``) and its pieces (the
surrogates, the loss strategies' terms, the aggregation, the metrics), TRL's entropy bonus control, the sharpness
probe that calls the same function, and the forward's helpers (FSDP2's fused head, the loss's log-probability
temperature)."""
