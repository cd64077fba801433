"""Shared math evaluation sets: loaders, normalised golds, the docs/methods.md §5 prompt, and agreement with math_reward."""

import json

import pytest

from reward_fns.math import math_reward, normalize_math_gold
from sharpgrpo.data import load_train_dataset
from sharpgrpo.data.math import MATH_PROMPT, MATH_PROMPT_SUFFIX, load_math_eval, math_prompt
from sharpgrpo.paths import shared_data_dir

MATH_DIR = shared_data_dir("math")
needs_shared_math = pytest.mark.skipif(MATH_DIR is None, reason="shared math data (shared/data/math) is not available")
SIZES = {
    "math500": 500,
    "aime24": 30,
    "amc": 83,
    "minerva": 272,
    "olympiad_bench": 675,
    "aime_2021_2024": 103,
    "amc_logicrl": 83,
}


def test_math_prompt_is_the_methods_prompt():
    expected = "What is 1+1? Let's think step by step and output the final answer within \\boxed{}."
    assert MATH_PROMPT.format(problem="What is 1+1?") == math_prompt("What is 1+1?") == expected


@needs_shared_math
@pytest.mark.parametrize(("name", "size"), SIZES.items())
def test_every_set_loads_with_normalised_golds(name, size):
    rows = load_math_eval(name)
    assert len(rows) == size
    for row in rows:
        assert set(row) == {"problem", "answer", "prompt"}
        assert row["prompt"] == row["problem"] + MATH_PROMPT_SUFFIX
        assert row["problem"] and not row["problem"].endswith(MATH_PROMPT_SUFFIX)
        assert row["answer"] and all(isinstance(gold, str) and gold == gold.strip() for gold in row["answer"])
        assert normalize_math_gold(row["answer"]) == row["answer"]


@needs_shared_math
def test_gold_shapes_are_normalised():
    aime = load_math_eval("aime24")
    raw = [json.loads(line)["reward_model"]["ground_truth"] for line in (MATH_DIR / "aime24_dsr.jsonl").open()]
    assert raw[1] == "025" and aime[1]["answer"] == ["25"]
    assert all(not gold.startswith("0") for row in aime for gold in row["answer"])
    assert load_math_eval("amc")[0]["answer"] == ["142"]  # float 142.0
    assert load_math_eval("minerva")[0]["answer"] == ["9.6"]  # ['9.6\n']
    olympiad = load_math_eval("olympiad_bench")
    assert olympiad[1]["answer"] == ["\\frac{1}{2 n+2}"]  # ['$\frac{1}{2 n+2}$']
    assert all("$" not in gold for row in olympiad[:50] for gold in row["answer"])


@needs_shared_math
@pytest.mark.parametrize("name", SIZES)
def test_math_reward_accepts_the_boxed_gold(name):
    """The first rows of each set: boxing the normalised gold scores 1, boxing a wrong number scores 0."""
    rows = load_math_eval(name)[:6]
    completions = [f"... so the answer is \\boxed{{{row['answer'][0]}}}." for row in rows]
    answers = [row["answer"] for row in rows]
    assert math_reward([row["prompt"] for row in rows], completions, answer=answers) == [1.0] * len(rows)
    assert math_reward(["p"] * len(rows), ["\\boxed{123456789}"] * len(rows), answer=answers) == [0.0] * len(rows)


@needs_shared_math
def test_math_eval_dataset():
    dataset = load_train_dataset("math_eval", name="aime24")
    assert len(dataset) == 30 and {"prompt", "answer", "problem"} <= set(dataset.column_names)
    assert isinstance(dataset[0]["prompt"], str) and dataset[1]["answer"] == ["25"]
    conversational = load_train_dataset("math_eval", name="amc", conversational=True)
    assert conversational[0]["prompt"] == [{"role": "user", "content": load_math_eval("amc")[0]["prompt"]}]


def test_unknown_set_is_an_error():
    with pytest.raises(ValueError, match="math500, aime24, amc, minerva, olympiad_bench"):
        load_math_eval("gsm8k")


def test_without_shared_data_the_message_says_where_to_put_the_files(monkeypatch):
    """A user's clone has no shared folder: math500/aime24/amc come from the Hub (offline here, so the error names
    the hub id and the file to put in place); minerva/olympiad_bench name the file and the folder."""
    import sharpgrpo.data.math as math_data

    monkeypatch.setattr(math_data, "shared_data_dir", lambda subdir="": None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"put minerva_dsr\.jsonl .*data/math/"):
        load_math_eval("minerva")
    with pytest.raises(FileNotFoundError, match=r"'HuggingFaceH4/MATH-500' \(split 'test'\) failed.*math500_h4\.jsonl"):
        load_math_eval("math500")
