"""Per-token telemetry: the very tensors the loss used, for every completion token, exported as one parquet file per
telemetry step (``token_telemetry: true``; ``output_dir/telemetry/telemetry_<step>.parquet``).

Capture, not recomputation. The trainer hands the recorder, detached, what it computed:

* at generation (``SharpGRPOTrainer._generate_and_score_completions``): TRL's sequence advantage, the rewards of every
  reward function, the token advantages after each advantage strategy and the per-token columns each declares
  (``run_advantage_strategies``' stages: a teacher's log-probability, ...), the row's global index and its prompt.
  They travel with the rows as ``telemetry_*`` tensors through TRL's shuffling and splitting (``attach_generation``);
* in the loss (``SharpGRPOTrainer._compute_loss``), on a telemetry step: the policy loss's result
  (``sharpgrpo.training.loss.policy_loss.PolicyLossResult``): the log-probabilities, the ratio, the weights, the
  advantages, the KL term, the loss strategies' terms and the per-token loss of each micro-batch
  (``TelemetryRecorder.capture``);
* at the step's end (``TelemetryCallback``): every process's rows gathered, sorted into global order
  (group, completion, position) and written by the main process (``TelemetryRecorder.flush``).

Only (B, T) tensors of the micro-batch are kept, on the CPU, and only on telemetry steps; nothing of vocabulary size.
The columns, their meaning and the file's metadata are ``COLUMNS`` and ``file_metadata`` (docs/telemetry.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from sharpgrpo.strategies import STRATEGIES, LossTerms
from sharpgrpo.strategies.loss_types import PPO_CLIP_LOSS_TYPES

SCHEMA_VERSION = 1
METADATA_KEY = "sharpgrpo.telemetry"
FOLDER = "telemetry"
ROW_KEYS = ("telemetry_row", "telemetry_trl_advantage", "telemetry_rewards", "telemetry_stages")
# Per-token (B, T) inputs the loss's routing replay leaves in a micro-batch (sharpgrpo.training.generation.routing_replay).
AGREEMENT_KEY, UNREPLAYED_KEY = "telemetry_routing_agreement", "telemetry_logp_without_replay"

# Every fixed column: name -> what it holds. Columns per strategy or reward function follow the patterns at the end.
COLUMNS: dict[str, str] = {
    "step": "optimizer step whose loss used the row (1-based, as logged)",
    "micro_batch": "index of the micro-batch within the step (gradient accumulation), on its process",
    "process": "process that computed the row's loss",
    "row": "completion's index in the generation batch, global order over processes",
    "prompt_index": "prompt's index in the generation batch (row // num_generations)",
    "completion_index": "completion's index within its group (row % num_generations)",
    "group_id": "group (prompt) id, unique over the run",
    "position": "token position t in the completion (0-based)",
    "token_id": "sampled token id",
    "token": "the token's decoded piece (tokenizer.decode([token_id]))",
    "prompt": "the prompt (chat messages as JSON)",
    "mask": "loss mask: 1 when the token enters the loss (completion mask times tool mask)",
    "old_logp": "log-p of the token under the policy in the ratio's denominator (the loss's own detached log-p "
    "on-policy)",
    "sampling_logp": "log-p under the sampling engine (vLLM's when TRL reads it), else old_logp",
    "logp": "log-p of the token under the policy being trained (temperature-scaled, as in the loss)",
    "ratio": "importance ratio exp(logp - old_logp) at TRL's importance_sampling_level (unweighted)",
    "surrogate_ratio": "the ratio the surrogate saw: w * ratio under weight_placement=ratio, else ratio",
    "clip_low": "the low clip bound is active: surrogate_ratio < 1 - epsilon_low and A < 0 (PPO-clip loss types)",
    "clip_high": "the high clip bound is active: surrogate_ratio > 1 + epsilon_high and A > 0 (PPO-clip loss types; "
    "cispo: ratio > epsilon_high and A > 0)",
    "is_weight": "vLLM importance-sampling weight multiplying the token's loss (null without vLLM correction)",
    "entropy": "entropy of the policy's token distribution at the position",
    "entropy_mask": "1 when TRL's top-entropy mask keeps the token (all 1 without top_entropy_quantile < 1)",
    "off_policy_mask": "TRL's off-policy mask (null without off_policy_mask_threshold)",
    "weight": "product of the weight strategies' weights w (1 without a weight strategy)",
    "advantage_trl": "TRL's group-normalised sequence advantage A[i] (before any advantage strategy)",
    "advantage": "the token advantage A[i,t] the loss used",
    "kl": "the per-token KL term as it entered the loss before beta (weighted per kl_weighting; null at beta=0)",
    "token_loss": "per-token loss before aggregation (surrogate, masks, IS weight, plus beta * kl)",
    "loss_share": "the aggregation's factor over the number of processes: a micro-batch's loss on its process is "
    "num_processes * sum(token_loss * loss_share)",
    "loss_contribution": "token_loss * loss_share: the token's share of the step's logged loss (the mean over "
    "processes; entropy bonus and aux loss excluded)",
    "reward": "the completion's total (weighted) reward",
    "policy_version": "async_generation: the weights' version the row was generated with (the trainer's global_step "
    "when they were published)",
    "routing/agreement": "routing_replay: the fraction of MoE layers whose own top-k experts in the loss's forward "
    "(the live router, before replay) are the ones recorded at sampling (null where the token had no recorded route)",
    "routing/logp_without_replay": "routing_replay: log-p of the token in the same forward with every router's own "
    "choice (no replay); logp minus it is what replay changed",
    "versions_behind": "async_generation: how many versions the row's weights lag the step that trained on it "
    "(step - 1 - policy_version; 0 on-policy, at most max_staleness)",
}
PATTERN_COLUMNS = {
    "weight/<strategy>": "the weight of each configured weight strategy",
    "advantage/<strategy>": "the token advantage after each advantage strategy, in the configured order",
    "reward/<function>": "the completion's reward from each reward function (null where it skipped the row)",
    **{f"<loss strategy>/{term}": text for term, text in LossTerms.TERMS.items()},
    "<strategy>/<column>": "a per-token diagnostic the strategy declares in its `columns` (described there: a "
    "rollout correction's is_weight, rejected, mismatch_k1, mismatch_k3; a distillation teacher's teacher_logp and "
    "distillation term)",
}
# Columns every telemetry file has (the reader refuses a file without them).
REQUIRED = ("step", "row", "prompt_index", "completion_index", "group_id", "position", "token_id", "token", "mask",
            "logp", "ratio", "weight", "advantage", "token_loss", "loss_contribution")


class TelemetryError(RuntimeError):
    """The telemetry folder cannot be written (permissions, full disk): one line naming it and the config field."""

    names_itself = True


def telemetry_interval(args) -> int:
    """Steps between telemetry files: ``telemetry_steps``, or the logging interval when 0 (1 for a fractional one)."""
    if args.telemetry_steps:
        return int(args.telemetry_steps)
    steps = args.logging_steps
    return int(steps) if steps >= 1 else 1


def is_telemetry_step(step: int, args) -> bool:
    """Whether optimizer step ``step`` (1-based) writes a file: every interval, and step 1 with logging_first_step."""
    return step % telemetry_interval(args) == 0 or (step == 1 and bool(args.logging_first_step))


def sequence_means(token_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-completion mean of (B, T) values over ``mask`` (B, T) -> (B,); a (B, 1) input is returned as (B,)."""
    if token_values.shape[1] == 1:
        return token_values[:, 0]
    mask = mask.to(token_values.dtype)
    return (token_values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def attach_generation(output: dict[str, Any], *, process_index: int, rewards_per_func: torch.Tensor | None,
                      trl_advantages: torch.Tensor, stages: Sequence[torch.Tensor]) -> dict[str, Any]:
    """``output`` plus the rows' generation-time telemetry, as tensors with a leading row dimension so that they
    follow the rows through TRL's shuffling and splitting: ``telemetry_row`` (B,) the global row index,
    ``telemetry_trl_advantage`` (B,) TRL's sequence advantage, ``telemetry_rewards`` (B, F) (``rewards_per_func`` is
    TRL's gathered (B_global, F)), ``telemetry_stages`` (B, S, T) the token advantage after each advantage strategy,
    then each strategy's declared per-token columns (local rows of each stage; names: ``generation_stages``)."""
    ids = output["completion_ids"]
    rows, length = ids.shape
    start = process_index * rows
    extra = {
        "telemetry_row": torch.arange(start, start + rows, device=ids.device),
        "telemetry_trl_advantage": trl_advantages.detach().float().reshape(rows),
    }
    if rewards_per_func is not None:
        extra["telemetry_rewards"] = rewards_per_func[start : start + rows].detach().float().to(ids.device)
    if stages:
        extra["telemetry_stages"] = torch.stack([s.detach().float() for s in stages], dim=1)[..., :length]
    return {**output, **extra}


def generation_stages(names: Sequence[str], classes: dict[str, type]) -> list[str]:
    """The telemetry column of each stage ``run_advantage_strategies`` returns for the advantage strategies ``names``
    run at generation (configured names, in order): ``advantage/<name>`` of each, then ``<name>/<column>`` of each
    column its class declares (``Strategy.columns``, in declared order)."""
    return [f"advantage/{name}" for name in names] + [
        f"{name}/{column}" for name in names for column in getattr(classes[name], "columns", {})]


def _numpy(tensor: torch.Tensor, shape: tuple[int, int]) -> np.ndarray:
    return tensor.detach().float().expand(shape).cpu().numpy()


def clip_flags(loss_type: str, surrogate_ratio: torch.Tensor, advantages: torch.Tensor, epsilon_low: float,
               epsilon_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) bools where the clip bound is active, TRL 1.16's definitions (``clip_ratio/*``,
    ``cispo_clip_ratio``) on the ratio the surrogate saw; all False for surrogates without a clip."""
    r, a = surrogate_ratio.detach(), advantages.detach()
    none = torch.zeros(torch.broadcast_shapes(r.shape, a.shape), dtype=torch.bool, device=r.device)
    if loss_type in PPO_CLIP_LOSS_TYPES:
        return (r < 1 - epsilon_low) & (a < 0), (r > 1 + epsilon_high) & (a > 0)
    if loss_type == "cispo":
        return none, (r > epsilon_high) & (a > 0)
    return none, none


class TelemetryRecorder:
    """Collects one telemetry step's rows on each process and writes them as one file (the main process)."""

    def __init__(self, args, accelerator, tokenizer, *, reward_names: Sequence[str], weight_names: Sequence[str],
                 stage_names: Sequence[str], folded_name: str | None, num_generations: int):
        self.args, self.accelerator, self.tokenizer = args, accelerator, tokenizer
        self.reward_names, self.weight_names = list(reward_names), list(weight_names)
        self.stage_names, self.folded_name = list(stage_names), folded_name  # stage_names: generation_stages
        self.num_generations = num_generations
        self.folder = Path(args.output_dir) / FOLDER
        self.prompts: dict[int, str] = {}  # this process's rows of the current generation batch: global row -> prompt
        self.versions: dict[int, int] = {}  # the same rows' weight versions (async_generation), else empty
        self.chunks: list[dict[str, np.ndarray]] = []
        self._pieces: dict[int, str] = {}
        self._micro_batch, self._step = 0, None
        self.sampling_logps = False  # whether the sampling engine reported log-probabilities (file metadata)
        self.last_summary: dict[str, float] = {}  # the last file's step_summary (main process)

    # --- generation ----------------------------------------------------------------------------------------------
    def remember_prompts(self, inputs: Sequence[dict[str, Any]], process_index: int) -> None:
        """The prompts of this process's rows (TRL's ``inputs``: one row per completion, in local order)."""
        start = process_index * len(inputs)
        self.prompts = {start + i: _prompt_text(row.get("prompt")) for i, row in enumerate(inputs)}
        self.versions = {start + i: int(row["policy_version"]) for i, row in enumerate(inputs)
                         if row.get("policy_version") is not None}  # the rollout process's, merged in by TRL

    # --- loss ----------------------------------------------------------------------------------------------------
    def capture(self, step: int, inputs: dict[str, Any], result) -> None:
        """Keep one micro-batch's loss tensors (detached, on the CPU) when ``step`` is a telemetry step.

        ``result``: the micro-batch's ``PolicyLossResult`` (``sharpgrpo.training.loss.policy_loss``): its
        ``tensors`` give the columns of ``COLUMNS`` (a field that is None was not used by this loss), each loss
        strategy's per-token terms the ``<strategy>/<term>`` columns, and ``loss_shares`` every token's share of
        the loss. ``inputs`` carries the rows' ``telemetry_*`` tensors and ids."""
        if not is_telemetry_step(step, self.args) or "telemetry_row" not in inputs:
            return
        if self._step != step:  # a new telemetry step: what an earlier step left (it wrote its file) goes
            self.chunks, self._micro_batch, self._step = [], 0, step
        tensors = result.tensors
        mask = tensors.mask
        shape = tuple(mask.shape)
        keep = inputs["completion_mask"].detach().bool().cpu().numpy()  # real completion tokens, no padding
        b_index, t_index = np.nonzero(keep)

        def column(value, fill=np.nan):
            if value is None:
                return np.full(len(b_index), fill, dtype=np.float32)
            return _numpy(value, shape)[b_index, t_index]

        advantages = tensors.advantage
        low, high = clip_flags(result.loss_type, tensors.surrogate_ratio, advantages, tensors.epsilon_low,
                               tensors.epsilon_high)
        shares = result.loss_shares() / self.accelerator.num_processes  # the logged loss: the processes' mean
        token_loss = tensors.token_loss
        self.sampling_logps = tensors.sampling_logp is not None
        rows = inputs["telemetry_row"].cpu().numpy()
        chunk = {
            "step": np.full(len(b_index), step, dtype=np.int64),
            "micro_batch": np.full(len(b_index), self._micro_batch, dtype=np.int32),
            "process": np.full(len(b_index), self.accelerator.process_index, dtype=np.int32),
            "row": rows[b_index].astype(np.int64),
            "group_id": inputs["group_ids"].cpu().numpy()[b_index].astype(np.int64),
            "position": t_index.astype(np.int32),
            "token_id": inputs["completion_ids"].cpu().numpy()[b_index, t_index].astype(np.int64),
            "mask": column(mask).astype(np.int8),
            "old_logp": column(tensors.old_logp),
            "sampling_logp": column(tensors.old_logp if tensors.sampling_logp is None else tensors.sampling_logp),
            "logp": column(tensors.logp),
            "ratio": column(tensors.ratio),
            "surrogate_ratio": column(tensors.surrogate_ratio),
            "clip_low": _numpy(low, shape)[b_index, t_index].astype(bool),
            "clip_high": _numpy(high, shape)[b_index, t_index].astype(bool),
            "is_weight": column(tensors.is_weight),
            "entropy": column(tensors.entropy),
            "entropy_mask": column(tensors.entropy_mask, fill=1.0).astype(np.int8),
            "off_policy_mask": column(tensors.off_policy_mask),
            "weight": column(tensors.weight, fill=1.0),
            "advantage_trl": inputs["telemetry_trl_advantage"].cpu().numpy()[b_index],
            "advantage": column(advantages),
            "kl": column(tensors.kl),
            "token_loss": column(token_loss),
            "loss_share": column(shares),
            "loss_contribution": column(token_loss.detach() * shares),
        }
        for name in self.weight_names:  # one weight strategy at most today: its weight is the product
            chunk[f"weight/{name}"] = chunk["weight"]
        stages = inputs.get("telemetry_stages")
        for s, name in enumerate(self.stage_names):  # each strategy's output, then its declared columns
            chunk[name] = _numpy(stages[:, s], shape)[b_index, t_index]
        if self.folded_name is not None:
            chunk[f"advantage/{self.folded_name}"] = chunk["advantage"]
        rewards = inputs.get("telemetry_rewards")
        if rewards is not None:
            values = rewards.cpu().numpy()[b_index]
            for f, name in enumerate(self.reward_names):
                chunk[f"reward/{name}"] = values[:, f]
            weights = np.asarray(self.args.reward_weights or [1.0] * len(self.reward_names), dtype=np.float64)
            chunk["reward"] = np.nansum(values * weights, axis=1).astype(np.float32)
        agreement = inputs.get(AGREEMENT_KEY)
        if agreement is not None:  # routing_replay: set by the loss forward's replay (training.generation)
            chunk["routing/agreement"] = column(agreement)
        if inputs.get(UNREPLAYED_KEY) is not None:
            chunk["routing/logp_without_replay"] = column(inputs[UNREPLAYED_KEY])
        for name, value in tensors.strategy_terms.items():  # each loss strategy's per-token terms
            chunk[name] = column(value)
        chunk["prompt"] = np.array([self.prompts.get(int(r), "") for r in chunk["row"]], dtype=object)
        if self.versions:
            chunk["policy_version"] = np.array([self.versions[int(r)] for r in chunk["row"]], dtype=np.int64)
            chunk["versions_behind"] = step - 1 - chunk["policy_version"]
        self.chunks.append(chunk)
        self._micro_batch += 1

    # --- step end ------------------------------------------------------------------------------------------------
    def check_folder(self) -> None:
        """Create the telemetry folder and write a probe file there; a failure stops the run before training."""
        if not self.accelerator.is_main_process:
            return
        probe = self.folder / ".write_probe"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"\0" * 4096)
            probe.unlink()
        except OSError as error:
            raise TelemetryError(
                f"token_telemetry: cannot write to {self.folder} ({error.strerror or error}); make it writable, free "
                "space, or set token_telemetry: false"
            ) from None

    def flush(self, step: int) -> Path | None:
        """Gather this step's rows from every process and write them (main process). Returns the file written."""
        if not is_telemetry_step(step, self.args):
            return None
        local = self.chunks if self._step == step else []
        self.chunks, self._micro_batch, self._step = [], 0, None
        merged = _concatenate(local)
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            merged = _concatenate([m for m in gather_object([merged]) if m])
        if not self.accelerator.is_main_process or not merged:
            return None
        merged = _global_order(merged)
        merged["prompt_index"] = merged["row"] // self.num_generations
        merged["completion_index"] = merged["row"] % self.num_generations
        merged["token"] = np.array([self._piece(int(i)) for i in merged["token_id"]], dtype=object)
        path = self.write(step, merged)
        self.last_summary = step_summary(merged)
        return path

    def _piece(self, token_id: int) -> str:
        if token_id not in self._pieces:
            self._pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return self._pieces[token_id]

    def write(self, step: int, columns: dict[str, np.ndarray]) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        order = [c for c in COLUMNS if c in columns] + sorted(c for c in columns if c not in COLUMNS)
        table = pa.table({name: columns[name] for name in order})
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(
            file_metadata(self.args, step, order, sampling_logps=self.sampling_logps), default=str)})
        path = self.folder / f"telemetry_{step:06d}.parquet"
        partial = path.with_suffix(".parquet.partial")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(partial, "wb") as file:  # closed on a failed write too
                pq.write_table(table, file, compression="zstd")
            os.replace(partial, path)  # a file under its final name is complete
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise TelemetryError(
                f"token_telemetry: writing {path} failed at step {step} ({error.strerror or error}); the last "
                "checkpoint is kept; free space or set token_telemetry: false"
            ) from None
        return path


