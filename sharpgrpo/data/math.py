"""Math evaluation sets (shared/data/math, see its SOURCES.md) and the math prompt of docs/methods.md §5.

Prompt (GRPO-SG App. B.1.1, used without a chat template for base models)::

    {problem} Let's think step by step and output the final answer within \\boxed{}.

``load_math_eval(name)`` returns ``[{"problem", "answer", "prompt"}, ...]`` where ``answer`` is the list of acceptable
golds normalised by ``reward_fns.math.normalize_math_gold`` (AIME '025' -> '25', AMC 142.0 -> '142', Minerva
alternatives without their trailing newlines, OlympiadBench ``$...$`` unwrapped), the same normalisation
``math_reward`` applies, so the golds can be fed back to it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reward_fns.math import normalize_math_gold
from sharpgrpo.data.registry import register_dataset
from sharpgrpo.paths import shared_data_dir
from sharpgrpo.validation import argument_rules, one_of

MATH_PROMPT_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
# A str.format template (the braces of \boxed{} doubled): MATH_PROMPT.format(problem=...) == math_prompt(...).
MATH_PROMPT = "{problem}" + MATH_PROMPT_SUFFIX.replace("{}", "{{}}")

# name -> (file in shared/data/math, format). "verl": DeepScaleR/AR-Lopti parquet rows (prompt messages ending in the
# math suffix, gold in reward_model.ground_truth); "logicrl": Logic-RL's math_eval files (question/problem, answer).
MATH_EVAL_SETS = {
    "math500": ("math500_h4.jsonl", "verl"),
    "aime24": ("aime24_dsr.jsonl", "verl"),
    "amc": ("amc_dsr.jsonl", "verl"),
    "minerva": ("minerva_dsr.jsonl", "verl"),
    "olympiad_bench": ("olympiad_bench_dsr.jsonl", "verl"),
    "aime_2021_2024": ("logicrl_aime_2021_2024.jsonl", "logicrl"),
    "amc_logicrl": ("logicrl_amc.jsonl", "logicrl"),
}


# Where the shared data is absent (a user's clone): the same problems from public Hugging Face datasets, loaded with
# `datasets.load_dataset(hub_id, split=split)` (columns `problem`, `answer`). Minerva and OlympiadBench have no
# fallback: their DeepScaleR files must be put in place (see `load_math_eval`).
MATH_EVAL_HUB = {
    "math500": ("HuggingFaceH4/MATH-500", "test"),
    "aime24": ("HuggingFaceH4/aime_2024", "train"),
    "amc": ("AI-MO/aimo-validation-amc", "train"),
}
# The provenance of each shared file (shared/data/math/SOURCES.md), for the message that says where to put it.
MATH_EVAL_SOURCES = {
    "math500": "HuggingFaceH4/MATH-500 in verl format (AR-Lopti data/math/MATH-500.parquet)",
    "aime24": "AR-Lopti data/deepscaler/aime.parquet",
    "amc": "AR-Lopti data/deepscaler/amc.parquet",
    "minerva": "AR-Lopti data/deepscaler/minerva.parquet",
    "olympiad_bench": "AR-Lopti data/deepscaler/olympiad_bench.parquet",
    "aime_2021_2024": "Logic-RL math_eval/aime_2021_2024.jsonl",
    "amc_logicrl": "Logic-RL math_eval/amc.jsonl",
}


def math_prompt(problem: str) -> str:
    """``{problem} Let's think step by step and output the final answer within \\boxed{}.``"""
    return problem + MATH_PROMPT_SUFFIX


def _problem_and_gold(raw: dict[str, Any], file_format: str) -> tuple[str, Any]:
    if file_format == "verl":
        content = raw["prompt"][0]["content"]
        if not content.endswith(MATH_PROMPT_SUFFIX):
            raise ValueError(f"Unexpected math prompt ending: {content[-80:]!r}")
        return content[: -len(MATH_PROMPT_SUFFIX)], raw["reward_model"]["ground_truth"]
    return raw.get("problem", raw.get("question")), raw["answer"]


def load_math_file(path: str | Path, file_format: str = "verl") -> list[dict[str, Any]]:
    """Rows ``{"problem", "answer", "prompt"}`` of one math evaluation file (see :data:`MATH_EVAL_SETS`)."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                problem, gold = _problem_and_gold(json.loads(line), file_format)
                rows.append({"problem": problem, "answer": normalize_math_gold(gold), "prompt": math_prompt(problem)})
    return rows


def load_math_eval(name: str) -> list[dict[str, Any]]:
    """A shared math evaluation set: math500, aime24, amc, minerva, olympiad_bench (also aime_2021_2024, amc_logicrl).

    Read from the shared data folder; where it is absent, math500, aime24 and amc come from their public Hub
    datasets (:data:`MATH_EVAL_HUB`); otherwise FileNotFoundError says which file to put where.
    """
    if name not in MATH_EVAL_SETS:
        raise ValueError(f"Unknown math evaluation set {name!r}; valid: {', '.join(MATH_EVAL_SETS)}.")
    file_name, file_format = MATH_EVAL_SETS[name]
    directory = shared_data_dir("math")
    if directory is not None and (directory / file_name).is_file():
        return load_math_file(directory / file_name, file_format)
    where = (
        f"put {file_name} (one JSON object per line; source: {MATH_EVAL_SOURCES[name]}) into "
        "$SHARPGRPO_SHARED_DIR/data/math/ or into shared/data/math/ beside the repository checkout"
    )
    if name not in MATH_EVAL_HUB:
        raise FileNotFoundError(f"The math evaluation set {name!r} is not available: {where}.")
    return load_math_hub(name, where)


def load_math_hub(name: str, where: str = "") -> list[dict[str, Any]]:
    """A math evaluation set from its public Hub dataset (:data:`MATH_EVAL_HUB`), as rows of :func:`load_math_file`."""
    import datasets

    hub_id, split = MATH_EVAL_HUB[name]
    try:
        rows = datasets.load_dataset(hub_id, split=split)
    except Exception as error:  # noqa: BLE001 - offline, no network, or the Hub refused: all end here
        raise FileNotFoundError(
            f"The math evaluation set {name!r} is not in the shared data folder, and loading it from the Hub as "
            f"{hub_id!r} (split {split!r}) failed ({type(error).__name__}: {str(error).splitlines()[0][:200]}). "
            f"Go online (unset HF_HUB_OFFLINE), or {where}."
        ) from None
    return [
        {"problem": row["problem"], "answer": normalize_math_gold(row["answer"]), "prompt": math_prompt(row["problem"])}
        for row in rows
    ]


@register_dataset("math_eval")
@argument_rules(name=one_of(*MATH_EVAL_SETS), conversational=one_of(False, True))
def math_eval_dataset(name: str = "math500", conversational: bool = False):
    """A shared math evaluation set as a dataset: ``prompt`` (string, or one user message), ``problem``, ``answer``
    (list of acceptable golds, the column ``math_reward`` reads)."""
    import datasets

    rows = load_math_eval(name)
    if conversational:
        rows = [dict(row, prompt=[{"role": "user", "content": row["prompt"]}]) for row in rows]
    return datasets.Dataset.from_list(rows)
