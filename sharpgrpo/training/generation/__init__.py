"""What the trainer's generation hooks call: the advantage pipeline (whole groups gathered from every process, the
advantage strategies run once per generation batch), the policy's inputs (sampling log-probabilities, hidden states,
entropies, the unembedding) and the values read from the decoding steps, registered extra per-token inputs
(``inputs``), the rewards' cross-process agreement, vLLM seeds and the per-token score dump."""
