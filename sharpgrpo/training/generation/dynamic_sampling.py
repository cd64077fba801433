"""Dynamic sampling with refill (DAPO §3.2; verl's ``filter_groups``): groups that carry no signal are dropped and
replaced by groups generated from new prompts until every process holds a full generation batch or the bound on
extra rounds is hit (docs/methods.md §15.5).

A group passes the filter (``dynamic_sampling_filter``) when the per-completion value it reads is not the same for
every completion of the group:

* ``reward_std`` (default): the total (weighted) reward, as TRL sums it; a group failing it has TRL advantage 0 for
  every completion, whatever the weights, so no token strategy can do anything with it;
* ``accuracy``: the answer checks' verdicts (``sharpgrpo.strategies.correctness``, the one notion of a correct
  completion): the group's accuracy is in (0, 1), DAPO's filter ("accuracy equal to 1 or 0");
* the name of one of the run's reward functions, as logged (``rewards/<name>/mean``): that function's own reward
  (verl's ``filter_groups.metric`` read from the reward's extra info, e.g. ``acc`` or ``score``).

verl drops a group when ``len(values) > 1 and np.std(values) == 0.0`` (verl-project/verl@1dda039
``verl/trainer/ppo/v1/replay_buffer.py`` L293-297). Here "not the same" is tested as ``max > min`` over the group's
values (NaN, a reward function that skipped the row, left out): equal to std > 0 in exact arithmetic, and, unlike a
float std, never keeps a group of equal rewards whose mean rounds (np.std([0.1] * 3) is 1.4e-17, not 0).

Every process fills its own quota of whole groups (its generation batch must hold whole groups). The keep decisions
are computed from values gathered over all processes, so every process knows every process's count and all of them
run the same number of rounds and end the step with the same number of groups. An extra round draws new prompts
from the training set (as many as one generation batch, a seeded draw that depends on the seed, the generation
index and the round, so a resumed run draws the same), generates and scores them with TRL's own generation, and
keeps the passing groups; surplus groups are discarded, as verl aligns its batch. When the bound is hit with groups
still missing, a process fills its quota with the failing groups of the last round (they have advantage 0 and only
count in the loss's normaliser, as without dynamic sampling), the ``dynamic_sampling/groups_unfilled`` metric counts
them and a warning names the filter once; when no group of the step passed at all, training stops with one line
naming the filter.

Per generation batch (all processes together) it logs ``dynamic_sampling/groups_dropped`` (groups that failed the
filter and were not trained on), ``dynamic_sampling/extra_rounds``, ``dynamic_sampling/groups_generated``,
``dynamic_sampling/groups_surplus`` (passing groups beyond a process's quota, discarded) and
``dynamic_sampling/groups_unfilled``. The completion tables show the rows trained on.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from sharpgrpo.training.generation.inputs import environment_roles, loss_mask
from sharpgrpo.training.generation.routing_replay import COMPLETION_KEY, NO_ROUTE, PROMPT_KEY, routed_generation
from sharpgrpo.training.generation.window_tokens import recount_window_tokens

DYNAMIC_SAMPLING_FILTERS = ("reward_std", "accuracy")  # or the name of a reward function of the run
_SEED_MIX = (1_000_003, 7919)  # the draw's seed: seed + generation * 1_000_003 + round * 7919


def needs_verdicts(args) -> bool:
    """Whether every round must run the answer checks (``dynamic_sampling`` with the ``accuracy`` filter)."""
    return bool(args.dynamic_sampling) and args.dynamic_sampling_filter == "accuracy"


def generate_batch(trainer, inputs: list[dict], generate: Callable[[list[dict]], dict], mode: str):
    """One generation batch for ``trainer``: ``generate`` (TRL's ``_generate_and_score_completions``) on ``inputs``
    with a fresh generation record, refilled by the trainer's :class:`DynamicSampler` in training when
    ``dynamic_sampling`` is on (built with the trainer: :func:`dynamic_sampler`), its window token count recounted
    without the tokens a loss strategy removes (``window_tokens``). Returns (the input rows, TRL's output, the
    generation record)."""
    from sharpgrpo.training.generation.advantage_pipeline import GenerationRecord

    def one_round(rows: list[dict]):
        trainer._generation = GenerationRecord(inputs=rows, step=trainer.state.global_step)
        return routed_generation(trainer, generate, rows), trainer._generation  # routes recorded: routing_replay

    if mode != "train" or trainer._dynamic_sampler is None:
        rows, output, record = inputs, *one_round(inputs)
    else:
        rows, output, record = trainer._dynamic_sampler.generate(inputs, one_round, trainer._generation_count)
    output = environment_roles(rows, output)  # the rollout's per-token roles of environment tokens, for the loss
    return rows, recount_window_tokens(trainer, output), record  # the window count without removed tokens


def dynamic_sampler(trainer) -> DynamicSampler | None:
    """The trainer's :class:`DynamicSampler` where ``dynamic_sampling`` is on, built when the trainer is (so a filter
    that names no reward function of the run is refused before the first step), else None."""
    return DynamicSampler.from_trainer(trainer) if trainer.args.dynamic_sampling else None


class DynamicSamplingError(RuntimeError):
    """The filter was never met within the bound on extra rounds."""


def groups_pass(values: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(B,) per-completion values of consecutive groups of ``num_generations`` -> (B / G,) bool: the group's values
    are not all equal (max > min over its non-NaN values; a group with fewer than two values fails)."""
    grouped = values.double().view(-1, num_generations)
    present = ~grouped.isnan()
    high = torch.where(present, grouped, -math.inf).max(dim=1).values
    low = torch.where(present, grouped, math.inf).min(dim=1).values
    return (present.sum(dim=1) >= 2) & (high > low)


