"""Which tokens an advantage strategy boosts or damps, on a run's saved completions.

An advantage strategy replaces TRL's sequence advantage ``A[i]`` by token advantages ``A[i,t]`` (docs/methods.md,
Notation); what it does to a token is the factor ``f[i,t] = A[i,t] / A[i]``. This module rebuilds the generation
batches of a run from its saved completions (``completions_<step>.parquet``: one file per logged step, the last
generation batch's rows in TRL's order, so that a step's rows form consecutive groups of ``num_generations``),
recomputes TRL's sequence advantages from the saved rewards, runs the model on prompt + completion for the
temperature-scaled log-probabilities and last hidden states, and calls the configured advantage strategies in order
on one ``GenerationBatch`` per generation batch, as the trainer does. ``tokens.html`` shades every token by its
factor (``sharpgrpo.diagnostics.token_page.advantage_token_page``).

What differs from training, and why:

* the policy is the model given (``--model``): the factors equal the ones training used at step N when it is the
  model that sampled step N, i.e. the weights before step N (the initial model for step 1); the final model of a
  run gives the factors that model would assign to the same completions;
* correctness (THR's positive set, pass@k's c) comes from the saved rewards by the fallback rule of
  docs/methods.md §8, since the saved completions hold no dataset columns for the answer checks; for a reward that
  is its own answer check (``addition``, ``strict_letters``: 1 correct, 0 wrong) the two agree;
* completion text is re-tokenised (TRL saves text, not ids) and ends with EOS when it is shorter than
  ``max_completion_length`` (TRL's generation stopped there; the EOS token is in the loss and in THR's sums).
"""

from __future__ import annotations

import math
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sharpgrpo.evaluation.generation import encode_prompts

# Columns of a completions file that are neither a prompt, a completion nor a reward.
NON_REWARD_COLUMNS = ("step", "advantage")
# The training arguments that shape the generation batch and TRL's advantages besides the strategies' own.
BATCH_SETTINGS = (
    "temperature", "num_generations", "scale_rewards", "multi_objective_aggregation", "reward_weights",
    "max_completion_length", "mask_truncated_completions",
)  # fmt: skip

# What each advantage strategy's factor f = A[i,t] / A[i] is (docs/methods.md), shown on the page.
FACTOR_MEANINGS = {
    "thr": "1 + p where THR > tau, 1 - p where THR < -tau, 0 where |THR| <= tau (1 with thr_keep_below_threshold); "
    "groups without both correct and wrong completions keep 1 (docs/methods.md §3.4)",
    "nthr": "eta = 2 |0.5 - |P|/G| on tokens of wrong completions whose NTHR exceeds tau, else 1 "
    "(docs/methods.md §3.5)",
    "cw_grpo": "the Gaussian kernel weight of the token's covariance with the advantage, mean 1 over a group's "
    "tokens (docs/methods.md §2.1)",
    "ar": "alpha p_old + 1 - alpha, between 1 - alpha and 1 (docs/methods.md §1.6)",
    "passk_mixed": "q + (1 - q) A_passk / A_grpo with q = c / G, the same for every token of a completion; "
    "negative where the pass@K term flips the sign (docs/methods.md §4.1)",
}


