"""``--task search_qa`` of ``sharpgrpo eval``: the training rollout (same episodes, same limits), decoded greedily,
against a retrieval server; reports EM, turns and searches per question, and how often the gold answer was retrieved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sharpgrpo.evaluation.tasks import EVAL_TASKS, Problem, QATask
from sharpgrpo.search.config import SearchArguments
from sharpgrpo.search.rollout import HFGenerateBackend, SearchLimits, answer_retrieved, run_episodes


def search_backend(requested: str) -> str:
    """The evaluator backend for ``--task search_qa``: its episodes run on transformers ``generate``, so ``auto``
    means transformers (even where vLLM is installed); an explicit ``vllm`` is refused in one line."""
    if requested in ("auto", "transformers"):
        return "transformers"
    if requested == "vllm":
        raise ValueError("--task search_qa runs its multi-turn episodes with transformers; use --backend transformers "
                         "(or auto), not vllm.")
    raise ValueError(f"Unknown backend {requested!r}; choose auto, vllm or transformers.")


DEFAULT_EPISODE_LIMITS = {"max_obs_tokens": 500, "max_turn_tokens": 500}


def run_episode_limits(model: str) -> tuple[dict[str, int], str | None]:
    """``max_obs_tokens`` and ``max_turn_tokens`` of the run that trained ``model``: from ``search_args.json`` (written
    by the search rollout) or ``training_args.json`` in the model folder or, for a ``checkpoint-N``, its run folder;
    else SearchArguments' defaults (500 / 500). Returns (limits, the file they came from or None)."""
    import json
    from pathlib import Path

    from sharpgrpo.models.prepared import resolve_model_name
    from sharpgrpo.search.config import SEARCH_ARGS_JSON

    path = Path(resolve_model_name(model))
    for folder in (path, path.parent):
        for name in (SEARCH_ARGS_JSON, "training_args.json"):
            try:
                values = json.loads((folder / name).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            found = {k: values[k] for k in DEFAULT_EPISODE_LIMITS if isinstance(values.get(k), int) and values[k] > 0}
            if found:
                return {**DEFAULT_EPISODE_LIMITS, **found}, str(folder / name)
    return dict(DEFAULT_EPISODE_LIMITS), None


class SearchEvalGenerator:
    """Wraps the evaluator's ``TransformersGenerator``: ``generate(prompts, settings, seed)`` runs one Search-R1
    episode per prompt and returns the evaluator's sample dicts plus a ``search`` entry per sample."""

    def __init__(self, generator, client, search_args):
        from sharpgrpo.evaluation.generation import TransformersGenerator

        if not isinstance(generator, TransformersGenerator):
            raise TypeError("search_qa evaluates with the transformers backend; pass --backend transformers.")
        self.generator, self.client, self.search_args = generator, client, search_args

    def prompts_per_call(self, n: int) -> int:
        return self.generator.prompts_per_call(n)

    def generate(self, prompts: Sequence, settings, seed: int = 0) -> list[list[dict]]:
        import torch
        from transformers import GenerationConfig

        from sharpgrpo.evaluation.generation import encode_prompts

        if not settings.greedy:
            raise ValueError("search_qa is evaluated greedily (one episode per question).")
        tokenizer, model = self.generator.tokenizer, self.generator.model
        prompt_ids = encode_prompts(tokenizer, prompts, self.generator.apply_chat_template)
        config = GenerationConfig(do_sample=False, eos_token_id=self.generator.eos_ids, pad_token_id=self.generator.pad_id)
        backend = HFGenerateBackend(model, tokenizer, config)
        limits = SearchLimits.from_args(self.search_args, settings.max_new_tokens)
        torch.manual_seed(seed)
        episodes = run_episodes(
            prompt_ids, backend, lambda q: self.client.retrieve(q, limits.retrieval_topk), tokenizer, limits
        )
        samples = []
        for episode in episodes:
            samples.append(
                [
                    {
                        "text": tokenizer.decode(episode.completion_ids, skip_special_tokens=True),
                        "num_tokens": sum(episode.env_mask),
                        "truncated": episode.truncated,
                        "search": {
                            "turns": episode.turns,
                            "searches": episode.searches,
                            "queries": episode.queries,
                            "retrieved": episode.retrieved,
                            "end": episode.end_reason,
                        },
                    }
                ]
            )
        return samples


def search_summary(records: Sequence[dict]) -> dict[str, float | None]:
    """Mean turns and searches per question, and the share whose gold answer occurs in a retrieved passage."""
    from sharpgrpo.search.rollout import Episode

    info = [(r, r.get("search") or [None]) for r in records]
    rows = [(r, s[0]) for r, s in info if s[0] is not None]
    if not rows:
        return {"turns_mean": None, "searches_mean": None, "frac_answer_retrieved": None}
    hits = [
        answer_retrieved(Episode(retrieved=list(s["retrieved"])), r["reference"]["golden_answers"]) for r, s in rows
    ]
    return {
        "turns_mean": sum(s["turns"] for _, s in rows) / len(rows),
        "searches_mean": sum(s["searches"] for _, s in rows) / len(rows),
        "frac_answer_retrieved": sum(hits) / len(rows),
    }


def search_generator(search_args, generator, workdir, stack):
    """The search generator for ``evaluate``: a retrieval session for ``search_args`` (the task's parsed
    ``SearchArguments``, which ``SearchQATask.configure`` has checked name a server) entered on ``stack`` (stopped
    with it)."""
    from sharpgrpo.search.session import retrieval_session

    client = stack.enter_context(retrieval_session(search_args, workdir))
    return SearchEvalGenerator(generator, client, search_args)


@EVAL_TASKS.register("search_qa")
class SearchQATask(QATask):
    """Search QA with retrieval: the multi-turn Search-R1 rollout of training, greedy, against
    ``--retrieval_url`` or a server started from ``--retrieval_corpus``. ``data``: empty (the shared set's test
    split), ``shared:train|test|all``, or QA files / hub ids as for ``qa`` (rows without a prompt get Search-R1's)."""

    name = "search_qa"
    # Its options are the training setting's own (one declaration: sharpgrpo.search.config.SearchArguments).
    arguments = SearchArguments
    result_options = ("retrieval_url", "retrieval_corpus", "max_search_turns", "retrieval_topk", "max_obs_tokens",
                      "max_turn_tokens")

    def load_problems(self, config) -> list[Problem]:
        from sharpgrpo.evaluation.tasks import _expand_local, _limit, _read_records, qa_rows
        from sharpgrpo.search.data import search_qa_rows
        from sharpgrpo.search.format import make_prompt

        data = list(config.data) or ["shared:test"]
        problems = []
        for item in data:
            if item.startswith("shared:"):
                for row in search_qa_rows(item.split(":", 1)[1]):
                    problems.append(
                        Problem(id=f"{row['data_source']}/{row['id']}", group=row["data_source"], prompt=row["prompt"],
                                reference={"golden_answers": row["golden_answers"]})
                    )
                continue
            files = _expand_local(item)
            if files is not None:
                raw = [(r, path.stem) for path in files for r in _read_records(path)]
            else:
                import datasets

                raw = [(r, item.split("/")[-1]) for r in datasets.load_dataset(item, split=config.qa_split)]
            positions = defaultdict(int)
            for record, default_name in raw:
                record = dict(record)
                if record.get("prompt") is None and record.get("question") is not None:
                    record["prompt"] = make_prompt(record["question"])
                ((name, row),) = qa_rows([record], default_name)
                problems.append(Problem(id=f"{name}/{positions[name]}", group=name, prompt=row["prompt"],
                                        reference={"golden_answers": row["golden_answers"]}))
                positions[name] += 1
        return _limit(problems, config.limit)

    def summarize(self, records):
        summary = super().summarize(records)
        summary["search"] = search_summary(records)
        return summary

    def markdown(self, summary, label):
        from sharpgrpo.evaluation.report import percent

        search = summary["search"]
        table = super().markdown(summary, label).replace("closed-book (no retriever)", "with retrieval (Search-R1 rollout)")
        if search["turns_mean"] is None:
            return table
        return table + (
            f"Turns per question {search['turns_mean']:.2f}, searches per question {search['searches_mean']:.2f}, "
            f"gold answer in a retrieved passage for {percent(search['frac_answer_retrieved'], 1)}% of questions.\n"
        )

    # Hooks (sharpgrpo.settings): episodes on transformers, the run's episode limits, a retrieval session.
    def backend(self, requested: str) -> str:
        return search_backend(requested)

    def configure(self, config, given):
        super().configure(config, given)
        if not self.options.enabled:
            raise ValueError("--task search_qa needs --retrieval_url or --retrieval_corpus.")
        self.given = set(given)

    def prepare_config(self, config):
        """Episode limits not given: the evaluated run's own (its search_args.json), else SearchArguments' defaults."""
        import dataclasses
        import sys

        missing = [name for name in DEFAULT_EPISODE_LIMITS if name not in self.given]
        if not missing:
            return config
        limits, source = run_episode_limits(config.model)
        self.options = dataclasses.replace(self.options, **{name: limits[name] for name in missing})
        if config.progress:
            print(f"max_obs_tokens = {self.options.max_obs_tokens}, max_turn_tokens = {self.options.max_turn_tokens} "
                  f"({source or 'defaults'})", file=sys.stderr)
        return config

    def wrap_generator(self, config, generator, workdir, stack):
        return search_generator(self.options, generator, workdir, stack)
