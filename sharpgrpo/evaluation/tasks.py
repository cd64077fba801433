"""The evaluation settings of the papers (docs/methods.md §5) and of the real-model demo: what problems, how a
completion is judged, and how results are aggregated into the papers' tables.

* ``kk``: Knights & Knaves accuracy per number of people (2-8) and overall, greedy, judged by the lenient
  ``reward_fns.kk.kk_correct`` (GRPO-SG Table 3);
* ``math``: greedy accuracy on OlympiadBench, Minerva and MATH-500; avg@n and pass@k (k = 1, 2, 4, ..., n) on AMC and
  AIME 2024 from n samples (GRPO-SG Table 1 reports avg@16 and AIME pass@16), judged by ``reward_fns.math.math_reward``;
* ``qa``: exact match per data set, judged by ``reward_fns.qa.qa_em_reward`` (GRPO-SG Table 2). This evaluator has no
  retrieval engine: a QA prompt is answered closed-book;
* ``addition``: single-digit sums through a chat template (the real-model demo's task), greedy, judged by
  ``reward_fns.addition.addition_correct``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from sharpgrpo.data.math import MATH_PROMPT
from sharpgrpo.evaluation.metrics import mean_avg_at_k, mean_pass_at_k, pass_k_values
from sharpgrpo.evaluation.report import fraction, markdown_table, percent
from sharpgrpo.registry import Registry
from sharpgrpo.settings import load_settings

EVAL_TASKS: Registry[type] = Registry("evaluation task", load=load_settings)  # settings add theirs (sharpgrpo.settings)

KK_PEOPLE = tuple(range(2, 9))
KK_SHARED_SOURCES = {"shared:regen": "regen", "shared:logicrl": "logicrl"}
KK_HUB_CONFIG = "test"  # K-and-K/knights-and-knaves: configs train/test, splits "{n}ppl"
MATH_DATASETS = ("olympiad_bench", "minerva", "math500", "amc", "aime24")  # the papers' table order
MATH_DISPLAY = {
    "olympiad_bench": "Olympiad Bench",
    "minerva": "Minerva",
    "math500": "MATH 500",
    "amc": "AMC",
    "aime24": "AIME",
}
# Search-R1's instruction without the search-engine sentences (this evaluator has no retriever).
QA_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. Then provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. "
    "Question: {question}\n"
)


@dataclass
class Problem:
    """One evaluation problem: ``group`` is its table column (``"3"`` people, ``"math500"``, ``"nq"``)."""

    id: str
    group: str
    prompt: Any
    reference: dict[str, Any]
    sampled: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def group_metrics(records: Sequence[dict]) -> dict[str, Any]:
    """``problems``, ``samples`` (n per problem), ``accuracy`` (avg@n; greedy accuracy when n = 1), and for n > 1
    ``avg@n`` and ``pass@k`` for k in :func:`pass_k_values`."""
    counts = [(len(r["correct"]), sum(bool(c) for c in r["correct"])) for r in records]
    samples = sorted({n for n, _ in counts})
    if len(samples) != 1:
        raise ValueError(f"Problems of one group have different sample counts {samples}; re-run with --overwrite.")
    n = samples[0]
    metrics: dict[str, Any] = {"problems": len(counts), "samples": n, "accuracy": mean_avg_at_k(counts)}
    if n == 1:
        metrics["correct"] = sum(c for _, c in counts)
    else:
        metrics[f"avg@{n}"] = metrics["accuracy"]
        metrics["pass@k"] = {str(k): mean_pass_at_k(counts, k) for k in pass_k_values(n)}
    return metrics


def records_by_group(records: Iterable[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        groups[record["group"]].append(record)
    return groups


def _limit(problems: list[Problem], limit: int | None) -> list[Problem]:
    """The first ``limit`` problems of every group (all when None)."""
    if limit is None:
        return problems
    kept, seen = [], defaultdict(int)
    for problem in problems:
        if seen[problem.group] < limit:
            kept.append(problem)
            seen[problem.group] += 1
    return kept


def _expand_local(item: str) -> list[Path] | None:
    """Files named by a local file, directory (its ``*.jsonl``/``*.json``/``*.parquet``) or glob; None if not local."""
    path = Path(item).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
        if not files:
            raise FileNotFoundError(f"No .jsonl/.json/.parquet files in {path}.")
        return files
    if any(ch in item for ch in "*?["):
        files = sorted(Path(p) for p in glob.glob(str(path)))
        if not files:
            raise FileNotFoundError(f"No files match {item!r}.")
        return files
    return None


def _read_records(path: Path) -> list[dict]:
    """Rows of a local ``.jsonl`` / ``.json`` / ``.parquet`` file as dicts."""
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    import datasets

    kind = {".json": "json", ".parquet": "parquet"}.get(path.suffix)
    if kind is None:
        raise ValueError(f"Unsupported data file {path} (use .jsonl, .json or .parquet).")
    # escaped: datasets reads data_files as a glob pattern; this is the file itself
    return list(datasets.load_dataset(kind, data_files=glob.escape(str(path)), split="train"))


def _nested(row: dict, dotted: str) -> Any:
    value: Any = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _option_names(task: type) -> set[str]:
    arguments = getattr(task, "arguments", None)
    return {f.name for f in dataclasses.fields(arguments)} if arguments is not None else set()


def task_argument_classes() -> tuple[type, ...]:
    """The options dataclasses of the registered evaluation tasks (each once), parsed by ``sharpgrpo eval``."""
    classes: list[type] = []
    for name in EVAL_TASKS.names():
        arguments = getattr(EVAL_TASKS.get(name), "arguments", None)
        if arguments is not None and arguments not in classes:
            classes.append(arguments)
    return tuple(classes)


class EvalTask:
    """Interface of an evaluation setting (see the module docstring)."""

    name: ClassVar[str]
    # The new-token budget when neither --max_new_tokens nor the evaluated run (its max_completion_length) gives one:
    # what an answer of this task needs, so a reply that loops stops there (the papers' 4096 for their reasoning tasks).
    default_max_new_tokens: ClassVar[int] = 4096

    def load_problems(self, config) -> list[Problem]:
        raise NotImplementedError

    def score(self, problems: Sequence[Problem], completions: Sequence[Sequence[str]]) -> list[list[bool]]:
        """Per problem, whether each of its completions is correct."""
        raise NotImplementedError

    def summarize(self, records: Sequence[dict]) -> dict[str, Any]:
        raise NotImplementedError

    def markdown(self, summary: dict[str, Any], label: str) -> str:
        raise NotImplementedError

    # A setting's own options: a dataclass (e.g. the search setting's SearchArguments, the one declaration train.py
    # parses too) whose fields `sharpgrpo eval` parses as flags beside EvalConfig's; None: the task takes none.
    arguments: ClassVar[type | None] = None
    # Those of its fields that change the results (a resumed evaluation must match them).
    result_options: ClassVar[tuple[str, ...]] = ()
    # The parsed options (an ``arguments`` instance, or None), set by ``configure`` before anything runs.
    options: Any = None

    def configure(self, config, given: dict[str, Any]) -> None:
        """Set ``self.options`` from the options the user gave (``given``: field -> value; the others keep their
        defaults). An option this task does not take is refused in one line naming it and the task."""
        from sharpgrpo.validation import ConfigError

        fields = {f.name for f in dataclasses.fields(self.arguments)} if self.arguments is not None else set()
        foreign = sorted(set(given) - fields)
        if foreign:
            owners = {name: task for task in EVAL_TASKS.names() for name in _option_names(EVAL_TASKS.get(task))}
            name = foreign[0]
            where = f"an option of --task {owners[name]}" if name in owners else "not an option of sharpgrpo eval"
            raise ConfigError(f"{name}={given[name]!r}: {where}; --task {config.task} does not take it.")
        self.options = self.arguments(**given) if self.arguments is not None else None

    def option_settings(self) -> dict[str, Any]:
        """The parsed options that change the results (``result_options``), for the samples file's header."""
        return {name: getattr(self.options, name) for name in self.result_options}

    # Hooks of a setting's task (sharpgrpo.settings); the defaults are single-turn generation.
    def backend(self, requested: str) -> str:
        """The evaluator backend (``auto``, ``vllm`` or ``transformers`` requested) this task runs on."""
        from sharpgrpo.evaluation.generation import choose_backend

        return choose_backend(requested)

    def prepare_config(self, config):
        """The configuration completed before anything runs (e.g. defaults read from the trained run)."""
        return config

    def wrap_generator(self, config, generator, workdir: str, stack):
        """The generator the evaluation uses: ``generator`` itself, or one wrapping it (e.g. multi-turn episodes);
        resources it needs are entered on ``stack`` (an ``ExitStack`` closed after the evaluation)."""
        return generator


