"""The Search-R1 text format (Jin et al. 2025): prompt, search query, retrieved passages."""

from __future__ import annotations

import re
from collections.abc import Sequence

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
ANSWER_CLOSE = "</answer>"

# Search-R1's base-model prompt (`make_prefix`, template "base", in its `scripts/data_process/nq_search.py`).
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get new "
    "information. After reasoning, if you find you lack some knowledge, you can call a search engine by <search> "
    "query </search> and it will return the top searched results between <information> and </information>. You can "
    "search as many times as your want. If you find no further external knowledge needed, you can directly provide "
    "the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: {question}\n"
)

# Appended (env_mask 0) after a turn without a valid action, word for word Search-R1's `execute_predictions`
# (search_r1/llm_agent/generation.py): the model then gets another turn.
INVALID_ACTION_MESSAGE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
# An action: the first `<search>...</search>` or `<answer>...</answer>` pair of a turn (Search-R1's
# `postprocess_predictions`); the text between the tags may hold anything, other tags included.
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def parse_action(text: str) -> tuple[str | None, str]:
    """``("search" | "answer", stripped text between the tags)`` of the first action in ``text``; ``(None, "")``
    when there is none (an invalid turn)."""
    match = _ACTION.search(text)
    return (match.group(1), match.group(2).strip()) if match else (None, "")


def make_prompt(question: str) -> str:
    """Search-R1's prompt for ``question`` (stripped, with a final ``?`` added if missing, as Search-R1 does)."""
    question = question.strip()
    if question and question[-1] != "?":
        question += "?"
    return SEARCH_R1_PROMPT.format(question=question)


def split_title(contents: str) -> tuple[str, str]:
    """Search-R1's corpus ``contents``: the first line is the title, the rest the text."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(documents: Sequence[dict]) -> str:
    """``Doc i(Title: T) text`` lines, one per retrieved passage (Search-R1's ``_passages2string``)."""
    lines = []
    for index, item in enumerate(documents, start=1):
        document = item.get("document", item)
        title, text = split_title(str(document.get("contents", "")))
        lines.append(f"Doc {index}(Title: {title}) {text}")
    return "\n".join(lines)


def information_block(passages: str) -> str:
    """The observation appended after ``</search>`` (Search-R1's `execute_predictions`)."""
    return f"\n\n{INFO_OPEN}{passages.strip()}{INFO_CLOSE}\n\n"
