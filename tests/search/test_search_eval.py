"""``sharpgrpo eval --task search_qa``: the greedy multi-turn rollout against a self-started server, with EM, turns,
searches and the answer-retrieved share in the result; and the shared set's reproducible split."""

import json

import pytest

from sharpgrpo.paths import shared_data_dir


@pytest.mark.skipif(shared_data_dir("qa") is None, reason="shared/data/qa is absent (set SHARPGRPO_SHARED_DIR)")
def test_shared_split_is_reproducible_and_disjoint():
    from sharpgrpo.data import load_train_dataset
    from sharpgrpo.search.data import search_qa_rows

    train, test = search_qa_rows("train"), search_qa_rows("test")
    assert len(train) == 150 and len(test) == 50
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert [r["id"] for r in search_qa_rows("test")] == [r["id"] for r in test]
    assert {r["id"] for r in search_qa_rows("test", seed=1)} != {r["id"] for r in test}
    dataset = load_train_dataset("search_qa", split="test", max_samples=3)
    assert len(dataset) == 3 and dataset[0]["prompt"].startswith("Answer the given question.")
    assert dataset[0]["prompt"].endswith("?\n") and "<search> query </search>" in dataset[0]["prompt"]


def test_search_qa_eval(tmp_path, search_model_path):
    pytest.importorskip("fastapi", reason="needs the `search` extra (fastapi, uvicorn, bm25s)")
    pytest.importorskip("bm25s", reason="needs the `search` extra (fastapi, uvicorn, bm25s)")
    from sharpgrpo.evaluation import evaluate
    model = search_model_path
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    data = tmp_path / "nq.jsonl"
    data.write_text(json.dumps({"question": "capital of France", "golden_answers": ["Paris"]}) + "\n")
    result = evaluate(model=str(model), task="search_qa", data=[str(data)], output=str(tmp_path / "out.json"),
                      retrieval_corpus=str(corpus), max_new_tokens=24, backend="transformers", progress=False)
    search = result["summary"]["search"]
    assert set(search) == {"turns_mean", "searches_mean", "frac_answer_retrieved"}
    assert search["turns_mean"] >= 1 and 0 <= search["frac_answer_retrieved"] <= 1
    assert result["summary"]["datasets"]["nq"]["exact_match"] in (0.0, 1.0)
    record = json.loads((tmp_path / "out.samples.jsonl").read_text().splitlines()[1])
    assert record["search"][0]["turns"] >= 1 and "with retrieval" in result["markdown"]
    with pytest.raises(ValueError, match="needs --retrieval_url or --retrieval_corpus"):
        evaluate(model=str(model), task="search_qa", data=[str(data)], output=str(tmp_path / "o2.json"),
                 max_new_tokens=8, backend="transformers", progress=False)


def test_eval_command_parses_the_settings_own_options(tmp_path, search_model_path):
    """``sharpgrpo eval`` takes search_qa's options from the setting's one declaration (SearchArguments): a limit
    given on the command line is used, one not given is the evaluated run's own (its search_args.json)."""
    pytest.importorskip("fastapi", reason="needs the `search` extra (fastapi, uvicorn, bm25s)")
    pytest.importorskip("bm25s", reason="needs the `search` extra (fastapi, uvicorn, bm25s)")
    import dataclasses
    import shutil

    from sharpgrpo.cli.eval import main
    from sharpgrpo.evaluation import EvalConfig
    from sharpgrpo.search.config import SearchArguments

    assert not {f.name for f in dataclasses.fields(SearchArguments)} & {f.name for f in dataclasses.fields(EvalConfig)}
    model = tmp_path / "run"
    shutil.copytree(search_model_path, model)
    (model / "search_args.json").write_text(json.dumps({"max_obs_tokens": 40, "max_turn_tokens": 12}))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
    data = tmp_path / "nq.jsonl"
    data.write_text(json.dumps({"question": "capital of France", "golden_answers": ["Paris"]}) + "\n")
    result = main(["--model", str(model), "--task", "search_qa", "--data", str(data), "--output",
                   str(tmp_path / "out.json"), "--retrieval_corpus", str(corpus), "--max_turn_tokens=8",
                   "--max_new_tokens", "24", "--no_progress"])
    options = result["task_options"]
    assert (options["max_turn_tokens"], options["max_obs_tokens"]) == (8, 40)  # given; the run's own
    assert options["retrieval_corpus"] == str(corpus) and options["max_search_turns"] == 4
    header = json.loads((tmp_path / "out.samples.jsonl").read_text().splitlines()[0])["settings"]
    assert (header["max_turn_tokens"], header["max_obs_tokens"]) == (8, 40)


def test_an_option_of_another_task_is_refused_in_one_line(tmp_path):
    from sharpgrpo.cli.eval import main
    from sharpgrpo.validation import ConfigError

    with pytest.raises(ConfigError, match=r"^retrieval_url='http://h:1': an option of --task search_qa; --task "
                                          r"addition does not take it\.$"):
        main(["--model", "sharpgrpo-tiny", "--task", "addition", "--output", str(tmp_path / "o.json"),
              "--retrieval_url", "http://h:1"])
    assert not (tmp_path / "o.json").exists()