# ----------------------------------------------------------------------------------------------------------------
# K&K
# ----------------------------------------------------------------------------------------------------------------
def _kk_row_from_record(raw: dict, prompt_format: str) -> dict:
    """A K&K row from the generator / HF schema or Logic-RL's verl schema (for hub and parquet sources)."""
    from sharpgrpo.data.kk import kk_prompt

    gold = raw.get("solution_text_format") or _nested(raw, "reward_model.ground_truth.solution_text_format")
    return {
        "quiz": raw["quiz"],
        "names": list(raw["names"]),
        "solution_text_format": gold,
        "index": int(raw.get("index", -1)),
        "n_people": len(raw["names"]),
        "prompt": kk_prompt(raw["quiz"], prompt_format),
    }


def load_kk_rows(
    data: Sequence[str],
    prompt_format: str = "chat_string",
    people: Sequence[int] = KK_PEOPLE,
    limit: int | None = None,
) -> list[tuple[str, dict]]:
    """``(source, row)`` pairs of K&K puzzles from ``data`` (see :class:`KKTask`)."""
    from sharpgrpo.data import kk

    people = list(people)
    pairs: list[tuple[str, dict]] = []
    if not data:
        # The project's seeded generator: indices 0-99 of the seed-1234 streams are the published K&K test split.
        for n in people:
            for row in kk.generate_puzzles(n, limit or kk.PUBLISHED_TEST_SIZE, prompt_format=prompt_format):
                pairs.append((f"generated-seed{kk.DEFAULT_SEED}", row))
        return pairs
    for item in data:
        if item in KK_SHARED_SOURCES:
            source = KK_SHARED_SOURCES[item]
            found, missing = False, None
            for n in people:
                try:
                    rows = kk.load_shared_kk(n, source=source, prompt_format=prompt_format)
                except FileNotFoundError as error:
                    missing = missing or error
                    continue
                found = True
                pairs += [(f"shared-{source}", row) for row in rows]
            if not found:
                raise FileNotFoundError(f"No shared K&K files for {item!r} and people {people}: {missing}")
            continue
        files = _expand_local(item)
        if files is not None:
            for path in files:
                if path.suffix == ".jsonl":
                    rows = kk.load_kk_file(path, prompt_format=prompt_format)
                else:
                    rows = [_kk_row_from_record(raw, prompt_format) for raw in _read_records(path)]
                pairs += [(path.stem, row) for row in rows]
            continue
        pairs += [(item, row) for row in _load_kk_hub(item, people, prompt_format)]
    return [(source, row) for source, row in pairs if row["n_people"] in people]


