"""Multi-turn Search-R1 rollouts for TRL's ``rollout_func`` and for evaluation.

An episode alternates generation and retrieval (Search-R1's ``run_llm_loop``). Each turn the model generates until
``</search>``, ``</answer>`` (``stop_at_answer``), end of sequence, ``max_turn_tokens`` or the completion budget
(``max_completion_length`` minus what the episode already holds). The turn's action is its first
``<search>...</search>`` or ``<answer>...</answer>`` pair, as in Search-R1's ``postprocess_predictions``: a search
sends the text between the tags to the retriever and appends
``\\n\\n<information>Doc 1(Title: T) text ...</information>\\n\\n``, cut to ``max_obs_tokens`` and to the budget; an
answer ends the episode. A turn without an action (end of sequence, an unclosed or malformed tag, a cut by
``max_turn_tokens``) is invalid: with ``invalid_action="retry"`` Search-R1's "My previous action is invalid ... Let
me try again." is appended and the model continues (a sampled end-of-sequence token is dropped first: TRL masks
everything after the first one); with ``"end"`` the episode ends there. Every turn counts: after
``max_search_turns`` turns one last turn is generated, in which neither a search nor a retry happens. The sampled
token ids are kept exactly as sampled (a turn is never decoded and re-encoded); the appended tokens get ``env_mask``
0, which TRL turns into ``tool_mask`` (no loss, no strategy statistic), and a message role in ``env_roles``
(``strategies.base.ENVIRONMENT_ROLES`` codes; ECHO's role table reads them): the passages ``tool``, the retry message
``user``, the end-of-sequence token that closes an answered episode none (0, scaffolding of no message).

Several processes: every process runs the same number of generation calls per turn, each with the same number of
rows (its active rows plus dummy rows whose output is discarded) and the same ``max_tokens``, because vLLM server
mode gathers the rows of all processes and hands back equal slices, and ZeRO-3 needs every rank in each forward.

Backends implement ``generate(rows, max_tokens, stop) -> [(ids, logprobs | None)]``: ``HFGenerateBackend``
(transformers ``generate`` with ``stop_strings``, which needs ``tokenizer=``), ``VLLMBackend`` (TRL's vLLM helper,
colocate or server, with vLLM's ``stop``), or a scripted generator in tests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sharpgrpo.search.format import (
    ANSWER_CLOSE,
    INFO_CLOSE,
    INVALID_ACTION_MESSAGE,
    SEARCH_CLOSE,
    format_passages,
    information_block,
    parse_action,
)
from sharpgrpo.strategies.base import ENVIRONMENT_ROLES

INVALID_ACTIONS = ("retry", "end")
TOOL_ROLE, USER_ROLE = ENVIRONMENT_ROLES.index("tool") + 1, ENVIRONMENT_ROLES.index("user") + 1  # env_roles codes


class GenerationBackend(Protocol):
    def generate(
        self, rows: list[list[int]], max_tokens: int, stop: list[str]
    ) -> list[tuple[list[int], list[float] | None]]: ...


@dataclass
class SearchLimits:
    """The limits of one episode (see ``SearchArguments`` for their meaning)."""

    max_completion_length: int
    max_search_turns: int = 4
    retrieval_topk: int = 3
    max_obs_tokens: int = 500
    max_turn_tokens: int = 500
    stop_at_answer: bool = True
    invalid_action: str = "retry"

    def __post_init__(self):
        if self.invalid_action not in INVALID_ACTIONS:
            raise ValueError(f"invalid_action must be one of {INVALID_ACTIONS}; got {self.invalid_action!r}.")

    @classmethod
    def from_args(cls, search_args, max_completion_length: int) -> SearchLimits:
        return cls(
            max_completion_length=int(max_completion_length),
            max_search_turns=search_args.max_search_turns,
            retrieval_topk=search_args.retrieval_topk,
            max_obs_tokens=search_args.max_obs_tokens,
            max_turn_tokens=search_args.max_turn_tokens,
            stop_at_answer=search_args.stop_at_answer,
            invalid_action=search_args.invalid_action,
        )

    @property
    def stop_strings(self) -> list[str]:
        return [SEARCH_CLOSE, ANSWER_CLOSE] if self.stop_at_answer else [SEARCH_CLOSE]


@dataclass
class Episode:
    """One completion: ``completion_ids`` with ``env_mask`` (1 sampled, 0 appended) and ``logprobs`` alike."""

    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    env_roles: list[int] = field(default_factory=list)  # the appended tokens' message roles, 0 on sampled ones
    logprobs: list[float] | None = field(default_factory=list)
    turns: int = 0  # generation calls
    searches: int = 0  # retrievals done
    invalid: int = 0  # turns without an action that got another try
    truncated: bool = False  # ended by the budget or max_turn_tokens, not by EOS, </answer> or the turn cap
    done: bool = False
    end_reason: str = ""
    queries: list[str] = field(default_factory=list)
    retrieved: list[str] = field(default_factory=list)  # the passages text of each search

    def extend(self, ids: Sequence[int], mask_value: int, logprobs: Sequence[float] | None, role: int = 0) -> None:
        self.completion_ids.extend(int(i) for i in ids)
        self.env_mask.extend([mask_value] * len(ids))
        self.env_roles.extend([role] * len(ids))
        if self.logprobs is not None:
            if logprobs is None:
                self.logprobs = None
            else:
                self.logprobs.extend(float(x) for x in logprobs)

    def finish(self, reason: str, truncated: bool = False) -> None:
        self.done, self.end_reason, self.truncated = True, reason, truncated


def first_stop(ids: Sequence[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str],
               eos_ids: Sequence[int]) -> int | None:
    """Length of the shortest prefix of ``ids`` that ends in an EOS token or whose text contains a stop string
    (the stop string may be split across several tokens); None if neither occurs.

    The prefix texts grow monotonically, so the first prefix containing a stop string is found by bisection."""
    eos = {int(i) for i in eos_ids}
    eos_at = next((k + 1 for k, token in enumerate(ids) if int(token) in eos), None)
    limit = eos_at if eos_at is not None else len(ids)

    def has_stop(length: int) -> bool:
        text = decode(ids[:length])
        return any(stop in text for stop in stops)

    if not stops or not has_stop(limit):
        return eos_at
    low, high = 1, limit  # has_stop(high) is True
    while low < high:
        middle = (low + high) // 2
        if has_stop(middle):
            high = middle
        else:
            low = middle + 1
    return high


def _observation_ids(tokenizer, passages: str, max_obs_tokens: int) -> list[int]:
    """Token ids of the information block, at most ``max_obs_tokens``: the passages are cut, the tags kept."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = encode(information_block(passages))
    if len(ids) <= max_obs_tokens:
        return ids
    head, tail = information_block("").split(INFO_CLOSE)
    head_ids, tail_ids = encode(head), encode(INFO_CLOSE + tail)
    room = max_obs_tokens - len(head_ids) - len(tail_ids)
    if room <= 0:
        return ids[:max_obs_tokens]
    return head_ids + encode(passages.strip())[:room] + tail_ids


