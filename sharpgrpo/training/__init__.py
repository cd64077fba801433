"""What the trainer's hooks call: the advantage pipeline (groups gathered from every process, the strategies run
once per generation batch), the policy's inputs (sampling log-probabilities, hidden states, the unembedding), the
loss's pure functions and metrics, TRL's entropy bonus, vLLM seeds, strategy state in checkpoints, the model card,
and the checks of what strategies and reward functions return."""