def _load_kk_hub(hub_id: str, people: Sequence[int], prompt_format: str) -> list[dict]:
    import datasets

    rows = []
    for n in people:
        try:
            split = datasets.load_dataset(hub_id, KK_HUB_CONFIG, split=f"{n}ppl")
        except ValueError:  # no such split (e.g. 8 people in a 2-7 people release)
            continue
        rows += [_kk_row_from_record(raw, prompt_format) for raw in split]
    if not rows:
        raise ValueError(f"No K&K rows found in {hub_id!r} (config {KK_HUB_CONFIG!r}, splits '<n>ppl').")
    return rows


@EVAL_TASKS.register("kk")
class KKTask(EvalTask):
    """Knights & Knaves. ``data``: empty (the project's seeded generator, which reproduces the published K&K test
    split, 100 puzzles per size), ``shared:regen`` / ``shared:logicrl`` (the shared files), local ``.jsonl`` /
    ``.parquet`` files, directories or globs in the K&K or Logic-RL schema, or a hub id (config ``test``, splits
    ``<n>ppl``, as K-and-K/knights-and-knaves)."""

    name = "kk"

    def load_problems(self, config) -> list[Problem]:
        people = list(config.kk_people) or list(KK_PEOPLE)
        rows = load_kk_rows(config.data, config.prompt_format, people, config.limit)
        problems = [
            Problem(
                id=f"{source}/{row['n_people']}ppl/{row['index'] if row['index'] >= 0 else position}",
                group=str(row["n_people"]),
                prompt=row["prompt"],
                reference={"solution_text_format": row["solution_text_format"]},
            )
            for position, (source, row) in enumerate(rows)
        ]
        return _limit(problems, config.limit)

    def score(self, problems, completions):
        from reward_fns.kk import kk_correct

        return [
            [bool(kk_correct(text, problem.reference["solution_text_format"])) for text in texts]
            for problem, texts in zip(problems, completions, strict=True)
        ]

    def summarize(self, records):
        groups = records_by_group(records)
        by_people = {g: group_metrics(groups[g]) for g in sorted(groups, key=int)}
        total = sum(m["problems"] for m in by_people.values())
        correct = sum(m["correct"] for m in by_people.values())
        return {
            "by_people": by_people,
            "overall": {"accuracy": correct / total if total else None, "correct": correct, "problems": total},
            "avg_over_people": (sum(m["accuracy"] for m in by_people.values()) / len(by_people))
            if by_people
            else None,
        }

    def markdown(self, summary, label):
        sizes = list(summary["by_people"])
        headers = ["Model"] + [f"{n} ppl" for n in sizes] + ["Avg.", "Overall"]
        row = [label] + [fraction(summary["by_people"][n]["accuracy"]) for n in sizes]
        row += [fraction(summary["avg_over_people"]), fraction(summary["overall"]["accuracy"])]
        counts = ", ".join(f"{n} ppl: {summary['by_people'][n]['problems']}" for n in sizes)
        return (
            "K&K accuracy (greedy, kk_correct). Avg. = mean over sizes (the papers' column); Overall = all puzzles.\n\n"
            + markdown_table(headers, [row])
            + f"\nPuzzles per size: {counts}.\n"
        )