def draw_prompt_indices(dataset_size: int, num_prompts: int, seed: int, generation_index: int,
                        round_index: int) -> list[int]:
    """``num_prompts`` row indices of the training set for an extra round, the same on every process: distinct rows
    of a permutation (with replacement when the set is smaller), seeded by the seed, generation and round."""
    generator = torch.Generator().manual_seed(seed + generation_index * _SEED_MIX[0] + round_index * _SEED_MIX[1])
    if num_prompts <= dataset_size:
        return torch.randperm(dataset_size, generator=generator)[:num_prompts].tolist()
    return torch.randint(dataset_size, (num_prompts,), generator=generator).tolist()


def pad_cat(tensors: list[torch.Tensor], pad_value: float, left: bool = False) -> torch.Tensor:
    """Concatenate along rows, padding dim 1 (when there is one) to the widest with ``pad_value`` on the right
    (``left``: on the left, as TRL pads prompts)."""
    if tensors[0].dim() < 2:
        return torch.cat(tensors)
    width = max(t.size(1) for t in tensors)
    padded = []
    for t in tensors:
        missing = width - t.size(1)
        if missing:
            fill = t.new_full((t.size(0), missing, *t.shape[2:]), pad_value)
            t = torch.cat([fill, t] if left else [t, fill], dim=1)
        padded.append(t)
    return torch.cat(padded)


# Keys of TRL 1.16's generation output: how rows of several rounds are joined.
_LEFT_PADDED = {"prompt_ids", "prompt_mask"}
_REFUSED = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "image_sizes",
            "token_type_ids", "mm_token_type_ids", "image_position_ids", "num_tiles")


def merge_outputs(parts: list[tuple[dict[str, Any], torch.Tensor]], pad_token_id: int) -> dict[str, Any]:
    """The rows ``rows`` (a (k,) long index) of each round's generation output, joined in order: prompts left
    padded, completions and per-token values right padded (ids with ``pad_token_id``, masks and values with 0).
    ``num_items_in_batch`` is left out (the caller recounts it over all processes)."""
    keys = [key for key in parts[0][0] if key != "num_items_in_batch"]
    merged: dict[str, Any] = {}
    for key in keys:
        tensors = [output[key][rows] for output, rows in parts]
        if key in _LEFT_PADDED:
            merged[key] = pad_cat(tensors, pad_token_id if key == "prompt_ids" else 0, left=True)
        elif key == "completion_ids":
            merged[key] = pad_cat(tensors, pad_token_id)
        elif key in (PROMPT_KEY, COMPLETION_KEY):  # expert ids, -1 where none (routing_replay)
            merged[key] = pad_cat(tensors, NO_ROUTE, left=key == PROMPT_KEY)
        elif key == "tool_mask":
            merged[key] = pad_cat(tensors, 1)  # as TRL pads it
        else:
            merged[key] = pad_cat(tensors, 0)
    return merged


