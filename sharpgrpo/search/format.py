"""The Search-R1 text format (Jin et al. 2025; METHODS §6): prompt, search query, retrieved passages."""

from __future__ import annotations

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

def make_prompt(question: str) -> str:
    """Search-R1's prompt for ``question`` (stripped, with a final ``?`` added if missing, as Search-R1 does)."""
    question = question.strip()
    if question and question[-1] != "?":
        question += "?"
    return SEARCH_R1_PROMPT.format(question=question)


def extract_query(text: str) -> str | None:
    """The text between the last ``</search>`` of ``text`` and the last ``<search>`` before it, stripped; None if
    either tag is missing. (Search-R1's regex would return ``"a <search> b"`` for ``<search> a <search> b</search>``.)"""
    end = text.rfind(SEARCH_CLOSE)
    start = text.rfind(SEARCH_OPEN, 0, max(end, 0))
    if end < 0 or start < 0:
        return None
    return text[start + len(SEARCH_OPEN) : end].strip()


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
    """The observation appended after ``</search>`` (METHODS §6)."""
    return f"\n\n{INFO_OPEN}{passages.strip()}{INFO_CLOSE}\n\n"