# ----------------------------------------------------------------------------------------------------------------
# Math
# ----------------------------------------------------------------------------------------------------------------
def _math_rows_from_file(path: Path) -> list[dict]:
    """Rows (problem, answer, prompt) of a local math file: ``problem``/``question`` and ``answer`` columns, or the
    verl schema (``prompt`` messages and ``reward_model.ground_truth``)."""
    rows = []
    for raw in _read_records(path):
        answer = raw.get("answer", _nested(raw, "reward_model.ground_truth"))
        problem = raw.get("problem", raw.get("question"))
        prompt = raw.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and prompt[0].get("role") == "user":
            prompt = prompt[0]["content"]  # verl rows wrap the plain prompt in one user message
        if prompt is None:
            if problem is None:
                raise ValueError(f"{path}: a row has neither 'prompt' nor 'problem'/'question'.")
            prompt = MATH_PROMPT.format(problem=problem)
        if answer is None:
            raise ValueError(f"{path}: a row has no 'answer' or 'reward_model.ground_truth'.")
        rows.append({"problem": problem, "answer": answer, "prompt": prompt})
    return rows


@EVAL_TASKS.register("math")
class MathTask(EvalTask):
    """Math. ``data``: data set names (default: all of olympiad_bench, minerva, math500, amc, aime24, read by
    ``sharpgrpo.data.math.load_math_eval``) or local files (named by their stem). Data sets named in
    ``sampled_datasets`` (default amc, aime24) get ``n_samples`` samples each; the others are decoded greedily."""

    name = "math"

    def load_problems(self, config) -> list[Problem]:
        problems = []
        for item in config.data or list(MATH_DATASETS):
            files = _expand_local(item) if item not in MATH_DATASETS else None
            if files is None:
                from sharpgrpo.data.math import load_math_eval

                sources = [(item, load_math_eval(item))]
            else:
                sources = [(path.stem, _math_rows_from_file(path)) for path in files]
            for name, rows in sources:
                sampled = name in config.sampled_datasets
                for index, row in enumerate(rows):
                    problems.append(
                        Problem(
                            id=f"{name}/{index}",
                            group=name,
                            prompt=row["prompt"],
                            reference={"answer": row["answer"]},
                            sampled=sampled,
                        )
                    )
        return _limit(problems, config.limit)

    def score(self, problems, completions):
        from reward_fns.math import math_reward

        flat_prompts, flat_completions, flat_answers = [], [], []
        for problem, texts in zip(problems, completions, strict=True):
            flat_prompts += [problem.prompt] * len(texts)
            flat_completions += list(texts)
            flat_answers += [problem.reference["answer"]] * len(texts)
        rewards = math_reward(prompts=flat_prompts, completions=flat_completions, answer=flat_answers)
        scores, start = [], 0
        for texts in completions:
            scores.append([reward is not None and reward > 0 for reward in rewards[start : start + len(texts)]])
            start += len(texts)
        return scores

    def summarize(self, records):
        groups = records_by_group(records)
        order = [d for d in MATH_DATASETS if d in groups] + sorted(d for d in groups if d not in MATH_DATASETS)
        datasets = {}
        for name in order:
            metrics = group_metrics(groups[name])
            metrics["decoding"] = "greedy" if metrics["samples"] == 1 and not groups[name][0]["sampled"] else "sampled"
            datasets[name] = metrics
        return {"datasets": datasets, "paper_table": self._paper_columns(datasets)}

    @staticmethod
    def _paper_columns(datasets: dict[str, dict]) -> dict[str, float]:
        """GRPO-SG Table 1's columns that these results fill: greedy accuracy of the first three data sets, AMC
        avg@n, AIME pass@n and avg@n, and their mean (Avg.)."""
        columns: dict[str, float] = {}
        for name in ("olympiad_bench", "minerva", "math500"):
            if name in datasets:
                columns[MATH_DISPLAY[name]] = datasets[name]["accuracy"]
        if "amc" in datasets:
            columns[f"AMC avg@{datasets['amc']['samples']}"] = datasets["amc"]["accuracy"]
        if "aime24" in datasets:
            n = datasets["aime24"]["samples"]
            if n > 1:
                columns[f"AIME pass@{n}"] = datasets["aime24"]["pass@k"][str(n)]
            columns[f"AIME avg@{n}"] = datasets["aime24"]["accuracy"]
        if columns:
            columns["Avg."] = sum(columns.values()) / len(columns)
        return columns

    def markdown(self, summary, label):
        paper = summary["paper_table"]
        text = ""
        if paper:
            text += "Math accuracy (%), in the papers' table layout.\n\n"
            text += markdown_table(["Model"] + list(paper), [[label] + [percent(v) for v in paper.values()]]) + "\n"
        datasets = summary["datasets"]
        ks = sorted({int(k) for m in datasets.values() for k in m.get("pass@k", {})})
        headers = ["Data set", "Decoding", "Problems", "Samples", "Accuracy (avg@n)"] + [f"pass@{k}" for k in ks]
        rows = []
        for name, m in datasets.items():
            rows.append(
                [MATH_DISPLAY.get(name, name), m["decoding"], m["problems"], m["samples"], percent(m["accuracy"])]
                + [percent(m.get("pass@k", {}).get(str(k))) for k in ks]
            )
        text += "Per data set (%); pass@k is the unbiased estimator 1 - C(n-c,k)/C(n,k).\n\n"
        return text + markdown_table(headers, rows)


