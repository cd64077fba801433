"""``<think>`` format reward of CW-GRPO (App. A: "a reward of 1.0 when the output contains properly matched <think>
tags"; METHODS.md §5).

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


_SEARCH_TAG = re.compile(r"</?(?:think|search|information|answer)>")
# Search-R1's state machine (`is_valid_sequence` of its `qa_em_format.py`): think, then any number of
# search -> information -> think rounds, then answer; only whitespace between a closing tag and the next opening.
_SEARCH_SEQUENCE = re.compile(
    r"<think>[^<]*</think>\s*(?:<search>[^<]*</search>\s*<information>.*?</information>\s*<think>[^<]*</think>\s*)*"
    r"<answer>[^<]*</answer>\s*",
    re.DOTALL,
)


def search_format_score(text: str) -> float:
    """1.0 for a whole Search-R1 episode (see ``search_format_reward``), 0.5 for a closed ``<answer>`` block at
    the end of an otherwise malformed text, else 0.0."""
    text = text.strip()
    if _SEARCH_SEQUENCE.fullmatch(text) is not None:
        return 1.0
    return 0.5 if re.search(r"<answer>[^<]*</answer>\s*$", text) else 0.0


@register_reward("search_format", columns=())
def search_format_reward(prompts, completions, **kwargs) -> list[float]:
    """Search-R1 format reward for multi-turn search episodes: 1.0 when the completion is ``<think>...</think>``,
    then zero or more ``<search>...</search> <information>...</information> <think>...</think>`` rounds, then
    ``<answer>...</answer>`` and nothing else (whitespace between blocks; no other tag inside ``think``, ``search``
    or ``answer``); 0.5 when the completion at least ends with a closed ``<answer>`` block; else 0.0.

    Gives the tiny search demo a learning signal that exact match alone (-1 for almost every answer) does not."""
    completions = as_list(completions)
    return [search_format_score(completion_text(c)) for c in completions]
