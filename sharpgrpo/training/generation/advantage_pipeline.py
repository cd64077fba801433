"""Advantage strategies on one generation batch: what TRL's generation hooks learned about it, the whole groups
gathered from every process, and the strategies run in the configured order.

TRL computes rewards and generates inside its own ``_generate_and_score_completions``; the trainer's overrides of
those inner steps record what the strategies need in one ``GenerationRecord`` per generation batch, which
``advantage_pipeline`` reads once (called by ``SharpGRPOTrainer._apply_advantage_strategies``): it reads the policy's
inputs the strategies need, gathers the whole groups into one ``GenerationBatch`` (``gathered_batch``), runs the
strategies (``run_advantage_strategies``) and returns an ``AdvantageResult``: this process's token advantages, the
strategies' metrics and each strategy's output and declared per-token columns (the telemetry's stages). The groups
were tagged before (``tag_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from sharpgrpo.strategies import AdvantageStrategy, GenerationBatch
from sharpgrpo.strategies.base import declared_columns
from sharpgrpo.strategies.correctness import answer_verdicts, correct_completions
from sharpgrpo.training.generation.capture import fit_width
from sharpgrpo.training.generation.inputs import loss_mask, provided_inputs
from sharpgrpo.training.telemetry.recorder import sequence_means


@dataclass
class GenerationRecord:
    """What the trainer's hooks learn about one generation batch while TRL builds it.

    Attributes:
        inputs: the batch's input rows (prompts and dataset columns), for rollout functions that need per-row data.
        rewards_per_func: (B_global, F) rewards of every reward function, gathered over processes (TRL's layout).
        answer_verdicts: (B_local,) the reward functions' answer checks (`sharpgrpo.strategies.correctness`), or None.
        captured: the sampling log-probabilities (``logps``), last hidden states (``hidden``) and entropies
            (``entropy``) read from
            transformers' decoding steps (`sharpgrpo.training.generation.capture`), when a strategy needs them.
        stages: (B_local, T) token advantages after each advantage strategy run at generation, then each one's
            declared per-token columns (``recorder.generation_stages``; this process's rows).
        logged_advantages: (each completion's mean token advantage after those strategies, TRL's sequence advantage),
            both (B_global,) in global order, for the completion tables (`sharpgrpo.training.telemetry.recorder`).
        step: the trainer's completed optimizer steps when the batch was generated (``GenerationBatch.step``).
    """

    inputs: list[dict[str, Any]] | None = None
    rewards_per_func: torch.Tensor | None = None
    answer_verdicts: torch.Tensor | None = None
    captured: dict[str, torch.Tensor] = field(default_factory=dict)
    stages: list[torch.Tensor] = field(default_factory=list)
    logged_advantages: tuple[torch.Tensor, torch.Tensor] | None = None
    step: int = 0


def row_verdicts(reward_funcs, inputs: list[dict[str, Any]], prompts, completions, completion_ids, trainer_state):
    """(B_local,) the reward functions' answer checks of this process's rows (`sharpgrpo.strategies.correctness`),
    given the rows' dataset columns as TRL passes them to reward functions."""
    columns = {key: [example[key] for example in inputs] for key in inputs[0]
               if key not in ("prompt", "completion", "completion_ids")}
    return answer_verdicts(reward_funcs, prompts, completions,
                           {**columns, "completion_ids": completion_ids, "trainer_state": trainer_state})


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
    strategies: list[AdvantageStrategy], batch: GenerationBatch, checker, on_token_scores=None,
) -> tuple[torch.Tensor, list[tuple[str, float]], list[torch.Tensor]]:
    """Apply ``strategies`` in order, each to the previous one's token advantages; check each output
    (``checker.advantages``) and hand the strategy's per-token scores (``AdvantageStrategy.token_scores``), if any,
    to ``on_token_scores(batch, scores, token_advantages)``. Returns (the last token advantages (B, T), each
    strategy's metrics as (name, value) in order, the telemetry's stages (B, T) each: every strategy's output
    (``advantage/<strategy>``), then every strategy's declared columns in its ``columns`` order
    (``<strategy>/<column>``; ``recorder.generation_stages``))."""
    token_advantages, metrics, stages, columns = batch.advantages, [], [], []
    for strategy in strategies:
        result = strategy.token_advantages(replace(batch, advantages=token_advantages))
        checker.advantages(strategy, result, batch)
        token_advantages, strategy_metrics = result
        stages.append(token_advantages)
        metrics.extend((name, float(value)) for name, value in strategy_metrics.items())
        scores = strategy.token_scores()
        if on_token_scores is not None and scores is not None:
            on_token_scores(batch, scores, token_advantages)
        name = strategy.registered_name()  # through the instance: a wrapper that delegates to a strategy works too
        values = declared_columns(name, strategy, strategy.token_columns(), complete=True)
        for column in strategy.columns:  # the telemetry's <strategy>/<column> (recorder.generation_stages)
            if tuple(values[column].shape) != tuple(token_advantages.shape):
                raise ValueError(f"Strategy {name}'s per-token column {column!r} has shape "
                                 f"{tuple(values[column].shape)}; expected {tuple(token_advantages.shape)} (B, T).")
            columns.append(values[column].to(token_advantages.device))
    return token_advantages, metrics, stages + columns


@dataclass(frozen=True)
class AdvantageResult:
    """What the advantage strategies made of one generation batch.

    Attributes:
        advantages: (B_local, T_local) token advantages of this process's rows.
        metrics: the strategies' metrics, (name, value) in order.
        stages: (B_local, T_local) token advantages after each strategy, then each one's declared columns
            (``recorder.generation_stages``; this process's rows).
        logged_advantages: (each completion's mean token advantage, TRL's sequence advantage), both (B_global,),
            for the completion tables (`sharpgrpo.training.telemetry`).
    """

    advantages: torch.Tensor
    metrics: list[tuple[str, float]]
    stages: list[torch.Tensor]
    logged_advantages: tuple[torch.Tensor, torch.Tensor]


@torch.no_grad()
def advantage_pipeline(accelerator, output: dict[str, Any], record: GenerationRecord, strategies, needs, policy,
                       checker, reward_weights: torch.Tensor, num_generations: int, temperature: float,
                       input_providers: dict | None = None, on_token_scores=None) -> AdvantageResult:
    """Run ``strategies`` (those run at generation; ``needs`` their ``GenerationNeeds``) on the whole groups of
    every process. ``policy``: the ``Policy`` the strategies' inputs are read from; ``input_providers``: the
    registered generation inputs the strategies need (`sharpgrpo.training.generation.inputs`)."""
    if "pixel_values" in output:
        raise ValueError("Advantage strategies do not support multimodal inputs.")
    if output["advantages"].dim() != 1:
        raise ValueError("Advantage strategies expect TRL's sequence advantages of shape (B,).")
    captured, record.captured = record.captured, {}  # this batch's decoding-step values are read once
    local_rows, local_length = output["completion_ids"].shape
    captured = {k: fit_width(v, local_length) for k, v in captured.items() if v.shape[0] == local_rows}
    old_logps, hidden_states, entropies = policy.strategy_inputs(output, captured, needs.hidden_states,
                                                                 needs.old_logps, needs.entropies)
    extras = provided_inputs(input_providers or {}, output)
    with policy.unembedding(hidden_states is not None) as unembedding:
        batch = gathered_batch(accelerator, output, record, reward_weights, old_logps=old_logps,
                               hidden_states=hidden_states, unembedding=unembedding,
                               num_generations=num_generations, temperature=temperature,
                               needs_correctness=needs.correctness, entropies=entropies, extras=extras)
        token_advantages, metrics, stages = run_advantage_strategies(strategies, batch, checker, on_token_scores)
    start = accelerator.process_index * local_rows
    rows = slice(start, start + local_rows)
    return AdvantageResult(
        advantages=token_advantages[rows, :local_length].contiguous(),
        metrics=metrics,
        stages=[stage[rows, :local_length] for stage in stages],
        logged_advantages=(sequence_means(token_advantages, batch.completion_mask), batch.advantages[:, 0]),
    )


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


def gathered_batch(accelerator, output: dict[str, Any], record: GenerationRecord, reward_weights: torch.Tensor, *,
                   old_logps: torch.Tensor | None, hidden_states: torch.Tensor | None, unembedding: tuple,
                   num_generations: int, temperature: float, needs_correctness: bool,
                   entropies: torch.Tensor | None = None, extras: dict[str, torch.Tensor] | None = None
                   ) -> GenerationBatch:
    """The whole groups of every process as one ``GenerationBatch`` (rows in global order). Tool results and
    retrieved text (``tool_mask``) are masked out of every strategy statistic; ``correct`` comes from the answer
    checks' verdicts (`sharpgrpo.strategies.correctness`) when a strategy needs it."""
    def gather(tensor):
        return gather_rows(accelerator, tensor)

    mask, group_ids, advantages = gather(loss_mask(output)), gather(output["group_ids"]), gather(output["advantages"])
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
        extras={name: gather(value) for name, value in (extras or {}).items()},
        step=record.step,
    )
