"""Search-R1 exact-match reward (docs/methods.md §5, GRPO-SG Eq. 20): +1 / -1 on SQuAD-normalised answers."""

import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.qa import normalize_answer, qa_em_reward


def reward(completion, golds):
    return qa_em_reward(prompts=["q"], completions=[completion], golden_answers=[golds])[0]


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("U.S.A.", "usa"),  # punctuation deleted without a space
        ("rock-n-roll", "rocknroll"),
        ("  an   apple\tand a pear ", "apple and pear"),
        ("Theatre", "theatre"),  # articles only as whole words
        ("Café", "café"),  # no accent folding
        ("“quoted”", "“quoted”"),  # only ASCII punctuation is removed
        ("A", ""),
    ],
)
def test_squad_normalisation(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize(
    ("completion", "golds", "expected"),
    [
        ("<think>..</think><answer> The Beatles </answer>", ["beatles"], 1.0),
        ("<answer>Paris</answer>", "Paris", 1.0),  # a string gold
        ("<answer>paris, france</answer>", ["Paris"], -1.0),
        ("<answer>London</answer> then <answer>Paris.</answer>", ["paris"], 1.0),  # the last answer counts
        ("<answer>Paris</answer> then <answer>London</answer>", ["paris"], -1.0),
        ("Paris", ["Paris"], -1.0),  # no answer tags
        ("<answer>Paris", ["Paris"], -1.0),  # not closed
        ("<answer>Rome</answer>", ["Paris", "Roma", "rome"], 1.0),  # any gold
        ("<answer>Rome</answer>", [], -1.0),
        ("<answer>Rome</answer>", {"target": ["rome"]}, 1.0),  # Search-R1's ground-truth dict
    ],
)
def test_exact_match(completion, golds, expected):
    assert reward(completion, golds) == expected


def test_the_example_answer_in_the_prompt_is_not_used():
    prompt = "Answer inside tags, e.g. <answer> Beijing </answer>. Question: capital of China?"
    assert qa_em_reward([prompt], ["I think it is Beijing"], golden_answers=[["Beijing"]]) == [-1.0]


def test_chat_completions_and_missing_gold():
    completions = [[{"role": "assistant", "content": "<answer>Paris</answer>"}], "<answer>Paris</answer>"]
    assert qa_em_reward(["q", "q"], completions, golden_answers=[["Paris"], None]) == [1.0, None]


ANY_TEXT = st.lists(
    st.one_of(st.sampled_from(["<answer>", "</answer>", "the", " a ", ".", "\ud800", "\x00"]), st.text(max_size=10)),
    max_size=20,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(
    completion=st.one_of(ANY_TEXT, st.lists(st.fixed_dictionaries({"content": ANY_TEXT}), max_size=2), st.none()),
    golds=st.one_of(ANY_TEXT, st.lists(st.one_of(ANY_TEXT, st.none(), st.integers()), max_size=3), st.integers()),
)
def test_never_raises_on_any_text(completion, golds):
    assert qa_em_reward(prompts=None, completions=[completion], golden_answers=[golds])[0] in {1.0, -1.0}


@settings(max_examples=200, deadline=None)
@given(gold=st.text(max_size=30).filter(lambda s: "answer>" not in s), noise=st.sampled_from(["", " ", "."]))
def test_a_tagged_gold_always_matches_itself(gold, noise):
    # Upper-casing is undone by the normalisation except for letters whose case mapping changes them (e.g. ß -> SS).
    shouted = gold.upper() if gold.upper().lower() == gold.lower() else gold
    assert reward(f"<answer>{noise}{shouted}{noise}</answer>", [gold]) == 1.0


def test_degenerate_outputs_are_scored_in_linear_time():
    start = time.monotonic()
    assert reward("<answer>" * 20000 + "Paris", ["Paris"]) == -1.0
    assert reward("<answer>" * 20000 + "Paris</answer>", ["Paris"]) == -1.0  # the block runs from the first tag
    assert time.monotonic() - start < 5.0


def test_punctuation_set_is_ascii():
    assert normalize_answer(string.punctuation) == ""
