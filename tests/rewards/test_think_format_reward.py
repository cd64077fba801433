"""CW-GRPO's <think> format reward: TRL's think_format_reward rule, plus the prefill rule."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.rewards import think_format_reward as trl_think_format_reward

from reward_fns.format import think_format_reward


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>\nreasoning\n</think>\nanswer", 1.0),
        ("<think></think>", 1.0),
        ("<think>a</think>b</think>", 1.0),  # extra closings are tolerated, as in TRL
        ("<think>\nreasoning\nanswer", 0.0),  # never closed
        (" <think>a</think>", 0.0),  # must start the response
        ("<think>a<think>b</think>", 0.0),  # a second opening
        ("<think>a</think><think>b</think>", 0.0),
        ("answer", 0.0),
    ],
)
def test_rule(completion, expected):
    assert think_format_reward(prompts=["p"], completions=[completion]) == [expected]


def test_prefilled_think_is_prepended():
    prompt = "<|im_start|>assistant\n<think>"
    assert think_format_reward([prompt], [" reasoning </think> answer"]) == [1.0]
    assert think_format_reward([prompt], ["<think> reasoning </think> answer"]) == [0.0]
    assert think_format_reward(["no prefill"], [" reasoning </think> answer"]) == [0.0]


TEXT = st.lists(
    st.one_of(st.sampled_from(["<think>", "</think>", "\n", "<", ">", "\ud800"]), st.text(max_size=6)), max_size=12
).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
def test_parity_with_trl_without_prefill(text):
    conversational = [[{"role": "assistant", "content": text}]]
    assert think_format_reward(prompts=[[{"role": "user", "content": "q"}]], completions=conversational) == (
        trl_think_format_reward(conversational)
    )


@settings(max_examples=200, deadline=None)
@given(prompt=st.one_of(TEXT, st.none(), st.integers()), completion=st.one_of(TEXT, st.none(), st.integers()))
def test_never_raises(prompt, completion):
    assert think_format_reward(prompts=[prompt], completions=[completion])[0] in {0.0, 1.0}


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think> a </think>\n<answer> Paris </answer>", 1.0),
        ("<think> a </think>\n<search> q </search>\n\n<information>Doc 1(Title: \"P\") x</information>\n\n"
         "<think> b </think>\n<answer> Paris </answer>\n", 1.0),
        ("<think> a </think><search> q </search><information>x</information><answer> P </answer>", 0.5),  # no think
        ("<answer> Paris </answer>", 0.5),
        ("<think> a </think><answer> P </answer> more", 0.0),
        ("<think> a </think><search> q </search>", 0.0),
        ("", 0.0),
    ],
)
def test_search_format(completion, expected):
    from reward_fns import get_reward_function

    assert get_reward_function("search_format")(prompts=["p"], completions=[completion]) == [expected]
    assert get_reward_function("search_format")(["p"], [[{"role": "assistant", "content": completion}]]) == [expected]