def _eos_list(tokenizer, eos_ids) -> list[int]:
    if eos_ids is None:
        eos_ids = tokenizer.eos_token_id
    if eos_ids is None:
        return []
    return [int(eos_ids)] if isinstance(eos_ids, int) else [int(i) for i in eos_ids]


def run_episodes(
    prompt_ids: Sequence[Sequence[int]],
    backend: GenerationBackend,
    retrieve: Callable[[list[str]], list[list[dict]]],
    tokenizer,
    limits: SearchLimits,
    sync_max: Callable[[int], int] = lambda value: value,
    eos_ids: Sequence[int] | None = None,
) -> list[Episode]:
    """Run one episode per prompt (see the module docstring). ``retrieve(queries)`` returns, per query, Search-R1
    documents; ``sync_max(x)`` is the maximum of ``x`` over processes (identity with one process). ``eos_ids``: the
    tokens that end an episode (TRL's ``trainer.eos_token_ids``; default the tokenizer's EOS)."""
    episodes = [Episode() for _ in prompt_ids]
    eos_ids = _eos_list(tokenizer, eos_ids)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
    stops = limits.stop_strings
    for _ in range(limits.max_search_turns + 1):
        active = [i for i, episode in enumerate(episodes) if not episode.done]
        budgets = [limits.max_completion_length - len(episodes[i].completion_ids) for i in active]
        rows_needed = sync_max(len(active))
        if rows_needed == 0:
            break
        max_tokens = min(limits.max_turn_tokens, sync_max(max(budgets, default=1)))
        rows = [list(prompt_ids[i]) + episodes[i].completion_ids for i in active]
        dummy = list(prompt_ids[0]) if prompt_ids else [eos_ids[0] if eos_ids else 0]
        rows += [dummy] * (rows_needed - len(rows))
        outputs = backend.generate(rows, max_tokens, stops)
        queries: list[tuple[int, str]] = []
        for i, budget, (ids, logprobs) in zip(active, budgets, outputs[: len(active)]):
            episode = episodes[i]
            ids = list(ids)
            cut = first_stop(ids, decode, stops, eos_ids)
            end = min(len(ids) if cut is None else cut, budget)
            ids, logprobs = ids[:end], None if logprobs is None else list(logprobs)[:end]
            ended_by_eos = bool(eos_ids and ids and ids[-1] in eos_ids)
            action, content = parse_action(decode(ids[:-1] if ended_by_eos else ids))
            episode.turns += 1
            last_turn = episode.turns > limits.max_search_turns
            if action is None and limits.invalid_action == "retry" and not last_turn:
                if ended_by_eos:  # not kept: an EOS inside the completion would end it for TRL
                    ids, logprobs = ids[:-1], None if logprobs is None else logprobs[:-1]
                episode.extend(ids, 1, logprobs)
                room = limits.max_completion_length - len(episode.completion_ids)
                message = tokenizer(INVALID_ACTION_MESSAGE, add_special_tokens=False)["input_ids"][:max(room, 0)]
                episode.extend(message, 0, [0.0] * len(message), USER_ROLE)
                episode.invalid += 1
                if len(episode.completion_ids) >= limits.max_completion_length:
                    episode.finish("budget", truncated=True)
                continue
            episode.extend(ids, 1, logprobs)
            full = len(episode.completion_ids) >= limits.max_completion_length
            if action == "answer" or ended_by_eos:
                if not ended_by_eos and not full and eos_ids:
                    episode.extend(eos_ids[:1], 0, [0.0])  # the environment closes the episode (not trained)
                episode.finish("eos" if ended_by_eos else "answer")
            elif action == "search":
                if last_turn:
                    episode.finish("turn_cap")
                elif full:
                    episode.finish("budget", truncated=True)
                else:
                    queries.append((i, content))
            elif full:
                episode.finish("budget", truncated=True)
            elif cut is None:  # max_turn_tokens without a stop
                episode.finish("turn_tokens", truncated=True)
            else:  # a stop string without an action, e.g. `</search>` without `<search>`
                episode.finish("turn_cap" if last_turn else "invalid")
        if queries:
            results = retrieve([query for _, query in queries])
            for (i, query), documents in zip(queries, results, strict=True):
                episode = episodes[i]
                passages = format_passages(documents)
                room = limits.max_completion_length - len(episode.completion_ids)
                obs = _observation_ids(tokenizer, passages, limits.max_obs_tokens)[:room]
                episode.extend(obs, 0, [0.0] * len(obs), TOOL_ROLE)
                episode.searches += 1
                episode.queries.append(query)
                episode.retrieved.append(passages)
                if len(episode.completion_ids) >= limits.max_completion_length:
                    episode.finish("budget", truncated=True)
    for episode in episodes:  # the loop ran out of turns with a retrieval last: the model never answered
        if not episode.done:
            episode.finish("turn_cap")
    return episodes


