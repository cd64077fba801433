"""SearchArguments validation and parsing beside the other dataclasses of train.py."""

import math

import pytest

from sharpgrpo.search.config import SearchArguments


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_search_turns", 0, "integer >= 1"),
        ("retrieval_topk", -1, "integer >= 1"),
        ("max_obs_tokens", 2.5, "integer >= 1"),
        ("max_turn_tokens", True, "integer >= 1"),
        ("retrieval_timeout", math.inf, "finite number"),
        ("retrieval_timeout", 0, "finite number"),
        ("server_start_timeout", math.nan, "finite number"),
        ("retriever", "splade", "must be one of bm25, dense"),
    ],
)
def test_invalid_values_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        SearchArguments(**{field: value})


def test_url_and_corpus_are_exclusive_and_enable_search():
    assert not SearchArguments().enabled
    assert SearchArguments(retrieval_corpus="c.jsonl").enabled and SearchArguments(retrieval_url="http://h:1").enabled
    with pytest.raises(ValueError, match="not both"):
        SearchArguments(retrieval_url="http://h:1", retrieval_corpus="c.jsonl")


def test_train_parser_reads_search_fields(tmp_path):
    from trl import TrlParser

    config = tmp_path / "c.yaml"
    config.write_text("retrieval_url: http://127.0.0.1:9\nmax_search_turns: 2\n")
    (args,) = TrlParser((SearchArguments,)).parse_args_and_config(
        args=["--config", str(config), "--retrieval_topk", "5"]
    )
    assert (args.retrieval_url, args.max_search_turns, args.retrieval_topk) == ("http://127.0.0.1:9", 2, 5)
