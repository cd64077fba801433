"""Advantage strategies on one generation batch: what TRL's generation hooks learned about it, the whole groups
gathered from every process, and the strategies run in the configured order.

TRL computes rewards and generates inside its own ``_generate_and_score_completions``; the trainer's overrides of
those inner steps record what the strategies need in one ``GenerationRecord`` per generation batch, which
``SharpGRPOTrainer._apply_advantage_strategies`` reads once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from sharpgrpo.strategies import AdvantageStrategy, GenerationBatch


@dataclass
class GenerationRecord:
    """What the trainer's hooks learn about one generation batch while TRL builds it.

    Attributes:
        inputs: the batch's input rows (prompts and dataset columns), for rollout functions that need per-row data.
        rewards_per_func: (B_global, F) rewards of every reward function, gathered over processes (TRL's layout).
        answer_verdicts: (B_local,) the reward functions' answer checks (`sharpgrpo.correctness`), or None.
        captured: the sampling log-probabilities (``logps``) and last hidden states (``hidden``) read from
            transformers' decoding steps (`sharpgrpo.generation_capture`), when a strategy needs them.
    """

    inputs: list[dict[str, Any]] | None = None
    rewards_per_func: torch.Tensor | None = None
    answer_verdicts: torch.Tensor | None = None
    captured: dict[str, torch.Tensor] = field(default_factory=dict)


def gather_rows(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Rows of every process in process order (padded to the longest completion along dim 1)."""
    if accelerator.num_processes == 1:
        return tensor
    if tensor.dim() > 1:
        tensor = accelerator.pad_across_processes(tensor, dim=1, pad_index=0)
    return accelerator.gather(tensor.contiguous())


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """(B, F) rewards -> (B,) weighted total, as TRL sums them (NaN from a function that skipped a row counts 0)."""
    weights = reward_weights.to(rewards_per_func.device)
    return torch.nan_to_num((rewards_per_func * weights.unsqueeze(0)).nansum(dim=1), nan=0.0)


def run_advantage_strategies(
    strategies: list[AdvantageStrategy], batch: GenerationBatch, checker, metrics, on_token_scores=None
) -> torch.Tensor:
    """Apply ``strategies`` in order, each to the previous one's token advantages; check each output
    (``checker.advantages``), append each strategy's metrics to ``metrics`` and hand the strategy's per-token scores
    (``AdvantageStrategy.token_scores``), if any, to ``on_token_scores(scores, token_advantages)``."""
    token_advantages = batch.advantages
    for strategy in strategies:
        result = strategy.token_advantages(replace(batch, advantages=token_advantages))
        checker.advantages(strategy, result, batch)
        token_advantages, strategy_metrics = result
        for name, value in strategy_metrics.items():
            metrics[name].append(float(value))
        scores = strategy.token_scores()
        if on_token_scores is not None and scores is not None:
            on_token_scores(scores, token_advantages)
    return token_advantages
