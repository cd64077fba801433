"""``SearchArguments``: the options of the agentic search setting, parsed by ``train.py`` beside
``SharpGRPOConfig`` (TRL's ``TrlParser``) and by ``sharpgrpo eval`` as the ``search_qa`` task's own options."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from sharpgrpo.validation import ConfigError, integer, one_of, positive, validate_fields

RETRIEVERS = ("bm25", "dense")
SEARCH_ARGS_JSON = "search_args.json"  # a run's SearchArguments, beside its training_args.json
# What each option accepts (sharpgrpo.validation, the same layer as SharpGRPOConfig's FIELD_RULES).
SEARCH_FIELD_RULES = {
    "retriever": one_of(*RETRIEVERS),
    "invalid_action": one_of("retry", "end"),
    "max_search_turns": integer(1),
    "retrieval_topk": integer(1),
    "max_obs_tokens": integer(1),
    "max_turn_tokens": integer(1),
    "retrieval_retries": integer(1),
    "retrieval_timeout": positive(note="seconds"),
    "server_start_timeout": positive(note="seconds"),
}


@dataclass
class SearchArguments:
    """Multi-turn Search-R1 rollouts: a retrieval server and the limits of one episode.

    Search is on when ``retrieval_url`` or ``retrieval_corpus`` is set; otherwise training is single-turn as before.
    """

    retrieval_url: str | None = field(
        default=None,
        metadata={
            "help": "Base URL of a running Search-R1-compatible retrieval server (POST {url}/retrieve with "
            "{queries, topk, return_scores}), e.g. http://10.0.0.5:8000 for Search-R1's wiki-18 e5 server. "
            "Mutually exclusive with `retrieval_corpus`."
        },
    )
    retrieval_corpus: str | None = field(
        default=None,
        metadata={
            "help": "A corpus .jsonl ({id, contents: '\"Title\"\\ntext'} per line, Search-R1's format) that "
            "train.py/eval index and serve themselves on 127.0.0.1 (`sharpgrpo serve`), "
            "stopped on exit. `shared:qa` names the shared 9,002-passage corpus (data/qa/corpus.jsonl)."
        },
    )
    retriever: str = field(
        default="bm25",
        metadata={
            "help": "Index of a self-started server: `bm25` (bm25s, default) or `dense` (all-MiniLM-L6-v2 + faiss, "
            "the `search-dense` extra)."
        },
    )
    max_search_turns: int = field(
        default=4,
        metadata={
            "help": "Turns with an action per episode (Search-R1's max_turns): every turn counts, a search or an "
            "invalid turn retried; one last turn follows, in which a search or an invalid turn ends the episode (its "
            "text is kept, no retrieval)."
        },
    )
    retrieval_topk: int = field(
        default=3, metadata={"help": "Passages appended per search (Search-R1: k = 3)."}
    )
    max_obs_tokens: int = field(
        default=500,
        metadata={
            "help": "Most tokens of one <information> block (the end is cut, the closing tag kept). Observation "
            "tokens count against max_completion_length but get env_mask 0 (no loss, no strategy statistic). "
            "sharpgrpo eval: default the evaluated run's own (its search_args.json), else 500."
        },
    )
    max_turn_tokens: int = field(
        default=500,
        metadata={
            "help": "Most sampled tokens per turn (one generation call); everything also counts against "
            "max_completion_length (Search-R1: max_response_length per turn, max_obs_length per observation). "
            "sharpgrpo eval: default the evaluated run's own (its search_args.json), else 500."
        },
    )
    retrieval_timeout: float = field(
        default=30.0, metadata={"help": "Seconds one /retrieve request may take before it is retried."}
    )
    retrieval_retries: int = field(
        default=3,
        metadata={"help": "Attempts per /retrieve batch (with backoff) before training stops with an error."},
    )
    server_start_timeout: float = field(
        default=300.0,
        metadata={"help": "Seconds a self-started server may take to index the corpus and answer /health."},
    )
    stop_at_answer: bool = field(
        default=True,
        metadata={
            "help": "Stop a turn at </answer> as Search-R1 does, and append an end-of-sequence token with env_mask 0 "
            "(so TRL sees the episode as finished, and the model is not trained on a token it did not sample)."
        },
    )

    invalid_action: str = field(
        default="retry",
        metadata={
            "help": "A turn without a `<search>...</search>` or `<answer>...</answer>` pair (end of sequence, an "
            "unclosed or malformed tag, cut by max_turn_tokens): `retry` appends Search-R1's 'My previous action is "
            "invalid. ... Let me try again.' (env_mask 0) and lets the model continue, as Search-R1 does; `end` ends "
            "the episode there."
        },
    )

    def __post_init__(self):
        validate_fields(self, SEARCH_FIELD_RULES)
        if self.retrieval_url and self.retrieval_corpus:
            raise ConfigError(
                f"retrieval_url={self.retrieval_url!r}: give either retrieval_url (a running server) or "
                "retrieval_corpus (a server started here), not both."
            )

    @property
    def enabled(self) -> bool:
        return bool(self.retrieval_url or self.retrieval_corpus)


def save_search_args(search_args: SearchArguments, output_dir: str | Path) -> Path:
    """Write ``search_args.json`` into the run's output folder: ``sharpgrpo eval --task search_qa`` reads the episode
    limits (``max_obs_tokens``, ``max_turn_tokens``) of the run from it."""
    path = Path(output_dir) / SEARCH_ARGS_JSON
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataclasses.asdict(search_args), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