# ----------------------------------------------------------------------------------------------------------------
# QA
# ----------------------------------------------------------------------------------------------------------------
def qa_rows(records: Iterable[dict], default_name: str) -> list[tuple[str, dict]]:
    """``(data set, {"prompt", "golden_answers"})`` from Search-R1-style rows (``golden_answers``, ``question``,
    ``data_source``, optional ``prompt``) or plain ``question``/``answer(s)`` rows."""
    rows = []
    for raw in records:
        golds = raw.get("golden_answers")
        if golds is None:
            golds = _nested(raw, "reward_model.ground_truth.target")
        if golds is None:
            golds = raw.get("answers", raw.get("answer"))
        if golds is None:
            raise ValueError(f"A QA row of {default_name!r} has no golden_answers/answer(s): keys {sorted(raw)}.")
        prompt = raw.get("prompt")
        if prompt is None:
            if raw.get("question") is None:
                raise ValueError(f"A QA row of {default_name!r} has neither 'prompt' nor 'question'.")
            question = raw["question"].strip()
            prompt = QA_PROMPT.format(question=question if question.endswith("?") else question + "?")
        rows.append((raw.get("data_source") or default_name, {"prompt": prompt, "golden_answers": golds}))
    return rows


@EVAL_TASKS.register("qa")
class QATask(EvalTask):
    """Search QA exact match. ``data``: local files (.jsonl/.json/.parquet, directories, globs) or hub ids (split
    ``qa_split``). Rows are grouped by ``data_source`` when present (Search-R1's nq, hotpotqa, ...), else by source."""

    name = "qa"
    default_max_new_tokens = 500  # Search-R1's data.max_response_length (example/multinode/train_grpo_*.sh)

    def load_problems(self, config) -> list[Problem]:
        if not config.data:
            raise ValueError(
                "The qa task needs --data: local files or hub ids of QA rows (e.g. Search-R1's test sets)."
            )
        problems, positions = [], defaultdict(int)
        for item in config.data:
            files = _expand_local(item)
            if files is not None:
                pairs = [pair for path in files for pair in qa_rows(_read_records(path), path.stem)]
            else:
                import datasets

                pairs = qa_rows(datasets.load_dataset(item, split=config.qa_split), item.split("/")[-1])
            for name, row in pairs:
                problems.append(
                    Problem(
                        id=f"{name}/{positions[name]}",
                        group=name,
                        prompt=row["prompt"],
                        reference={"golden_answers": row["golden_answers"]},
                    )
                )
                positions[name] += 1
        return _limit(problems, config.limit)

    def score(self, problems, completions):
        from reward_fns.qa import qa_em_reward

        scores = []
        for problem, texts in zip(problems, completions, strict=True):
            rewards = qa_em_reward(
                prompts=[problem.prompt] * len(texts),
                completions=list(texts),
                golden_answers=[problem.reference["golden_answers"]] * len(texts),
            )
            scores.append([reward is not None and reward > 0 for reward in rewards])
        return scores

    def summarize(self, records):
        groups = records_by_group(records)
        datasets = {name: group_metrics(groups[name]) for name in groups}
        for metrics in datasets.values():
            metrics["exact_match"] = metrics["accuracy"]
        average = sum(m["exact_match"] for m in datasets.values()) / len(datasets) if datasets else None
        return {"datasets": datasets, "avg": average}

    def markdown(self, summary, label):
        names = list(summary["datasets"])
        headers = ["Model"] + names + ["Avg."]
        row = [label] + [percent(summary["datasets"][n]["exact_match"], 2) for n in names]
        row.append(percent(summary["avg"], 2))
        counts = ", ".join(f"{n}: {summary['datasets'][n]['problems']}" for n in names)
        return (
            "QA exact match (%), greedy, closed-book (no retriever).\n\n"
            + markdown_table(headers, [row])
            + f"\nQuestions per data set: {counts}.\n"
        )


