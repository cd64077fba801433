"""Advantage strategies on one generation batch: what TRL's generation hooks learned about it, the whole groups
gathered from every process, and the strategies run in the configured order.

TRL computes rewards and generates inside its own ``_generate_and_score_completions``; the trainer's overrides of
those inner steps record what the strategies need in one ``GenerationRecord`` per generation batch, which
``SharpGRPOTrainer._apply_advantage_strategies`` reads once: it tags the groups (``tag_groups``), gathers the whole
groups into one ``GenerationBatch`` (``gathered_batch``) and runs the strategies (``run_advantage_strategies``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from sharpgrpo.strategies import AdvantageStrategy, GenerationBatch
from sharpgrpo.strategies.correctness import correct_completions


@dataclass
class GenerationRecord:
    """What the trainer's hooks learn about one generation batch while TRL builds it.

    Attributes:
        inputs: the batch's input rows (prompts and dataset columns), for rollout functions that need per-row data.
        rewards_per_func: (B_global, F) rewards of every reward function, gathered over processes (TRL's layout).
        answer_verdicts: (B_local,) the reward functions' answer checks (`sharpgrpo.strategies.correctness`), or None.
        captured: the sampling log-probabilities (``logps``), last hidden states (``hidden``) and entropies
            (``entropy``) read from
            transformers' decoding steps (`sharpgrpo.training.generation_capture`), when a strategy needs them.
        stages: (B_local, T) token advantages after each advantage strategy run at generation (this process's rows).
        logged_advantages: (each completion's mean token advantage after those strategies, TRL's sequence advantage),
            both (B_global,) in global order, for the completion tables (`sharpgrpo.training.telemetry`).
    """

    inputs: list[dict[str, Any]] | None = None
    rewards_per_func: torch.Tensor | None = None
    answer_verdicts: torch.Tensor | None = None
    captured: dict[str, torch.Tensor] = field(default_factory=dict)
    stages: list[torch.Tensor] = field(default_factory=list)
    logged_advantages: tuple[torch.Tensor, torch.Tensor] | None = None


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
    strategies: list[AdvantageStrategy], batch: GenerationBatch, checker, metrics, on_token_scores=None,
    stages: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Apply ``strategies`` in order, each to the previous one's token advantages; check each output
    (``checker.advantages``), append each strategy's metrics to ``metrics`` and hand the strategy's per-token scores
    (``AdvantageStrategy.token_scores``), if any, to ``on_token_scores(scores, token_advantages)``. Each strategy's
    output (B, T) is appended to ``stages`` when given (the per-token telemetry's ``advantage/<strategy>``)."""
    token_advantages = batch.advantages
    for strategy in strategies:
        result = strategy.token_advantages(replace(batch, advantages=token_advantages))
        checker.advantages(strategy, result, batch)
        token_advantages, strategy_metrics = result
        if stages is not None:
            stages.append(token_advantages)
        for name, value in strategy_metrics.items():
            metrics[name].append(float(value))
        scores = strategy.token_scores()
        if on_token_scores is not None and scores is not None:
            on_token_scores(scores, token_advantages)
    return token_advantages


def tag_groups(output: dict[str, Any], process_index: int, num_processes: int, num_generations: int,
               generation_index: int) -> dict[str, Any]:
    """``output`` plus ``group_ids`` (unique over the run) and ``group_index`` (position in the group) per row.

    TRL orders the generation batch globally by process, then by local row, and normalises rewards over consecutive
    blocks of ``num_generations`` rows: that block is the group. The tags survive TRL's shuffling and splitting."""
    local_rows = output["completion_ids"].size(0)
    global_rows = torch.arange(local_rows, device=output["completion_ids"].device) + process_index * local_rows
    groups_per_batch = local_rows * num_processes // num_generations
    return {
        **output,
        "group_ids": global_rows // num_generations + generation_index * groups_per_batch,
        "group_index": global_rows % num_generations,
    }


def split_folded(strategies: list[AdvantageStrategy], trl_computes_old_logps: bool):
    """``(strategies run at generation, the one folded into the loss or None)``: the last strategy is applied in the
    loss instead when it ``folds_into_loss`` and training is on-policy (TRL computes no old log-probabilities)."""
    last = strategies[-1] if strategies else None
    if last is not None and last.folds_into_loss and not trl_computes_old_logps:
        return strategies[:-1], last
    return list(strategies), None


def gathered_batch(accelerator, output: dict[str, Any], record: GenerationRecord, reward_weights: torch.Tensor, *,
                   old_logps: torch.Tensor | None, hidden_states: torch.Tensor | None, unembedding: tuple,
                   num_generations: int, temperature: float, needs_correctness: bool,
                   entropies: torch.Tensor | None = None) -> GenerationBatch:
    """The whole groups of every process as one ``GenerationBatch`` (rows in global order). Tool results and
    retrieved text (``tool_mask``) are masked out of every strategy statistic; ``correct`` comes from the answer
    checks' verdicts (`sharpgrpo.strategies.correctness`) when a strategy needs it."""
    def gather(tensor):
        return gather_rows(accelerator, tensor)

    mask = output["completion_mask"]
    if output.get("tool_mask") is not None:
        mask = mask * output["tool_mask"]
    mask, group_ids, advantages = gather(mask), gather(output["group_ids"]), gather(output["advantages"])
    rewards = total_rewards(record.rewards_per_func, reward_weights).to(mask.device)
    correct = None
    if needs_correctness:
        verdicts = None if record.answer_verdicts is None else gather(record.answer_verdicts.to(mask.device))
        correct = correct_completions(verdicts, rewards, advantages.float(), group_ids)
    return GenerationBatch(
        old_logps=None if old_logps is None else gather(old_logps.float()),
        completion_mask=mask,
        completion_ids=gather(output["completion_ids"]),
        advantages=advantages.float().unsqueeze(1).expand_as(mask).clone(),
        rewards=rewards.float(),
        group_ids=group_ids,
        num_generations=num_generations,
        hidden_states=None if hidden_states is None else gather(hidden_states),
        unembedding_weight=unembedding[0],
        unembedding_bias=unembedding[1],
        temperature=temperature,
        correct=correct,
        entropies=None if entropies is None else gather(entropies.float()),
    )
