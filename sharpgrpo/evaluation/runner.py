"""``evaluate(EvalConfig)``: generate, judge, aggregate, and write the JSON result, a markdown table and the samples.

Files, for ``output = results/kk.json``:

* ``results/kk.json``: settings, summary metrics and the markdown table;
* ``results/kk.md``: the markdown table;
* ``results/kk.run_record.json``: the run record (the settings, command line, versions, commit, machine;
  `sharpgrpo.run.run_record`);
* ``results/kk.samples.jsonl``: one line per finished problem (completions, correctness), after a header line
  with the settings that determine the results. It is appended to as problems finish, so an interrupted
  evaluation resumes where it stopped: finished problem ids are skipped. Resuming with different settings is refused
  (use ``overwrite`` or another output).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharpgrpo.evaluation.generation import DecodingSettings, TransformersGenerator, VLLMGenerator
from sharpgrpo.evaluation.tasks import EVAL_TASKS, EvalTask, Problem
from sharpgrpo.models.source import check_model_source
from sharpgrpo.paths import write_text_atomically
from sharpgrpo.run.output_dir import check_output_files, claim_output_files
from sharpgrpo.run.run_record import RUN_RECORD, write_run_record
from sharpgrpo.validation import ConfigError, between, integer, one_of, positive, validate_fields

EVAL_COMMAND = "sharpgrpo eval"

# Settings that change the results; a resumed evaluation must match them. (limit, batch size, backend, progress and
# the output paths may change between runs.)
RESULT_SETTINGS = (
    "model",
    "task",
    "data",
    "kk_people",
    "prompt_format",
    "qa_split",
    "sampled_datasets",
    "n_samples",
    "max_new_tokens",
    "temperature",
    "top_p",
    "seed",
    "apply_chat_template",
    "merge",
)  # and the chosen task's own result options (EvalTask.result_options, e.g. search_qa's retrieval server and limits)


@dataclass
class EvalConfig:
    """Settings of ``sharpgrpo eval``; every field is a command-line flag of the same name. A task of a setting may take
    options of its own (``EvalTask.arguments``, e.g. search_qa's retrieval server and episode limits): they are flags
    too, and keyword arguments of ``evaluate``, not fields of this class."""

    model: str = field(
        metadata={"help": "`sharpgrpo-tiny`, a local model directory, a LoRA adapter directory, or a hub id."}
    )
    task: str = field(metadata={"help": "kk, math, qa, search_qa or addition."})
    output: str = field(
        metadata={"help": "Result JSON path; the markdown table (.md) and the samples (.samples.jsonl) go beside it."}
    )
    data: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Data: kk: empty (the seeded generator's published test split), shared:regen, shared:logicrl, "
            "local files/dirs/globs, or a hub id; math: data set names (olympiad_bench minerva math500 amc aime24, "
            "the default) or local files; qa: local files or hub ids (required)."
        },
    )
    kk_people: list[int] = field(
        default_factory=list, metadata={"help": "kk: numbers of people to evaluate (default 2-8)."}
    )
    prompt_format: str | None = field(
        default=None,
        metadata={
            "help": "kk: chat_string (Logic-RL's prompt, a string already in Qwen's ChatML), conversational or "
            "conversational_prefill (the same messages with the assistant turn opened by `<think>`, rendered by the "
            "model's own chat template). Default: chat_string, or conversational_prefill with --apply_chat_template "
            "true (which would otherwise wrap the ready chat string in a second template)."
        },
    )
    qa_split: str = field(default="test", metadata={"help": "qa: split of hub data sets."})
    sampled_datasets: list[str] = field(
        default_factory=lambda: ["amc", "aime24"],
        metadata={"help": "math: data sets scored by avg@n / pass@k from n_samples samples; the rest are greedy."},
    )
    n_samples: int = field(
        default=16, metadata={"help": "Samples per problem of the sampled data sets (the papers: 16)."}
    )
    limit: int | None = field(
        default=None,
        metadata={
            "help": "At most this many problems PER GROUP: per number of people for kk (`--limit 2` with the "
            "default 2-8 people evaluates 2 x 7 = 14 problems), per data set for math and qa. The progress bar "
            "counts the total."
        },
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Completion length limit. Default: the run's own `max_completion_length` (training_args.json "
            "that train.py saves beside the model and in each checkpoint), else the task's own (kk and math: the "
            "papers' 4096; qa and search_qa: Search-R1's 500; addition and strict_letters: 16), capped by the "
            "model's maximum length (max_position_embeddings)."
        },
    )
    temperature: float = field(
        default=0.6,
        metadata={
            "help": "Sampling temperature of the sampled data sets. The papers do not state their evaluation "
            "temperature; 0.6 with top_p 0.95 follows DeepScaleR's AIME/AMC evaluation."
        },
    )
    top_p: float = field(default=0.95, metadata={"help": "Nucleus sampling of the sampled data sets."})
    seed: int = field(default=0, metadata={"help": "Base seed of sampling."})
    backend: str = field(
        default="auto", metadata={"help": "auto (vLLM if installed and a GPU is present), vllm or transformers."}
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "help": "transformers: sequences per generate call (default 16 on a GPU, 1 on the CPU, where batching "
            "gains little and the progress bar then moves per problem); vLLM: problems per request (default 512). "
            "Finished problems are saved after each batch."
        },
    )
    dtype: str = field(default="auto", metadata={"help": "auto (bf16 on GPU, fp32 on CPU), float32, bfloat16."})
    device: str | None = field(default=None, metadata={"help": "transformers backend device (default: cuda if any)."})
    merge: bool = field(default=False, metadata={"help": "LoRA adapter: merge it into the base weights."})
    apply_chat_template: bool = field(
        default=False,
        metadata={"help": "Wrap string prompts as one user message and render the chat template (instruct models)."},
    )
    model_label: str | None = field(default=None, metadata={"help": "Row label in the tables (default: model)."})
    overwrite: bool = field(default=False, metadata={"help": "Discard the samples of an earlier run and start over."})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM: share of GPU memory it may use."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "vLLM: tensor-parallel GPUs."})
    max_model_len: int | None = field(default=None, metadata={"help": "vLLM: context length (default: the model's)."})
    def __post_init__(self):
        if self.task not in EVAL_TASKS:
            raise ConfigError(f"task={self.task!r}: Unknown task {self.task!r}; choose one of "
                              f"{', '.join(EVAL_TASKS.names())}.")  # fmt: skip
        validate_fields(self, EVAL_FIELD_RULES)
        for people in self.kk_people:
            integer(2).check("kk_people", people)
        if not str(self.output).strip():
            raise ConfigError("output='': give the result's path, e.g. --output results/kk.json.")
        output = Path(str(self.output)).expanduser()
        if output.is_dir():
            raise ConfigError(f"output={self.output!r}: is a folder; give a file path (x.json writes x.json, x.md "
                              "and x.samples.jsonl).")  # fmt: skip
        blocking = next((p for p in output.parents if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise ConfigError(f"output={self.output!r}: lies below {blocking}, which is a file.")
        self.data = [self.data] if isinstance(self.data, str) else list(self.data)
        if self.task == "kk" or self.prompt_format is None:  # other tasks ignore it
            self.prompt_format = kk_prompt_format(self.prompt_format, self.apply_chat_template)
        self.kk_people = [int(n) for n in self.kk_people]
        self.sampled_datasets = list(self.sampled_datasets)


# What each option of `sharpgrpo eval` accepts, checked when the configuration is built (before any file or model).
EVAL_FIELD_RULES = {
    "n_samples": integer(1),
    "limit": integer(1, allow_none=True),
    "max_new_tokens": integer(1, allow_none=True),
    "temperature": positive(note="the sampled data sets' temperature; the others are decoded greedily"),
    "top_p": between(0, 1, low_open=True),
    "seed": integer(0),
    "backend": one_of("auto", "vllm", "transformers"),
    "batch_size": integer(1, allow_none=True),
    "dtype": one_of("auto", "float32", "bfloat16", "float16"),
    "gpu_memory_utilization": between(0, 1, low_open=True),
    "tensor_parallel_size": integer(1),
    "max_model_len": integer(1, allow_none=True),
}


def kk_prompt_format(prompt_format: str | None, apply_chat_template: bool) -> str:
    """The K&K prompt format: the given one, else ``chat_string``, or ``conversational_prefill`` when the chat template
    is applied. ``chat_string`` is already a rendered chat (Qwen's ChatML); the template would nest a second one."""
    if prompt_format is None:
        return "conversational_prefill" if apply_chat_template else "chat_string"
    if prompt_format == "chat_string" and apply_chat_template:
        raise ValueError(
            "prompt_format=chat_string is a prompt already rendered in Qwen's chat template; apply_chat_template=true "
            "would wrap it in a second one. Use --prompt_format conversational_prefill (the same prompt through the "
            "model's own template) or conversational."
        )
    return prompt_format


PAPERS_MAX_NEW_TOKENS = 4096


def _model_max_length(path: Path) -> int | None:
    """``max_position_embeddings`` of a local model (or of a LoRA adapter's base), else None."""
    from sharpgrpo.evaluation.models import adapter_base_model

    base = adapter_base_model(str(path)) if path.is_dir() else None
    config_file = Path(base or path) / "config.json"
    try:
        value = json.loads(config_file.read_text(encoding="utf-8")).get("max_position_embeddings")
    except (OSError, json.JSONDecodeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def default_max_new_tokens(model: str, task: str | None = None) -> tuple[int, str]:
    """``(budget, where it comes from)``: the run's ``max_completion_length`` from ``training_args.json`` in the
    model folder or, for a ``checkpoint-N``, its run folder; else the task's own default
    (``EvalTask.default_max_new_tokens``; without a task the papers' 4096); capped by the model's maximum length."""
    from sharpgrpo.models.prepared import resolve_model_name

    path = Path(resolve_model_name(model))
    budget, source = PAPERS_MAX_NEW_TOKENS, f"the papers' {PAPERS_MAX_NEW_TOKENS}"
    if task is not None:
        budget = EVAL_TASKS.get(task).default_max_new_tokens
        source = f"the {task} task's default {budget}"
    for folder in (path, path.parent):
        args_file = folder / "training_args.json"
        try:
            value = json.loads(args_file.read_text(encoding="utf-8")).get("max_completion_length")
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(value, int) and value > 0:
            budget, source = value, f"max_completion_length in {args_file}"
            break
    limit = _model_max_length(path)
    if limit is not None and budget > limit:
        budget, source = limit, f"{source}, capped at the model's max_position_embeddings"
    return budget, source


def output_paths(output: str | os.PathLike) -> dict[str, Path]:
    """``{"json", "markdown", "samples", "record"}`` paths for ``output`` (``x.json`` or ``x`` -> x.json, x.md,
    x.samples.jsonl, and the run record x.run_record.json, `sharpgrpo.run.run_record`)."""
    base = str(output)
    base = base.removesuffix(".json")
    return {"json": Path(base + ".json"), "markdown": Path(base + ".md"), "samples": Path(base + ".samples.jsonl"),
            "record": Path(f"{base}.{RUN_RECORD}")}


def result_settings(config: EvalConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in RESULT_SETTINGS}


def load_finished(samples_path: Path, settings: dict[str, Any], overwrite: bool) -> dict[str, dict]:
    """Records of the problems an earlier run finished, keyed by id (a missing file or ``overwrite``: none)."""
    if overwrite or not samples_path.exists():
        return {}
    finished: dict[str, dict] = {}
    with open(samples_path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    if not lines:
        return {}
    header = json.loads(lines[0]).get("settings")
    if header != json.loads(json.dumps(settings)):
        changed = sorted(k for k in set(header or {}) | set(settings) if (header or {}).get(k) != settings.get(k))
        raise ValueError(
            f"{samples_path} was written with other settings (differing: {', '.join(changed)}); pass overwrite=True "
            "(--overwrite) to start over, or choose another output."
        )
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by an interruption: that problem is redone
            continue
        finished[record["id"]] = record
    return finished


def _chunks(problems: Sequence[Problem], size_of) -> list[list[Problem]]:
    """Consecutive chunks of problems with the same decoding, ``size_of(problem)`` problems each."""
    chunks: list[list[Problem]] = []
    for problem in problems:
        if chunks and chunks[-1][0].sampled == problem.sampled and len(chunks[-1]) < size_of(problem):
            chunks[-1].append(problem)
        else:
            chunks.append([problem])
    return chunks


def _problem_seed(base: int, problem_id: str) -> int:
    return (base * 1_000_003 + zlib.crc32(problem_id.encode())) % (2**31)


def build_generator(config: EvalConfig, workdir: Path, task: EvalTask | None = None):
    from sharpgrpo.evaluation.models import load_model_and_tokenizer, load_tokenizer, merged_model_directory

    task = task if task is not None else EVAL_TASKS.get(config.task)()
    backend = task.backend(config.backend)
    if backend == "vllm":
        path = merged_model_directory(config.model, workdir)
        return backend, VLLMGenerator(
            path,
            load_tokenizer(config.model),
            dtype=config.dtype,
            seed=config.seed,
            apply_chat_template=config.apply_chat_template,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            max_model_len=config.max_model_len,
        )
    model, tokenizer = load_model_and_tokenizer(config.model, config.device, config.dtype, config.merge)
    batch_size = config.batch_size or (16 if str(next(model.parameters()).device).startswith("cuda") else 1)
    return backend, TransformersGenerator(model, tokenizer, batch_size, config.apply_chat_template)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, text)


def evaluate(config: EvalConfig | None = None, **kwargs) -> dict[str, Any]:
    """Run an evaluation and return the result written to ``config.output``.

    ``evaluate(EvalConfig(...))`` or ``evaluate(model=..., task=..., output=..., ...)``; keyword arguments that are not
    ``EvalConfig`` fields are the task's own options (``EvalTask.arguments``, e.g. ``retrieval_corpus=...`` for
    ``search_qa``), refused in one line by a task that does not take them.
    """
    from tqdm.auto import tqdm

    names = {f.name for f in dataclasses.fields(EvalConfig)}
    options = {name: kwargs.pop(name) for name in list(kwargs) if name not in names}
    if config is None:
        config = EvalConfig(**kwargs)
    elif kwargs:
        config = dataclasses.replace(config, **kwargs)
    task: EvalTask = EVAL_TASKS.get(config.task)()
    task.configure(config, options)  # the task's own options, checked before any file or model
    # A missing local path or an unknown Hub id is refused with one line before any file is written or model loaded.
    check_model_source(config.model, field="--model")
    if config.max_new_tokens is None:
        budget, source = default_max_new_tokens(config.model, config.task)
        config = dataclasses.replace(config, max_new_tokens=budget)
        if config.progress:
            print(f"max_new_tokens = {budget} ({source})", file=sys.stderr)
    config = task.prepare_config(config)
    paths = output_paths(config.output)
    check_output_files(paths.values(), command=EVAL_COMMAND)  # a user's results/x.md is never replaced
    settings = {**result_settings(config), **task.option_settings()}
    problems = task.load_problems(config)
    if not problems:
        raise ValueError(f"No {config.task} problems to evaluate with data={config.data}.")
    if len({p.id for p in problems}) != len(problems):
        raise ValueError("Problem ids are not unique; give each data file a distinct name.")
    finished = load_finished(paths["samples"], settings, config.overwrite)
    todo = [p for p in problems if p.id not in finished]
    # Longest prompts first: similar lengths share a batch, and an out-of-memory error shows up at once.
    todo.sort(key=lambda p: (p.sampled, -len(json.dumps(p.prompt))))
    started = time.time()
    backend = None
    claim_output_files(paths.values(), command=EVAL_COMMAND)  # every input checked: these files are eval's
    if todo:
        paths["samples"].parent.mkdir(parents=True, exist_ok=True)
        if config.overwrite or not paths["samples"].exists() or paths["samples"].stat().st_size == 0:
            with open(paths["samples"], "w", encoding="utf-8") as handle:
                handle.write(json.dumps({"settings": settings}) + "\n")
        else:
            with open(paths["samples"], "rb+") as handle:  # end a line cut short by an interruption
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
        with tempfile.TemporaryDirectory(prefix="sharpgrpo-eval-") as workdir, contextlib.ExitStack() as stack:
            backend, generator = build_generator(config, Path(workdir), task)
            generator = task.wrap_generator(config, generator, workdir, stack)  # e.g. multi-turn episodes
            if hasattr(generator, "prompts_per_call"):
                size_of = lambda p: generator.prompts_per_call(config.n_samples if p.sampled else 1)
            else:
                size_of = lambda p: config.batch_size or 512
            bar = tqdm(
                total=len(problems), initial=len(problems) - len(todo), unit="problem", disable=not config.progress,
                desc=f"{config.task} eval",
            )  # fmt: skip
            with bar, open(paths["samples"], "a", encoding="utf-8") as handle:
                for chunk in _chunks(todo, size_of):
                    sampled = chunk[0].sampled
                    decoding = DecodingSettings(
                        max_new_tokens=config.max_new_tokens,
                        greedy=not sampled,
                        n=config.n_samples if sampled else 1,
                        temperature=config.temperature,
                        top_p=config.top_p,
                    )
                    outputs = generator.generate(
                        [p.prompt for p in chunk], decoding, seed=_problem_seed(config.seed, chunk[0].id)
                    )
                    texts = [[sample["text"] for sample in samples] for samples in outputs]
                    correct = task.score(chunk, texts)
                    for problem, samples, flags in zip(chunk, outputs, correct, strict=True):
                        record = {
                            "id": problem.id,
                            "group": problem.group,
                            "sampled": problem.sampled,
                            "reference": problem.reference,
                            "completions": [s["text"] for s in samples],
                            "num_tokens": [s["num_tokens"] for s in samples],
                            "truncated": [s["truncated"] for s in samples],
                            "correct": flags,
                        }
                        for key in samples[0].keys() - {"text", "num_tokens", "truncated"}:  # e.g. episode details
                            record[key] = [s[key] for s in samples]
                        handle.write(json.dumps(record, default=str) + "\n")
                        finished[problem.id] = record
                    handle.flush()
                    bar.update(len(chunk))
    records = [finished[p.id] for p in problems]
    summary = task.summarize(records)
    label = config.model_label or config.model
    markdown = task.markdown(summary, label)
    result = {
        "task": config.task,
        "model": config.model,
        "model_label": label,
        "settings": dataclasses.asdict(config),
        "task_options": dataclasses.asdict(task.options) if task.options is not None else {},
        "summary": summary,
        "num_problems": len(problems),
        "num_resumed": len(problems) - len(todo),
        "backend": backend,
        "seconds": round(time.time() - started, 3),
        "samples_file": paths["samples"].name,
        "markdown": markdown,
    }
    _write_atomic(paths["json"], json.dumps(result, indent=2, default=str) + "\n")
    _write_atomic(paths["markdown"], f"# {config.task} evaluation: {label}\n\n{markdown}")
    write_run_record(paths["record"], "sharpgrpo eval", {**result["settings"], "task_options": result["task_options"]})
    return result