# ----------------------------------------------------------------------------------------------------------------
# Addition
# ----------------------------------------------------------------------------------------------------------------
@EVAL_TASKS.register("addition")
class AdditionTask(EvalTask):
    """Single-digit addition through the chat template (``sharpgrpo.data.addition``): every pair a, b in 0..9 once,
    as one user message, greedy, judged by ``reward_fns.addition.addition_correct``. Grouped by whether the sum
    carries (a + b >= 10). ``data`` is not used."""

    name = "addition"
    GROUPS = ("no carry", "carry")
    default_max_new_tokens = 16  # a sum of two digits; smol_addition_demo trains with 12

    def load_problems(self, config) -> list[Problem]:
        from sharpgrpo.data.addition import addition_question

        if config.data:
            raise ValueError("The addition task asks every pair a, b in 0..9; it takes no --data.")
        problems = [
            Problem(
                id=f"{a}+{b}",
                group=self.GROUPS[a + b >= 10],
                prompt=[{"role": "user", "content": addition_question(a, b)}],
                reference={"answer": a + b},
            )
            for a in range(10)
            for b in range(10)
        ]
        return _limit(problems, config.limit)

    def score(self, problems, completions):
        from reward_fns.addition import addition_correct

        return [
            [bool(v) for v in addition_correct(None, list(texts), [problem.reference["answer"]] * len(texts))]
            for problem, texts in zip(problems, completions, strict=True)
        ]

    def summarize(self, records):
        groups = records_by_group(records)
        by_group = {name: group_metrics(groups[name]) for name in self.GROUPS if name in groups}
        total = sum(m["problems"] for m in by_group.values())
        correct = sum(m["accuracy"] * m["problems"] for m in by_group.values())
        return {"by_group": by_group, "overall": {"accuracy": correct / total if total else None, "problems": total}}

    def markdown(self, summary, label):
        names = list(summary["by_group"])
        headers = ["Model"] + names + ["Overall"]
        row = [label] + [percent(summary["by_group"][n]["accuracy"]) for n in names]
        row.append(percent(summary["overall"]["accuracy"]))
        counts = ", ".join(f"{n}: {summary['by_group'][n]['problems']}" for n in names)
        return (
            "Addition accuracy (%), greedy, last number of the reply = a + b.\n\n"
            + markdown_table(headers, [row])
            + f"\nQuestions per group: {counts}.\n"
        )
