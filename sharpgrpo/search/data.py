"""The shared search-QA set (../shared/data/qa, SOURCES.md there): 200 questions whose answers are in a 9,002-passage
corpus, split reproducibly into train and test, with Search-R1's prompt."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sharpgrpo.paths import shared_data_dir
from sharpgrpo.search.format import make_prompt
from sharpgrpo.validation import argument_rules, between, integer, one_of

SHARED_CORPUS = "shared:qa"  # `retrieval_corpus` alias of the shared corpus
SPLIT_SEED = 0
TEST_FRACTION = 0.25


def shared_qa_dir() -> Path:
    path = shared_data_dir("qa")
    if path is None or not (path / "qa.jsonl").is_file():
        raise FileNotFoundError(
            "The shared search-QA data (shared/data/qa/qa.jsonl) was not found: set $SHARPGRPO_SHARED_DIR to the folder "
            "holding data/qa, or use Search-R1's parquet with column_mapping (see docs/search.md)."
        )
    return path


def resolve_corpus(corpus: str) -> str:
    """``shared:qa`` -> the shared corpus file; anything else is returned unchanged."""
    return str(shared_qa_dir() / "corpus.jsonl") if corpus == SHARED_CORPUS else corpus


def split_ids(ids: list[str], seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION) -> tuple[set, set]:
    """A reproducible train/test split of question ids, stratified by nothing but the seed (sorted ids, shuffled)."""
    order = sorted(ids)
    random.Random(seed).shuffle(order)
    n_test = round(len(order) * test_fraction)
    return set(order[n_test:]), set(order[:n_test])


def search_qa_rows(split: str = "train", seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION) -> list[dict]:
    """Rows ``{id, question, golden_answers, data_source, prompt}`` of one split (``train``, ``test`` or ``all``)."""
    if split not in ("train", "test", "all"):
        raise ValueError(f"search_qa split must be train, test or all; got {split!r}.")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1); got {test_fraction}.")
    with open(shared_qa_dir() / "qa.jsonl", encoding="utf-8") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    train, test = split_ids([str(r["id"]) for r in rows], seed, test_fraction)
    keep = {"train": train, "test": test, "all": train | test}[split]
    return [
        {
            "id": str(r["id"]),
            "question": r["question"],
            "golden_answers": list(r["golden_answers"]),
            "data_source": r.get("data_source", "qa"),
            "prompt": make_prompt(r["question"]),
        }
        for r in rows
        if str(r["id"]) in keep
    ]


@argument_rules(
    split=one_of("train", "test", "all"),
    seed=integer(0),
    test_fraction=between(0, 1, low_open=True, high_open=True),
    conversational=one_of(False, True),
    max_samples=integer(0, allow_none=True),
)
def search_qa_dataset(split: str = "train", seed: int = SPLIT_SEED, test_fraction: float = TEST_FRACTION,
                      conversational: bool = False, max_samples: int | None = None):
    """``datasets.Dataset`` of :func:`search_qa_rows`; ``conversational`` wraps the prompt as a user message."""
    import datasets

    rows = search_qa_rows(split, seed, test_fraction)[:max_samples]
    if conversational:
        for row in rows:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
    return datasets.Dataset.from_list(rows)
