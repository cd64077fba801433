"""``<think>`` format reward of CW-GRPO (App. A: "a reward of 1.0 when the output contains properly matched <think>
tags"; docs/methods.md §5).

CW-GRPO trains with TRL on Open-RS, so the rule is TRL's ``trl.rewards.think_format_reward``: 1.0 if the text starts
with ``<think>``, contains no second ``<think>`` and closes it with ``</think>`` (anything may follow), else 0.0.
Unlike TRL's function it accepts string or chat completions and, when the prompt already opened ``<think>`` in the
assistant turn, scores ``"<think>" + completion`` (the same prefill rule as the K&K reward). A test checks parity
with TRL's function on prompts without prefill.
"""

from __future__ import annotations

import re

from reward_fns import register_reward
from reward_fns._common import as_list, completion_text, per_completion, scored_text

THINK_FORMAT = re.compile(r"<think>(?!.*<think>)(.*?)</think>.*", re.DOTALL)


def has_think_format(text: str) -> bool:
    """Starts with ``<think>``, has no other ``<think>``, and has a ``</think>`` after it."""
    return THINK_FORMAT.match(text) is not None


@register_reward("think_format", columns=())
def think_format_reward(prompts, completions, **kwargs) -> list[float]:
    """1.0 for a properly opened and closed ``<think>`` block at the start of the response, else 0.0."""
    completions = as_list(completions)
    prompts = per_completion(prompts, len(completions))
    return [1.0 if has_think_format(scored_text(p, c)) else 0.0 for p, c in zip(prompts, completions, strict=True)]


# --------------------------------------------------------------------------------------------------------------
# Search-R1's multi-turn format


_SEARCH_TAG = re.compile(r"(</?(?:think|search|information|answer)>)")
# Search-R1's state machine (`is_valid_sequence` in its `verl/utils/reward_score/qa_em_format.py`): for each state,
# the tags it accepts and the state each leads to. Any text may stand inside a block (other tags excepted, since every
# tag is a transition); between blocks only whitespace.
_TRANSITIONS = {
    "start": {"<think>": "in_think"},
    "in_think": {"</think>": "after_think"},
    "after_think": {"<search>": "in_search", "<answer>": "in_answer"},
    "in_search": {"</search>": "after_search"},
    "after_search": {"<information>": "in_information"},
    "in_information": {"</information>": "after_information"},
    "after_information": {"<think>": "in_think"},
    "in_answer": {"</answer>": "end"},
    "end": {},
}
_INSIDE_A_BLOCK = {"in_think", "in_search", "in_information", "in_answer"}


def is_search_r1_sequence(text: str) -> bool:
    """Whether ``text`` (the response after the assistant marker) is ``<think>...</think>``, then any number of
    ``<search>...</search> <information>...</information> <think>...</think>`` rounds, then
    ``<answer>...</answer>``, as Search-R1's format check decides."""
    state = "start"
    for piece in _SEARCH_TAG.split(text):
        if not piece.strip():
            continue
        if _SEARCH_TAG.fullmatch(piece):
            state = _TRANSITIONS[state].get(piece)
            if state is None:
                return False
        elif state not in _INSIDE_A_BLOCK:
            return False
    return state == "end"


def search_format_score(text: str) -> float:
    """1.0 for a whole Search-R1 episode (``is_search_r1_sequence``), 0.5 for an otherwise malformed text that ends
    with a closed ``<answer>`` block, else 0.0."""
    if is_search_r1_sequence(text):
        return 1.0
    text = text.rstrip()
    return 0.5 if text.endswith("</answer>") and "<answer>" in text[: -len("</answer>")] else 0.0


@register_reward("search_format", columns=())
def search_format_reward(prompts, completions, **kwargs) -> list[float]:
    """Search-R1 format reward for multi-turn search episodes: 1.0 when the completion is ``<think>...</think>``,
    then zero or more ``<search>...</search> <information>...</information> <think>...</think>`` rounds, then
    ``<answer>...</answer>`` and nothing else (whitespace between blocks; inside a block any text but these four
    tags), exactly Search-R1's ``is_valid_sequence`` on the text after the assistant marker; 0.5 when the completion
    at least ends with a closed ``<answer>`` block; else 0.0.

    Gives the tiny search demo a learning signal that exact match alone (-1 for almost every answer) does not."""
    completions = as_list(completions)
    return [search_format_score(completion_text(c)) for c in completions]