def trl_sequence_advantages(
    rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int, scale_rewards: str = "group",
    multi_objective_aggregation: str = "sum_then_normalize",
) -> torch.Tensor:  # fmt: skip
    """(B, F) rewards (NaN where a function skipped a row) -> (B,) advantages, as TRL 1.16 computes them in
    ``GRPOTrainer._generate_and_score_completions`` (inline there, so restated here statement by statement; the
    saved ``advantage`` column checks it): both ``multi_objective_aggregation`` modes, ``scale_rewards`` group,
    batch or none, std + 1e-4, unscorable rows (every function NaN) get 0."""
    from trl.trainer.utils import nanstd

    weights = reward_weights.to(rewards_per_func.device, rewards_per_func.dtype).unsqueeze(0)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if multi_objective_aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
        if scale_rewards in ("group", "none"):
            if num_generations > 1:
                std = nanstd(rewards.view(-1, num_generations), dim=1).repeat_interleave(num_generations, dim=0)
            else:
                std = torch.zeros_like(rewards)
        elif scale_rewards == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:
            raise ValueError(f"scale_rewards must be 'batch', 'group' or 'none', got {scale_rewards!r}.")
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + 1e-4)
    elif multi_objective_aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.size(1))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        rewards = (((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.size(1)) * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + 1e-4)
    else:
        raise ValueError(
            f"multi_objective_aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got "
            f"{multi_objective_aggregation!r}."
        )
    return torch.nan_to_num(advantages, nan=0.0)


@dataclass
class LoggedBatch:
    """One generation batch of a run's saved completions: row indices into the rows read, in TRL's order (groups of
    ``num_generations`` consecutive rows), the reward column names and their (B, F) values."""

    step: Any
    rows: list[int]
    reward_names: list[str]
    rewards_per_func: torch.Tensor


def logged_batches(prompts: Sequence[Any], scores: Sequence[dict[str, Any]], num_generations: int) -> list[LoggedBatch]:
    """Group the rows of :func:`sharpgrpo.diagnostics.tokens.read_logged_rows` by their ``step`` into generation
    batches; every batch must hold whole groups (the G rows of a group share their prompt)."""
    by_step: dict[Any, list[int]] = {}
    for row, score in enumerate(scores):
        by_step.setdefault(score.get("step"), []).append(row)
    batches = []
    for step, rows in by_step.items():
        if len(rows) % num_generations:
            raise ValueError(
                f"step {step}: {len(rows)} saved completions are not whole groups of num_generations="
                f"{num_generations} (a cut with --max_rows keeps whole groups only)."
            )
        for start in range(0, len(rows), num_generations):
            group = rows[start : start + num_generations]
            if any(prompts[r] != prompts[group[0]] for r in group):
                raise ValueError(f"step {step}: rows {group[0]}-{group[-1]} are not one group (their prompts differ).")
        names = [k for k, v in scores[rows[0]].items() if k not in NON_REWARD_COLUMNS and _is_number(v)]
        values = [[math.nan if scores[r][n] is None else float(scores[r][n]) for n in names] for r in rows]
        batches.append(LoggedBatch(step, rows, names, torch.tensor(values, dtype=torch.float32).view(len(rows), -1)))
    return batches


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def completion_token_ids(tokenizer, completions: Sequence[str], max_completion_length: int | None) -> list[list[int]]:
    """Each completion re-tokenised, with EOS appended where it is shorter than ``max_completion_length`` (TRL's
    generation stopped at EOS there, and TRL's completion mask includes that EOS)."""
    eos = tokenizer.eos_token_id
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in completions]
    if eos is None or max_completion_length is None:
        return ids
    return [c + [eos] if len(c) < max_completion_length else c for c in ids]


@torch.no_grad()
def policy_inputs(
    model, tokenizer, prompts: Sequence[Any], completion_ids: Sequence[list[int]], temperature: float,
    batch_size: int = 8, apply_chat_template: bool = False, mask_truncated: bool = False,
    max_completion_length: int | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """TRL's batch layout (prompts left-padded, completions right-padded, mask up to and including the first EOS)
    with the last hidden states (B, T, H) predicting each completion token and their temperature-scaled
    log-probabilities (B, T), from one backbone forward (``sharpgrpo.training.policy_inputs``) and the LM head."""
    from sharpgrpo.training.generation_capture import logps_from_hidden_states
    from sharpgrpo.training.policy_inputs import completion_hidden_states

    device = next(model.parameters()).device
    prompt_ids = encode_prompts(tokenizer, prompts, apply_chat_template)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    p_width = max(len(p) for p in prompt_ids)
    c_width = max(1, max(len(c) for c in completion_ids))
    batch = {
        "prompt_ids": torch.tensor([[pad] * (p_width - len(p)) + p for p in prompt_ids], device=device),
        "prompt_mask": torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompt_ids], device=device),
        "completion_ids": torch.tensor([c + [pad] * (c_width - len(c)) for c in completion_ids], device=device),
    }
    eos = tokenizer.eos_token_id
    mask = []
    for c in completion_ids:
        length = c.index(eos) + 1 if eos in c else len(c)
        truncated = mask_truncated and eos not in c and max_completion_length is not None
        mask.append([0 if truncated else 1] * length + [0] * (c_width - length))
    batch["completion_mask"] = torch.tensor(mask, device=device)
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model  # under PEFT: the model with its adapter layers
    hidden = completion_hidden_states(lm, batch, batch_size)
    head = lm.get_output_embeddings()
    batch["hidden_states"] = hidden
    batch["logps"] = logps_from_hidden_states(hidden, batch["completion_ids"], head.weight,
                                              getattr(head, "bias", None), temperature, batch_size)
    return batch


