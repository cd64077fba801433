"""load_train_dataset: registered names, local files with column mapping and prompt templates."""


import datasets
import pytest
from helpers import write_jsonl

from reward_fns.math import math_reward
from reward_fns.qa import qa_em_reward
from sharpgrpo.data import DATASETS, load_train_dataset
from sharpgrpo.data.math import MATH_PROMPT_SUFFIX


@pytest.fixture
def math_rows():
    return [{"problem": f"What is {i}+{i}?", "answer": str(2 * i), "level": i} for i in range(5)]


def test_registered_datasets():
    assert {"kk", "kk_shared", "math_eval"} <= set(DATASETS.names())


def test_jsonl_with_column_mapping_and_math_preset(tmp_path, math_rows):
    path = write_jsonl(tmp_path / "train.jsonl", math_rows)
    dataset = load_train_dataset(path, column_mapping={"problem": "prompt"}, prompt_template="math")
    assert dataset[3]["prompt"] == "What is 3+3?" + MATH_PROMPT_SUFFIX
    assert "problem" not in dataset.column_names and dataset[3]["answer"] == "6"
    # The dataset's columns feed the reward directly.
    assert math_reward(dataset["prompt"][:2], ["\\boxed{0}", "\\boxed{2}"], answer=dataset["answer"][:2]) == [1.0, 1.0]


def test_template_over_columns_keeps_latex_braces(tmp_path, math_rows):
    path = write_jsonl(tmp_path / "train.jsonl", math_rows)
    dataset = load_train_dataset(path, prompt_template="Level {level}: {problem} Put it in \\boxed{} {x}.")
    assert dataset[2]["prompt"] == "Level 2: What is 2+2? Put it in \\boxed{} {x}."
    assert dataset.column_names[:3] == ["problem", "answer", "level"]


def test_conversational_and_max_samples(tmp_path, math_rows):
    path = write_jsonl(tmp_path / "train.jsonl", math_rows)
    dataset = load_train_dataset(path, prompt_template="{problem}", conversational=True, max_samples=2)
    assert len(dataset) == 2
    assert dataset[0]["prompt"] == [{"role": "user", "content": "What is 0+0?"}]


def test_parquet_verl_rows_with_nested_gold(tmp_path):
    """verl-format rows (DeepScaleR/AR-Lopti parquet): chat prompt + reward_model.ground_truth."""
    rows = [
        {"prompt": [{"role": "user", "content": f"Q{i}"}], "reward_model": {"ground_truth": str(i), "style": "rule"}}
        for i in range(3)
    ]
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    dataset = load_train_dataset(str(path), column_mapping={"reward_model.ground_truth": "answer"})
    assert dataset[2]["answer"] == "2" and dataset[2]["prompt"] == [{"role": "user", "content": "Q2"}]


def test_dotted_sources_index_lists(tmp_path):
    """Turn lists such as ORZ's: [{"from": "human", "value": ...}, {"from": "assistant", "ground_truth": ...}]."""
    turns = [
        {"from": "human", "value": "1+1?", "ground_truth": None},
        {"from": "assistant", "value": None, "ground_truth": {"value": "2"}},
    ]
    path = write_jsonl(tmp_path / "orz.jsonl", [{"conversations": turns}])
    dataset = load_train_dataset(
        path, column_mapping={"conversations.0.value": "prompt", "conversations.1.ground_truth.value": "answer"}
    )
    assert dataset[0]["prompt"] == "1+1?" and dataset[0]["answer"] == "2"


def test_search_r1_qa_rows_from_a_folder(tmp_path):
    """NQ/HotpotQA in Search-R1's layout: question + golden_answers list."""
    folder = tmp_path / "nq"
    folder.mkdir()
    rows = [{"question": "capital of france?", "golden_answers": ["Paris", "paris, france"]}]
    write_jsonl(folder / "train.jsonl", rows)
    dataset = load_train_dataset(str(folder), prompt_template="Answer in <answer></answer> tags. Question: {question}")
    assert dataset[0]["prompt"].endswith("Question: capital of france?")
    assert qa_em_reward(dataset["prompt"], ["<answer>Paris</answer>"], golden_answers=dataset["golden_answers"]) == [
        1.0
    ]


def test_mapping_onto_an_existing_prompt_column(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "old", "problem": "new", "answer": "1"}])
    assert load_train_dataset(path, column_mapping={"problem": "prompt"})[0]["prompt"] == "new"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(), ValueError, "no 'prompt' column"),
        (dict(column_mapping={"question": "prompt"}), ValueError, "not columns of the data"),
        (dict(prompt_template="math"), ValueError, "names no column"),
        (dict(prompt_tmpl="math"), TypeError, "prompt_tmpl"),
    ],
)
def test_errors_say_what_to_fix(tmp_path, math_rows, kwargs, error, message):
    path = write_jsonl(tmp_path / "train.jsonl", math_rows)
    with pytest.raises(error, match=message):
        load_train_dataset(path, **kwargs)


def test_unsupported_file_and_offline_hub_id(tmp_path):
    text_file = tmp_path / "train.txt"
    text_file.write_text("x")
    with pytest.raises(ValueError, match=".jsonl, .json or .parquet"):
        load_train_dataset(str(text_file))
    with pytest.raises(ConnectionError):  # HF_HUB_OFFLINE: a hub id reaches datasets' own hub code
        load_train_dataset("no-such-org/no-such-dataset")