def merge_records(records: list, local_rows: list[torch.Tensor], global_rows: list[tuple[int, int]],
                  inputs: list[dict]):
    """The generation record of the joined batch. ``records`` one per round; ``local_rows`` this process's rows kept
    from each round (the local ``answer_verdicts`` and decoding-step captures are joined from them); ``global_rows``
    the (round, global row) of every row of the joined batch over all processes, in its global order (for the
    gathered ``rewards_per_func``); ``inputs`` the kept input rows. Other fields keep their defaults (the advantage
    pipeline fills them later)."""
    rewards = torch.stack([records[r].rewards_per_func[row] for r, row in global_rows])
    fields: dict[str, Any] = {"inputs": inputs, "rewards_per_func": rewards}
    if all(r.answer_verdicts is not None for r in records):
        fields["answer_verdicts"] = torch.cat([r.answer_verdicts[rows.to(r.answer_verdicts.device)]
                                               for r, rows in zip(records, local_rows, strict=True)])
    captured_keys = set.intersection(*(set(r.captured) for r in records))
    fields["captured"] = {key: pad_cat([r.captured[key][rows.to(r.captured[key].device)]
                                        for r, rows in zip(records, local_rows, strict=True)], 0)
                          for key in captured_keys}
    return type(records[0])(**fields)


def select_logged_rows(logs: dict, snapshots: list[dict], global_rows: list[tuple[int, int]]) -> None:
    """Rewrite TRL's completion tables (``GRPOTrainer._logs``, deques holding one generation batch) to the rows
    trained on: ``snapshots`` holds each round's logged columns, ``global_rows`` the (round, global row) of every
    row trained on, in order. A column some round did not log is left as it is."""
    for key, _ in _logged_columns(snapshots[0]):
        columns = [dict(_logged_columns(snapshot)).get(key) for snapshot in snapshots]
        if any(column is None for column in columns):
            continue
        if any(row >= len(columns[r]) for r, row in global_rows):  # not logged per row (e.g. no images)
            continue
        target = logs[key[0]] if len(key) == 1 else logs[key[0]][key[1]]
        target.clear()
        target.extend(columns[r][row] for r, row in global_rows)


def _logged_columns(logs: dict):
    """((key path), list of values) of every completion-table column of ``logs``."""
    for name in ("prompt", "completion", "advantages", "images"):
        if name in logs:
            yield (name,), list(logs[name])
    for name in ("rewards", "extra"):
        for column, values in logs.get(name, {}).items():
            yield (name, column), list(values)


@dataclasses.dataclass
class _Round:
    output: dict[str, Any]
    record: Any
    inputs: list[dict]
    passed: torch.Tensor  # (groups_global,) bool
    logs: dict