SUMMARY_QUANTILES = (0.1, 0.5, 0.9)


def step_summary(columns: dict[str, np.ndarray]) -> dict[str, float]:
    """A telemetry step in a few numbers, over its loss tokens (``mask`` 1), logged as ``telemetry/*`` metrics with
    the step's others (so every tracker of ``report_to`` gets them): the min, max, mean and 10/50/90% quantiles of
    ``weight``, ``advantage``, ``ratio`` and ``token_loss``; the fractions of tokens with a clip bound active
    (``clip_fraction``, ``clip_low_fraction``, ``clip_high_fraction``), with weight 0 (``zero_weight_fraction``) and
    rejected by a rollout correction (``rejected_fraction``: any ``<strategy>/rejected`` column); ``loss_tokens``."""
    kept = np.asarray(columns["mask"]) == 1
    summary: dict[str, float] = {"telemetry/loss_tokens": float(kept.sum())}
    if not kept.any():
        return summary
    for name in ("weight", "advantage", "ratio", "token_loss"):
        values = np.asarray(columns[name], dtype=np.float64)[kept] if name in columns else None
        if values is None or np.isnan(values).all():
            continue
        summary[f"telemetry/{name}/mean"] = float(np.nanmean(values))
        summary[f"telemetry/{name}/min"] = float(np.nanmin(values))
        summary[f"telemetry/{name}/max"] = float(np.nanmax(values))
        for q, value in zip(SUMMARY_QUANTILES, np.nanquantile(values, SUMMARY_QUANTILES), strict=True):
            summary[f"telemetry/{name}/p{round(q * 100)}"] = float(value)
    low, high = (np.asarray(columns.get(c, np.zeros(kept.shape)), dtype=bool)[kept] for c in ("clip_low", "clip_high"))
    summary.update({"telemetry/clip_fraction": float((low | high).mean()), "telemetry/clip_low_fraction":
                    float(low.mean()), "telemetry/clip_high_fraction": float(high.mean())})  # fmt: skip
    if "weight" in columns:
        summary["telemetry/zero_weight_fraction"] = float((np.asarray(columns["weight"])[kept] == 0).mean())
    rejected = [np.nan_to_num(np.asarray(columns[c], dtype=np.float64)[kept]) > 0 for c in columns
                if c.endswith("/rejected")]  # fmt: skip
    if rejected:
        summary["telemetry/rejected_fraction"] = float(np.logical_or.reduce(rejected).mean())
    return summary