def advantage_config(strategies: Sequence[str], saved: dict[str, Any] | None = None, **overrides):
    """A ``SharpGRPOConfig`` with ``strategies`` and, from a run's ``training_args.json`` (``saved``), every
    parameter those strategies read (their ``params``) and :data:`BATCH_SETTINGS`; ``overrides`` win."""
    from sharpgrpo.config import SharpGRPOConfig
    from sharpgrpo.strategies import STRATEGIES

    fields = set(BATCH_SETTINGS) | {p for name in strategies for p in STRATEGIES.get(name).params}
    fields -= {"max_completion_length"}  # read from `saved` directly; the config's own check needs a prompt length
    values = {k: v for k, v in (saved or {}).items() if k in fields and v is not None}
    generations = int({**values, **overrides}.get("num_generations", 8))
    kwargs = {"bf16": False, "report_to": [], "per_device_train_batch_size": generations, **values, **overrides}
    with tempfile.TemporaryDirectory() as output_dir:
        return SharpGRPOConfig(output_dir=output_dir, strategies=list(strategies), **kwargs)


def strategy_factors(
    strategies: Sequence[Any], names: Sequence[str], batch, checker=None
) -> tuple[torch.Tensor, list[dict[str, Any]]]:  # fmt: skip
    """Run the advantage strategies in order on ``batch`` (a ``GenerationBatch``) through the trainer's own
    ``run_advantage_strategies``, one strategy at a time so that each one's output and scores are kept.

    Returns the final (B, T) token advantages and, per strategy, ``{"name", "advantages" (B, T), "scores" (B, T) or
    None, "metrics"}``."""
    from collections import defaultdict
    from dataclasses import replace

    from sharpgrpo.training.advantage_pipeline import run_advantage_strategies
    from sharpgrpo.training.output_checks import StrategyOutputChecker
    checker = checker or StrategyOutputChecker({name: type(s) for name, s in zip(names, strategies, strict=True)})
    steps, advantages = [], batch.advantages
    for strategy, name in zip(strategies, names, strict=True):
        metrics, kept = defaultdict(list), {}
        advantages = run_advantage_strategies(
            [strategy], replace(batch, advantages=advantages), checker, metrics,
            lambda scores, _, kept=kept: kept.setdefault("scores", scores.detach().float().cpu()),
        )  # fmt: skip
        steps.append({"name": name, "advantages": advantages.detach().float().cpu(), "scores": kept.get("scores"),
                      "metrics": {k: v[-1] for k, v in metrics.items()}})
    return advantages, steps