class DynamicSampler:
    """Runs one generation batch's rounds (``generate``) for a trainer; built once with the trainer
    (:meth:`from_trainer`)."""

    def __init__(self, *, filter_name: str, max_rounds: int, seed: int, num_generations: int, dataset,
                 reward_func_names: list[str], pad_token_id: int, accelerator, reward_weights: torch.Tensor,
                 metrics, logs):
        logged = filter_name.removeprefix("rewards/").removesuffix("/mean")  # the logged column's name works too
        if filter_name not in DYNAMIC_SAMPLING_FILTERS and logged not in reward_func_names:
            raise ValueError(
                f"dynamic_sampling_filter={filter_name!r}: must be reward_std, accuracy or the name of one of the "
                f"run's reward functions as logged (rewards/<name>/mean): {', '.join(reward_func_names)}."
            )
        if filter_name not in DYNAMIC_SAMPLING_FILTERS:
            filter_name = logged
        if dataset is None or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise ValueError("dynamic_sampling: refilling draws new prompts by index, so it needs a map-style "
                             "train_dataset (not an iterable one).")
        self.filter_name, self.max_rounds, self.seed = filter_name, max_rounds, seed
        self.num_generations, self.dataset, self.reward_func_names = num_generations, dataset, reward_func_names
        self.pad_token_id, self.accelerator, self.reward_weights = pad_token_id, accelerator, reward_weights
        self.metrics, self.logs = metrics, logs
        self._warned_unfilled = False

    @classmethod
    def from_trainer(cls, trainer) -> DynamicSampler:
        args = trainer.args
        return cls(filter_name=args.dynamic_sampling_filter, max_rounds=args.dynamic_sampling_max_rounds,
                   seed=args.seed, num_generations=trainer.num_generations, dataset=trainer.train_dataset,
                   reward_func_names=list(trainer.reward_func_names),
                   pad_token_id=trainer._tokenizer.pad_token_id, accelerator=trainer.accelerator,
                   reward_weights=trainer.reward_weights, metrics=trainer._metrics["train"], logs=trainer._logs)

    # ----------------------------------------------------------------------------------------------------------------
    def generate(self, inputs: list[dict], generate_round: Callable[[list[dict]], tuple[dict, Any]],
                 generation_index: int) -> tuple[list[dict], dict[str, Any], Any]:
        """Generate ``inputs`` with ``generate_round(rows) -> (TRL's output, the round's generation record)``, then
        refill. Returns (the kept input rows, the joined output, the joined record), each with this process's
        ``len(inputs)`` rows."""
        G, process, processes = self.num_generations, self.accelerator.process_index, self.accelerator.num_processes
        local_rows = len(inputs)
        if local_rows % G:
            raise ValueError(
                f"dynamic_sampling: each process's generation batch ({local_rows} completions) must hold whole groups "
                f"of num_generations={G}; make per_device_train_batch_size x steps_per_generation a multiple of it."
            )
        quota = local_rows // G  # groups per process
        rounds: list[_Round] = []
        kept: list[list[tuple[int, int]]] = [[] for _ in range(processes)]  # per process: (round, local group)
        round_inputs = inputs
        for round_index in range(self.max_rounds + 1):
            if round_index:
                round_inputs = self._draw_inputs(quota * processes, generation_index, round_index, process, quota)
            output, record = generate_round(round_inputs)
            refused = [key for key in _REFUSED if key in output]
            if refused:
                raise ValueError(f"dynamic_sampling does not support multimodal inputs ({', '.join(refused)}).")
            passed = self._passing_groups(output, record)
            rounds.append(_Round(output, record, round_inputs, passed, self._snapshot_logs()))
            for group in torch.nonzero(passed).flatten().tolist():
                owner, local_group = divmod(group, quota)
                if len(kept[owner]) < quota:
                    kept[owner].append((round_index, local_group))
            if min(len(k) for k in kept) >= quota:
                break
        unfilled = self._fill_shortfall(kept, rounds, quota)
        generated = len(rounds) * quota * processes
        dropped = sum(int((~r.passed).sum()) for r in rounds) - unfilled
        for name, value in (("groups_generated", generated), ("groups_dropped", dropped),
                            ("groups_surplus", generated - quota * processes - dropped),
                            ("extra_rounds", len(rounds) - 1), ("groups_unfilled", unfilled)):
            self.metrics[f"dynamic_sampling/{name}"].append(float(value))
        return self._join(rounds, kept, process, quota)

    # ----------------------------------------------------------------------------------------------------------------
    def _draw_inputs(self, num_prompts, generation_index, round_index, process, quota) -> list[dict]:
        indices = draw_prompt_indices(len(self.dataset), num_prompts, self.seed, generation_index, round_index)
        mine = indices[process * quota:(process + 1) * quota]
        return [dict(self.dataset[i]) for i in mine for _ in range(self.num_generations)]

    def _gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.accelerator.num_processes == 1 else self.accelerator.gather(tensor.contiguous())

    def _passing_groups(self, output: dict[str, Any], record) -> torch.Tensor:
        """(groups over all processes,) bool: the groups that pass the filter, from gathered values (the same on
        every process)."""
        from sharpgrpo.training.generation.advantage_pipeline import total_rewards

        rewards_per_func = record.rewards_per_func
        if self.filter_name == "reward_std":
            values = total_rewards(rewards_per_func, self.reward_weights)
        elif self.filter_name == "accuracy":
            from sharpgrpo.strategies.correctness import correct_completions

            device = output["advantages"].device
            verdicts = None if record.answer_verdicts is None else self._gather(record.answer_verdicts.to(device))
            rewards = total_rewards(rewards_per_func, self.reward_weights).to(device)
            advantages = self._gather(output["advantages"]).float()
            group_ids = torch.arange(advantages.numel(), device=device) // self.num_generations
            values = correct_completions(verdicts, rewards, advantages, group_ids).double()
        else:
            values = rewards_per_func[:, self.reward_func_names.index(self.filter_name)]
        return groups_pass(values.cpu(), self.num_generations)

    def _snapshot_logs(self) -> dict:
        return {name: (dict((k, list(v)) for k, v in value.items()) if isinstance(value, dict) else list(value))
                for name, value in self.logs.items()}

    def _fill_shortfall(self, kept, rounds: list[_Round], quota: int) -> int:
        """After the last round: stop when no group passed at all; else fill each short process with the failing
        groups of the last rounds. Returns how many groups were filled so (over all processes)."""
        if not any(bool(r.passed.any()) for r in rounds):
            raise DynamicSamplingError(
                f"dynamic_sampling_filter={self.filter_name}: no group passed in {len(rounds)} generation rounds "
                f"(dynamic_sampling_max_rounds={self.max_rounds} extra); every group's "
                f"{'reward' if self.filter_name == 'reward_std' else self.filter_name} was the same for all its "
                "completions. Check the reward on this data or choose another filter."
            )
        unfilled = 0
        for owner, groups in enumerate(kept):
            for round_index in reversed(range(len(rounds))):
                failing = [g - owner * quota for g in torch.nonzero(~rounds[round_index].passed).flatten().tolist()
                           if g // quota == owner]
                for local_group in failing:
                    if len(groups) >= quota:
                        break
                    groups.append((round_index, local_group))
                    unfilled += 1
        if unfilled and not self._warned_unfilled:
            self._warned_unfilled = True
            warnings.warn(
                f"dynamic_sampling_filter={self.filter_name}: {unfilled} group(s) still failed it after "
                f"dynamic_sampling_max_rounds={self.max_rounds} extra rounds and were trained on to fill the batch "
                "(counted in dynamic_sampling/groups_unfilled; warned once).",
                UserWarning, stacklevel=2,
            )
        return unfilled

    def _join(self, rounds: list[_Round], kept, process: int, quota: int):
        """This process's kept rows of every round (in round order, then group order) as one output and record; the
        completion tables rewritten to the rows trained on (all processes', in global order)."""
        G = self.num_generations
        order = [sorted(groups) for groups in kept]  # per process: (round, local group), the joined row order

        def local_rows(owner: int, round_index: int) -> torch.Tensor:
            return torch.tensor([g * G + j for r, g in order[owner] if r == round_index for j in range(G)],
                                dtype=torch.long)

        mine = [local_rows(process, r) for r in range(len(rounds))]
        global_rows = [(r, (owner * quota + g) * G + j) for owner in range(len(order)) for r, g in order[owner]
                       for j in range(G)]
        inputs = [rounds[r].inputs[i] for r in range(len(rounds)) for i in mine[r].tolist()]
        device = rounds[0].output["completion_ids"].device
        output = merge_outputs([(r.output, rows.to(device)) for r, rows in zip(rounds, mine, strict=True)],
                               self.pad_token_id)
        output["num_items_in_batch"] = self._gather(loss_mask(output).sum().reshape(1)).sum()
        record = merge_records([r.record for r in rounds], mine, global_rows, inputs)
        select_logged_rows(self.logs, [r.logs for r in rounds], global_rows)
        return inputs, output, record