def answer_retrieved(episode: Episode, golds: Any) -> bool:
    """Whether a normalised gold answer occurs in the normalised text of any passage the episode retrieved."""
    from reward_fns.qa import gold_answers, normalize_answer

    texts = [normalize_answer(text) for text in episode.retrieved]
    answers = [normalize_answer(gold) for gold in gold_answers(golds)]
    return any(answer and f" {answer} " in f" {text} " for answer in answers for text in texts)


def episode_metrics(episodes: Sequence[Episode], latencies_ms: Sequence[float], golds: Sequence[Any] | None) -> dict:
    """Sums (to reduce over processes) behind the ``search/*`` metrics."""
    sums = {
        "episodes": float(len(episodes)),
        "turns": float(sum(e.turns for e in episodes)),
        "calls": float(sum(e.searches for e in episodes)),
        "invalid": float(sum(e.invalid for e in episodes)),
        "truncated": float(sum(e.truncated for e in episodes)),
        "latency_ms": float(sum(latencies_ms)),
        "requests": float(len(latencies_ms)),
        "answer_retrieved": 0.0,
        "with_gold": 0.0,
    }
    if golds is not None:
        for episode, gold in zip(episodes, golds, strict=True):
            if gold is not None:
                sums["with_gold"] += 1
                sums["answer_retrieved"] += float(answer_retrieved(episode, gold))
    return sums