def file_metadata(args, step: int, columns: Sequence[str], sampling_logps: bool = False) -> dict[str, Any]:
    """What the file's schema metadata says (key ``METADATA_KEY``): version, step, the run's settings, each selected
    strategy's parameters (``strategy_params``: its ``params`` and their values), whether ``sampling_logp`` holds the
    sampling engine's log-probabilities (``sampling_logps``; else it repeats old_logp), columns."""
    return {
        "version": SCHEMA_VERSION,
        "step": step,
        "strategies": list(args.strategies),
        "loss_type": args.loss_type,
        "weight_placement": args.weight_placement,
        "importance_sampling_level": args.importance_sampling_level,
        "epsilon_low": args.epsilon,
        "epsilon_high": args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        "beta": args.beta,
        "temperature": args.temperature,
        "num_generations": args.num_generations,
        "seed": args.seed,
        "output_dir": Path(args.output_dir).name,
        "sampling_logps": bool(sampling_logps),
        "strategy_params": {name: {param: getattr(args, param, None) for param in STRATEGIES.get(name).params}
                            for name in args.strategies if name in STRATEGIES},
        "columns": {name: COLUMNS.get(name) or _pattern_help(name) for name in columns},
    }


def _pattern_help(name: str) -> str:
    prefix, _, term = name.partition("/")
    found = next((text for pattern, text in PATTERN_COLUMNS.items() if pattern.startswith(prefix + "/")), None)
    if found is None and term in LossTerms.TERMS:  # a loss strategy's term, named after the strategy
        return f"{prefix} (loss strategy): {LossTerms.TERMS[term]}"
    declared = getattr(STRATEGIES.get(prefix), "columns", {}) if found is None and prefix in STRATEGIES else {}
    if term in declared:  # a strategy's declared per-token diagnostic
        return f"{prefix} ({STRATEGIES.get(prefix).kind} strategy): {declared[term]}"
    return found or ""


