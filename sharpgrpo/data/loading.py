"""Training data from a local file/folder or a Hugging Face Hub id, shaped for TRL and the reward functions.

Users plug their own data here: DeepScaleR, ORZ or open-rs for math (gold column ``answer``, read by ``math``),
NQ/HotpotQA in Search-R1's format for search QA (gold column ``golden_answers``, read by ``qa_em``), or any
jsonl/parquet file. Steps:

1. ``datasets.load_dataset``: a ``.jsonl``/``.json`` file with the ``json`` builder, ``.parquet`` with ``parquet``,
   a local folder or a hub id as given (``subset`` is the hub config name), split ``split``; ``max_samples`` keeps
   the first rows.
2. ``column_mapping`` (source -> target) renames columns. A dotted source reads a nested field, with integers
   indexing lists: ``{"reward_model.ground_truth": "answer"}`` for verl-format parquet files (DeepScaleR's, AR-Lopti's,
   Search-R1's), ``{"conversations.0.value": "prompt"}`` for turn lists such as ORZ's.
3. ``prompt_template`` (optional) builds the ``prompt`` column: a preset name from :data:`PROMPT_TEMPLATES`
   (``"math"``: ``"{prompt} Let's think step by step and output the final answer within \\boxed{}."``) or a string
   whose ``{column}`` placeholders are filled from the row after mapping. Only placeholders naming a column are
   replaced, so LaTeX braces such as ``\\boxed{}`` stay as written.
4. ``conversational=True`` wraps a string prompt into ``[{"role": "user", "content": prompt}]`` for TRL's chat
   template (instruct models); the default keeps plain strings (base models, as the math papers do).

Examples::

    # DeepScaleR or open-rs (columns problem, answer, ...): docs/methods.md §5 math prompt, no chat template
    load_train_dataset("agentica-org/DeepScaleR-Preview-Dataset", column_mapping={"problem": "prompt"},
                       prompt_template="math")
    # Search-R1's NQ/HotpotQA parquet (columns question, golden_answers, prompt = Search-R1's chat prompt)
    load_train_dataset("data/nq_hotpotqa_train/train.parquet")
    # Your own QA file with a template of your own
    load_train_dataset("qa.jsonl", column_mapping={"answers": "golden_answers"},
                       prompt_template="Answer inside <answer></answer>. Question: {question}", conversational=True)
"""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Any

from sharpgrpo.data.math import MATH_PROMPT_SUFFIX
from sharpgrpo.validation import argument_rules, integer, one_of

PROMPT_TEMPLATES = {"math": "{prompt}" + MATH_PROMPT_SUFFIX}
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def _read_nested(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) and key.lstrip("-").isdigit() else value[key]
    return value


def _fill_template(template: str, row: dict[str, Any]) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        return str(row[name]) if name in row else match.group(0)

    return _PLACEHOLDER.sub(replace, template)


def resolve_prompt_template(prompt_template: str) -> str:
    """A preset name (``math``) or a template string, returned as a template string."""
    return PROMPT_TEMPLATES.get(prompt_template, prompt_template)


@argument_rules(conversational=one_of(False, True), max_samples=integer(0, allow_none=True))
def load_dataset_source(
    path_or_hub_id: str,
    column_mapping: dict[str, str] | None = None,
    prompt_template: str | None = None,
    conversational: bool = False,
    split: str = "train",
    subset: str | None = None,
    max_samples: int | None = None,
):
    """Load and shape a dataset (see the module docstring); the result has a ``prompt`` column."""
    import datasets

    path = Path(path_or_hub_id)
    if path.is_file():
        builder = _FILE_BUILDERS.get("".join(path.suffixes[-1:]).lower())
        if builder is None:
            raise ValueError(f"Unsupported data file {path.name!r}; use .jsonl, .json or .parquet.")
        # escaped: datasets reads data_files as a glob pattern, so `prompts[v2].jsonl` would load `promptsv.jsonl`
        dataset = datasets.load_dataset(builder, data_files=glob.escape(str(path)), split=split)
    else:
        # A local folder or a hub id; offline, a hub id fails inside datasets with its own message.
        dataset = datasets.load_dataset(path_or_hub_id, subset, split=split)
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))

    column_mapping = dict(column_mapping or {})
    nested = {source: target for source, target in column_mapping.items() if "." in source}
    renames = {source: target for source, target in column_mapping.items() if "." not in source}
    missing = [source for source in renames if source not in dataset.column_names]
    missing += [source for source in nested if source.split(".")[0] not in dataset.column_names]
    if missing:
        raise ValueError(f"column_mapping sources {missing} are not columns of the data ({dataset.column_names}).")
    if nested:
        dataset = dataset.map(lambda row: {target: _read_nested(row, source) for source, target in nested.items()})
    if renames:
        # Drop targets that a rename overwrites, so {"problem": "prompt"} works when a "prompt" column exists too.
        overwritten = [t for s, t in renames.items() if t in dataset.column_names and t not in renames and t != s]
        dataset = dataset.remove_columns(overwritten).rename_columns(
            {source: target for source, target in renames.items() if source != target}
        )

    if prompt_template is not None:
        template = resolve_prompt_template(prompt_template)
        if not any(name in dataset.column_names for name in _PLACEHOLDER.findall(template)):
            raise ValueError(
                f"prompt_template {template!r} names no column of the data ({dataset.column_names}); "
                "use column_mapping to provide one (e.g. {'problem': 'prompt'} for the 'math' preset)."
            )

        def build_prompt(row: dict[str, Any]) -> dict[str, Any]:
            if "prompt" in row and not isinstance(row["prompt"], str) and "{prompt}" in template:
                raise ValueError("prompt_template applies to string prompts; this data has chat-message prompts.")
            return {"prompt": _fill_template(template, row)}

        dataset = dataset.map(build_prompt)

    if "prompt" not in dataset.column_names:
        raise ValueError(
            f"The data has no 'prompt' column ({dataset.column_names}); map one with column_mapping "
            "(e.g. {'question': 'prompt'}) or build it with prompt_template."
        )
    if conversational:
        dataset = dataset.map(
            lambda row: (
                {"prompt": [{"role": "user", "content": row["prompt"]}]}
                if isinstance(row["prompt"], str)
                else {"prompt": row["prompt"]}
            )
        )
    return dataset