def metrics_from_sums(sums: dict) -> dict[str, float]:
    n = max(sums["episodes"], 1.0)
    out = {
        "search/turns_mean": sums["turns"] / n,
        "search/calls_mean": sums["calls"] / n,
        "search/invalid_mean": sums["invalid"] / n,
        "search/frac_truncated": sums["truncated"] / n,
        "search/latency_ms": sums["latency_ms"] / max(sums["requests"], 1.0),
    }
    if sums["with_gold"] > 0:
        out["search/frac_answer_retrieved"] = sums["answer_retrieved"] / sums["with_gold"]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------------------------
class HFGenerateBackend:
    """transformers ``generate`` on left-padded rows; each row is cut at its first stop (EOS or stop string).

    ``context()`` wraps every call (the trainer unwraps/gathers the model there)."""

    def __init__(self, model, tokenizer, generation_config, context: Callable[[], Any] | None = None):
        self.model, self.tokenizer, self.generation_config = model, tokenizer, generation_config
        self.context = context or contextlib.nullcontext

    def generate(self, rows, max_tokens, stop):
        import copy

        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        width = max(len(r) for r in rows)
        input_ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows])
        attention_mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens, config.max_length, config.min_new_tokens = int(max_tokens), None, None
        config.stop_strings = list(stop) or None
        with self.context() as model, torch.no_grad():
            model = model if model is not None else self.model
            device = next(model.parameters()).device
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                tokenizer=self.tokenizer,  # stop_strings need it
            )
        completions = out[:, width:].cpu().tolist()
        config_eos = getattr(self.generation_config, "eos_token_id", None)  # generate stops at all of them
        eos = sorted(set(_eos_list(self.tokenizer, None)) | set(_eos_list(self.tokenizer, config_eos)))
        decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False)
        results = []
        for ids in completions:  # finished rows are padded after their stop: cut there
            cut = first_stop(ids, decode, stop, eos)
            results.append((ids if cut is None else ids[:cut], None))
        return results