def _prompt_text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, default=str)


def _concatenate(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if not chunks:
        return {}
    names = list(dict.fromkeys(name for chunk in chunks for name in chunk))
    size = [len(chunk["row"]) for chunk in chunks]
    return {
        name: np.concatenate([c[name] if name in c else np.full(n, np.nan, dtype=np.float32)
                              for c, n in zip(chunks, size, strict=True)])
        for name in names
    }


def _global_order(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows sorted by (row, position): every token is captured once per step, by the training loss (the sharpness
    probe's loss passes call the policy loss itself and capture nothing)."""
    order = np.lexsort((columns["position"], columns["row"]))
    return {name: values[order] for name, values in columns.items()}


def replace_logged_advantages(logs: dict[str, Any], trained: torch.Tensor | None, trl: torch.Tensor | None,
                               size: int) -> None:
    """Make TRL's completion log (``trainer._logs``, read by ``log_completions`` and the saved completions) show the
    advantage trained on: the last ``size`` entries of ``advantages`` (the generation batch, global order) become
    ``trained`` (B,), each completion's mean token advantage; TRL's sequence advantage ``trl`` (B,) goes to the extra
    column ``trl_advantage``. ``trained=None`` keeps TRL's values (a strategy folded into the loss replaces them
    there: ``replace_folded_advantages``)."""
    logged = logs["advantages"]
    if trl is None:
        trl_values = list(logged)[-size:]
    else:
        trl_values = trl.detach().float().cpu().tolist()
    if trained is not None:
        for _ in range(min(size, len(logged))):
            logged.pop()
        logged.extend(trained.detach().float().cpu().tolist())
    logs["extra"]["trl_advantage"].extend(trl_values)


def replace_folded_advantages(logs: dict[str, Any], accelerator, inputs: dict[str, Any], advantages: torch.Tensor,
                              mask: torch.Tensor, generation_batch_size: int, num_generations: int) -> None:
    """For a strategy folded into the loss (AR on-policy): the micro-batch's rows of the completion log get their
    mean token advantage as the loss used it. Rows are found by their group tags (``tag_groups``): global row =
    (group id mod groups per batch) x G + index in the group. Gathers over processes (every process calls it)."""
    means = sequence_means(advantages.detach().float(), mask)
    rows = (inputs["group_ids"] % (generation_batch_size // num_generations)) * num_generations + inputs["group_index"]
    if accelerator.num_processes > 1:
        means, rows = accelerator.gather(means.contiguous()), accelerator.gather(rows.contiguous())
    logged = logs["advantages"]
    offset = len(logged) - generation_batch_size
    if offset < 0:
        return
    for row, mean in zip(rows.tolist(), means.tolist(), strict=True):
        logged[offset + row] = mean


def telemetry_recorder(trainer, strategies, folded: bool) -> TelemetryRecorder:
    """The recorder of ``trainer`` (a ``SharpGRPOTrainer`` with ``token_telemetry``), its callback installed;
    ``strategies`` the trainer's ``StrategySet``, ``folded`` whether its last advantage strategy acts in the loss."""
    advantage_names = strategies.names_of("advantage")
    run_at_generation = advantage_names[:-1] if folded else advantage_names
    recorder = TelemetryRecorder(
        trainer.args, trainer.accelerator, trainer.processing_class, reward_names=trainer.reward_func_names,
        weight_names=strategies.names_of("weight"),
        stage_names=generation_stages(run_at_generation, strategies.classes),
        folded_name=advantage_names[-1] if folded else None, num_generations=trainer.num_generations,
    )
    trainer.add_callback(TelemetryCallback(recorder, trainer._metrics["train"]))
    return recorder


class TelemetryCallback(TrainerCallback):
    """Checks the folder before training and writes each telemetry step's file at the step's end; its
    :func:`step_summary` joins the trainer's metrics (TRL's ``_metrics``, logged by its ``log`` after this step's
    end, averaged over the telemetry steps since the last log like any metric), so ``report_to``'s trackers,
    ``trainer_state.json`` and the progress logs get the ``telemetry/*`` values through TRL's own logging."""

    def __init__(self, recorder: TelemetryRecorder, metrics: dict[str, list] | None = None):
        self.recorder, self.metrics = recorder, metrics

    def on_train_begin(self, args, state, control, **kwargs):
        self.recorder.check_folder()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if self.recorder.flush(state.global_step) is not None and self.metrics is not None:
            for name, value in self.recorder.last_summary.items():
                self.metrics[name].append(value)
        return control
