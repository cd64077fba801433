"""Helpers shared by the reward functions: turning TRL's prompts/completions and columns into plain values.

TRL calls a reward function as ``f(prompts=..., completions=..., completion_ids=..., **columns)``. Prompts and
completions are strings (standard format) or lists of chat messages (conversational format), and every dataset column
arrives as a list repeated once per completion. These helpers accept anything without raising, so a malformed batch
scores as wrong instead of stopping training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

THINK_OPEN = "<think>"


def _content_text(content: Any) -> str:
    """Text of a message ``content``: a string, or a list of parts such as ``{"type": "text", "text": ...}``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """The generated text: the string itself, or the concatenated contents of the completion's messages."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, (list, tuple)):
        return "".join(
            _content_text(message.get("content")) if isinstance(message, dict) else _content_text(message)
            for message in completion
        )
    try:
        return str(completion)
    except Exception:  # an object whose __str__ raises still must not stop training
        return ""


def assistant_prefill(prompt: Any) -> str:
    """Text the prompt has already put into the assistant turn, which the model continues.

    A string prompt is itself that text (a chat-formatted string ends inside the assistant turn). A conversational
    prompt has a prefill only when its last message is an assistant message, which TRL continues
    (``continue_final_message``); a prompt ending in a user message opens a fresh assistant turn.
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)) and prompt:
        last = prompt[-1]
        if isinstance(last, dict) and last.get("role") == "assistant":
            return _content_text(last.get("content"))
    return ""


def opens_think(prompt: Any) -> bool:
    """Whether the prompt ends with an opened ``<think>`` (Logic-RL's pre-filled assistant turn)."""
    return assistant_prefill(prompt).rstrip().endswith(THINK_OPEN)


def scored_text(prompt: Any, completion: Any) -> str:
    """``"<think>" + completion`` when the prompt pre-filled ``<think>``, else the completion as is."""
    text = completion_text(completion)
    return THINK_OPEN + text if opens_think(prompt) else text


def per_completion(values: Any, count: int) -> list[Any]:
    """A column as one value per completion: lists of the right length pass through, anything else is broadcast.

    TRL always passes lists of length ``count``; a missing column (None) or a single value is repeated, and a list of
    the wrong length is padded with None so that every completion still gets a score.
    """
    if hasattr(values, "tolist") and not isinstance(values, str):  # numpy arrays and scalars
        values = values.tolist()
    if isinstance(values, Sequence) and not isinstance(values, str):
        values = list(values)
        if len(values) == count:
            return values
        if len(values) == 1:
            return values * count
        return (values + [None] * count)[:count]
    return [values] * count


def as_list(values: Any) -> list[Any]:
    """Completions (or prompts) as a list of items.

    A batch is a list; a lone string, or a lone conversation (a list of message dicts), counts as one item; None as
    none.
    """
    if values is None:
        return []
    if isinstance(values, str):
        return [values]
    if hasattr(values, "tolist"):  # numpy arrays
        values = values.tolist()
    if not isinstance(values, Sequence):
        return [values]
    values = list(values)
    if values and all(isinstance(item, dict) for item in values):
        return [values]
    return values


def last_tagged_block(text: str, opening: str, closing: str) -> str | None:
    """Content of the last ``opening ... closing`` block, or None.

    The same block as the last match of ``re.finditer(opening + "(.*?)" + closing, text, re.DOTALL)`` (the rule of
    Logic-RL and Search-R1), found in linear time: that regex takes quadratic time on degenerate outputs such as a
    completion repeating ``<answer>`` thousands of times.
    """
    last = None
    position = 0
    while True:
        start = text.find(opening, position)
        if start < 0:
            return last
        end = text.find(closing, start + len(opening))
        if end < 0:
            return last
        last = text[start + len(opening) : end]
        position = end + len(closing)