class VLLMBackend:
    """TRL's vLLM helper (``trainer.vllm_generation``; colocate or server) with vLLM ``stop`` strings, one
    completion per row. The per-request ``seed`` that SharpGRPOTrainer sets in server mode is dropped: with one
    completion per row, a shared seed would give the G copies of a prompt the same sample."""

    def __init__(self, vllm_generation):
        self.vllm_generation = vllm_generation

    def generate(self, rows, max_tokens, stop):
        generation = self.vllm_generation
        saved = generation.max_completion_length, generation.generation_kwargs
        kwargs = {k: v for k, v in dict(saved[1] or {}).items() if k != "seed"}
        generation.max_completion_length = int(max_tokens)
        generation.generation_kwargs = {**kwargs, "stop": list(stop), "include_stop_str_in_output": True}
        try:
            _, completion_ids, logprobs, _ = generation.generate(prompts=rows, images=None, num_generations=1)
        finally:
            generation.max_completion_length, generation.generation_kwargs = saved
        if logprobs is None:
            return [(list(ids), None) for ids in completion_ids]
        return [
            (list(ids), [float("nan") if lp[0] is None else lp[0] for lp in seq])
            for ids, seq in zip(completion_ids, logprobs, strict=True)
        ]


class SearchRolloutFunc:
    """TRL ``rollout_func(prompts, trainer)``: one multi-turn episode per prompt row.

    Returns ``prompt_ids``, ``completion_ids``, ``logprobs`` (None with the transformers backend), ``env_mask``,
    ``env_roles`` (each token's message role, for ECHO),
    and per-row ``search_turns``/``search_calls`` (forwarded to reward functions), and logs ``search/*``.
    """

    def __init__(self, client, search_args):
        self.client = client
        self.search_args = search_args

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        mode = "train" if trainer.model.training else "eval"
        limits = SearchLimits.from_args(self.search_args, trainer.max_completion_length)
        prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
        prompt_ids = [list(ids) for ids in prompt_ids]
        backend = self._backend(trainer)
        latencies: list[float] = []

        def retrieve(queries):
            start = time.perf_counter()
            result = self.client.retrieve(queries, limits.retrieval_topk)
            latencies.append(1000.0 * (time.perf_counter() - start))
            return result

        accelerator = trainer.accelerator
        if accelerator.num_processes > 1:
            def sync_max(value: int) -> int:
                return int(accelerator.gather(torch.tensor([value], device=accelerator.device)).max().item())
        else:
            sync_max = lambda value: value
        eos_ids = getattr(trainer, "eos_token_ids", None)  # TRL: the tokenizer's EOS and the generation config's
        episodes = run_episodes(prompt_ids, backend, retrieve, trainer.processing_class, limits, sync_max, eos_ids)

        inputs = getattr(trainer, "_rollout_inputs", None)
        golds = None
        if inputs is not None and len(inputs) == len(prompts) and all("golden_answers" in x for x in inputs):
            golds = [x["golden_answers"] for x in inputs]
        sums = episode_metrics(episodes, latencies, golds)
        keys = sorted(sums)
        totals = accelerator.reduce(
            torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=accelerator.device), reduction="sum"
        )
        for name, value in metrics_from_sums(dict(zip(keys, totals.tolist()))).items():
            trainer._metrics[mode][name].append(value)

        logprobs = [e.logprobs for e in episodes]
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None if any(lp is None for lp in logprobs) else logprobs,
            "env_mask": [e.env_mask for e in episodes],
            "env_roles": [e.env_roles for e in episodes],
            "search_turns": [e.turns for e in episodes],
            "search_calls": [e.searches for e in episodes],
        }

    @staticmethod
    def _backend(trainer) -> GenerationBackend:
        if trainer.use_vllm:
            return VLLMBackend(trainer.vllm_generation)
        if getattr(trainer, "use_transformers_continuous_batching", False):
            raise ValueError("Search rollouts do not support transformers continuous batching; use vLLM or generate.")
        from trl.models import unwrap_model_for_generation

        @contextlib.contextmanager
        def context():
            with (
                unwrap_model_for_generation(
                    trainer.model_wrapped,
                    trainer.accelerator,
                    gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                    generation_kwargs=trainer.generation_kwargs,
                    gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
                ) as unwrapped,
                trainer._dist.summon_full_params(trainer.model_wrapped, recurse=False),
            ):
                yield unwrapped

        return HFGenerateBackend(trainer.model, trainer.processing_class, trainer.generation_config, context)