def analyze_advantage_tokens(
    model, tokenizer, prompts: Sequence[Any], completions: Sequence[str], scores: Sequence[dict[str, Any]],
    strategies: Sequence[str], saved: dict[str, Any] | None = None, temperature: float | None = None,
    batch_size: int = 8, apply_chat_template: bool = False, weight_strategy: str | None = None,
    output: str | Path | None = None, **overrides,
) -> dict[str, Any]:  # fmt: skip
    """Factors of the advantage strategies ``strategies`` (in the run's order) on saved completions.

    Args:
        model, tokenizer: the policy (see the module docstring for which model reproduces training).
        prompts, completions, scores: rows of :func:`sharpgrpo.diagnostics.tokens.read_logged_rows` (whole groups).
        saved: the run's ``training_args.json`` (strategy parameters, temperature, num_generations, scale_rewards,
            reward_weights, max_completion_length); ``overrides`` and ``temperature`` win over it.
        weight_strategy: a token-weight strategy of the same run, shown as a second shade (the underline).
        output: folder for ``tokens.json``, ``tokens.md`` and ``tokens.html`` (nothing written when None).

    Returns ``{"strategies", "temperature", "settings", "batches": [...], "overall": {...}}``; every batch holds
    per completion the token ids, pieces, probabilities, sequence advantage ``A``, the factors (None where A = 0),
    each strategy's own factor and scores, and the weights of ``weight_strategy``."""
    from sharpgrpo.diagnostics.token_page import token_pieces, write_advantage_token_page
    from sharpgrpo.strategies import STRATEGIES, GenerationBatch
    from sharpgrpo.strategies.correctness import correct_completions, fallback_rule

    saved = dict(saved or {})
    if temperature is not None:
        overrides["temperature"] = temperature
    names = [n for n in strategies if STRATEGIES.get(n).kind == "advantage"]
    if not names:
        raise ValueError(f"{list(strategies)} holds no advantage strategy.")
    config = advantage_config([*names, *([weight_strategy] if weight_strategy else [])], saved, **overrides)
    objects = [STRATEGIES.get(n)(config) for n in names]
    weights_object = STRATEGIES.get(weight_strategy)(config) if weight_strategy else None
    G, T = config.num_generations, float(config.temperature)
    max_length = overrides.get("max_completion_length", saved.get("max_completion_length"))
    reward_weights = config.reward_weights
    results, rules = [], set()
    for logged in logged_batches(prompts, scores, G):
        rows = logged.rows
        weights = torch.ones(len(logged.reward_names)) if reward_weights is None else torch.tensor(reward_weights)
        if weights.numel() != len(logged.reward_names):
            raise ValueError(f"reward_weights {reward_weights} do not match the saved rewards {logged.reward_names}.")
        advantages = trl_sequence_advantages(logged.rewards_per_func, weights.float(), G, config.scale_rewards,
                                             config.multi_objective_aggregation)
        rewards = torch.nan_to_num((logged.rewards_per_func * weights).nansum(dim=1), nan=0.0)
        ids = completion_token_ids(tokenizer, [completions[r] for r in rows], max_length)
        inputs = policy_inputs(model, tokenizer, [prompts[r] for r in rows], ids, T, batch_size, apply_chat_template,
                               bool(getattr(config, "mask_truncated_completions", False)), max_length)
        mask = inputs["completion_mask"].float()
        group_ids = torch.arange(len(rows)) // G
        rules.add(fallback_rule(rewards))
        with warnings.catch_warnings():  # the rule is named on the page instead
            warnings.simplefilter("ignore", UserWarning)
            correct = correct_completions(None, rewards, advantages, group_ids)
        head = model.get_output_embeddings()
        batch = GenerationBatch(
            old_logps=inputs["logps"].float(), completion_mask=mask, completion_ids=inputs["completion_ids"],
            advantages=advantages.float().unsqueeze(1).expand_as(mask).clone().to(mask.device),
            rewards=rewards.float(), group_ids=group_ids, num_generations=G, hidden_states=inputs["hidden_states"],
            unembedding_weight=head.weight, unembedding_bias=getattr(head, "bias", None), temperature=T,
            correct=correct,
        )  # fmt: skip
        final, steps = strategy_factors(objects, names, batch)
        final = final.float().cpu()
        token_weights = None
        if weights_object is not None:
            token_weights = weights_object.weights(inputs["logps"].float(), mask).float().cpu()
        probs = inputs["logps"].exp().cpu()
        entries = []
        for index, row in enumerate(rows):
            length = len(ids[index])
            A = float(advantages[index])
            factors, own = None, []
            if A != 0.0:
                factors = (final[index, :length] / A).tolist()
                previous = torch.full((length,), A)
                for step in steps:
                    current = step["advantages"][index, :length]
                    ratio = torch.where(previous != 0, current / previous.where(previous != 0, torch.ones(())),
                                        torch.full_like(current, math.nan))
                    own.append({"name": step["name"], "factors": ratio.tolist(),
                                "scores": None if step["scores"] is None else step["scores"][index, :length].tolist()})
                    previous = current
            entries.append({
                "row": row, "prompt": prompts[row], "token_ids": ids[index][:length],
                "pieces": token_pieces(tokenizer, ids[index][:length]), "probs": probs[index, :length].tolist(),
                "advantage": A, "correct": bool(correct[index]), "factors": factors, "strategy_factors": own,
                "weights": None if token_weights is None else token_weights[index, :length].tolist(),
                "scores": dict(scores[row]),
            })  # fmt: skip
        results.append({"step": logged.step, "completions": entries,
                        "metrics": {s["name"]: s["metrics"] for s in steps}})
    settings = {"temperature": T, "num_generations": G, "scale_rewards": config.scale_rewards}
    for name in names:
        settings.update({p: getattr(config, p) for p in STRATEGIES.get(name).params if hasattr(config, p)})
    result = {"strategies": names, "weight_strategy": weight_strategy, "temperature": T, "settings": settings,
              "correct_rule": sorted(rules), "batches": results, "overall": factor_summary(results)}
    if output is not None:
        output = Path(output)
        output.mkdir(parents=True, exist_ok=True)
        import json

        (output / "tokens.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        (output / "tokens.md").write_text(factor_markdown(result))
        bounds = None if weights_object is None else tuple(weights_object.bounds())
        write_advantage_token_page(
            output / "tokens.html", [e for b in results for e in b["completions"]], names, settings,
            {n: FACTOR_MEANINGS.get(n, "") for n in names}, sorted(rules), weight_strategy, bounds,
        )  # fmt: skip
        result["files"] = [str(output / f) for f in ("tokens.json", "tokens.md", "tokens.html")]
    return result


def factor_summary(batches: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts over the tokens of completions with A != 0: tokens, mean factor, and the fractions boosted (f > 1),
    damped (0 < f < 1), zeroed (f = 0), sign-flipped (f < 0) and unchanged (f = 1, to 1e-6)."""
    factors = [f for b in batches for e in b["completions"] if e["factors"] is not None for f in e["factors"]]
    completions = [e for b in batches for e in b["completions"]]
    n = len(factors)
    share = (lambda test: sum(1 for f in factors if test(f)) / n) if n else (lambda test: 0.0)
    return {
        "completions": len(completions),
        "completions_zero_advantage": sum(1 for e in completions if e["factors"] is None),
        "tokens": n,
        "mean_factor": sum(factors) / n if n else math.nan,
        "frac_boosted": share(lambda f: f > 1 + 1e-6),
        "frac_damped": share(lambda f: 1e-12 < f < 1 - 1e-6),
        "frac_zero": share(lambda f: abs(f) <= 1e-12),
        "frac_negative": share(lambda f: f < -1e-12),
        "frac_unchanged": share(lambda f: abs(f - 1) <= 1e-6),
    }


def factor_markdown(result: dict[str, Any]) -> str:
    overall = result["overall"]
    text = (
        f"Token advantage factors A[i,t] / A[i] under `{' -> '.join(result['strategies'])}` (temperature "
        f"{result['temperature']:.3g}): {overall['completions']} completions, {overall['completions_zero_advantage']} "
        f"with A = 0 (no factor), {overall['tokens']} tokens of the others.\n\n"
        "| mean factor | boosted (f > 1) | damped (0 < f < 1) | zeroed (f = 0) | sign flipped (f < 0) | unchanged |\n"
        "|---|---|---|---|---|---|\n"
        f"| {overall['mean_factor']:.3f} | {overall['frac_boosted']:.3f} | {overall['frac_damped']:.3f} | "
        f"{overall['frac_zero']:.3f} | {overall['frac_negative']:.3f} | {overall['frac_unchanged']:.3f} |\n"
    )
    return text
