"""Every row of the training data is checked before the model loads, so a bad row fails at once, named, instead of
when a batch first draws it (possibly hours in).

* :func:`check_rows`: each ``prompt`` is a non-empty string or a non-empty list of chat messages, each a mapping with
  a ``role`` and a ``content``; every column a reward function reads has a value in at least one row.
* :func:`check_prompt_lengths` (after the tokenizer, before the model): each prompt, as TRL renders it (the chat
  template with the generation prompt for messages), fits the model's context with room for
  ``max_completion_length`` tokens; a chat template that fails on a row, or drops one of its messages (a role it does
  not know), is refused naming the row.

Rows count from 1, as the lines of a ``.jsonl`` file do.
"""

from __future__ import annotations

from typing import Any

from sharpgrpo.validation import ConfigError

_BATCH = 1024  # prompts tokenized at a time


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def prompt_problem(prompt: Any) -> str | None:
    """Why ``prompt`` cannot be trained on, or None."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "is empty"
    if not isinstance(prompt, list):
        name = type(prompt).__name__
        kind = "null" if prompt is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({_shown(prompt, 40)})"
        return f"is {kind}; a prompt is a non-empty string or a list of chat messages"
    if not prompt:
        return "is an empty list of messages"
    for index, message in enumerate(prompt):
        if not isinstance(message, dict):
            return f"message {index} is a {type(message).__name__}, not a {{role, content}} mapping"
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            return f"message {index} has no role (found {role!r})"
        content = message.get("content")
        if content is None:
            return f"message {index} ({role}) has no content"
        if not isinstance(content, (str, list)):
            return f"message {index} ({role}) has a {type(content).__name__} content, not text"
    if all(isinstance(m["content"], str) and not m["content"].strip() for m in prompt):
        return "has only empty messages"
    return None


def check_rows(dataset, label: str, reward_columns: dict[str, tuple[str, ...]] | None = None) -> None:
    """Refuse the first row whose prompt cannot be trained on, and a column a reward reads that is empty in every
    row. ``reward_columns``: reward function name -> the columns it reads."""
    if not hasattr(dataset, "__len__"):  # a streamed dataset is read as it trains
        return
    for index, prompt in enumerate(dataset["prompt"]):
        problem = prompt_problem(prompt)
        if problem is not None:
            raise ConfigError(f"{label}: row {index + 1}: prompt {_shown(prompt)} {problem}.")
    for name, columns in (reward_columns or {}).items():
        for column in columns:
            if column in dataset.column_names and all(value is None for value in dataset[column]):
                raise ConfigError(
                    f"{label}: column {column!r}, which reward function {name!r} reads, is empty (null) in every row."
                )


def model_context_length(model_path: str, revision: str | None = None) -> int | None:
    """The longest sequence the model's config declares (``max_position_embeddings`` or its aliases), or None."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, revision=revision)
    config = getattr(config, "text_config", None) or config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _rendered(tokenizer, prompt: Any, chat_template_kwargs: dict) -> str:
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **chat_template_kwargs)


def check_prompt_lengths(
    dataset,
    tokenizer,
    context: int | None,
    max_completion_length: int,
    label: str,
    chat_template_kwargs: dict | None = None,
) -> None:
    """Refuse the first row whose prompt the chat template cannot render faithfully, or whose tokens leave less
    than ``max_completion_length`` of the model's ``context``."""
    if not hasattr(dataset, "__len__"):
        return
    kwargs = dict(chat_template_kwargs or {})
    prompts = dataset["prompt"]
    budget = None if context is None else context - max_completion_length
    if budget is not None and budget < 1:
        raise ConfigError(
            f"max_completion_length={max_completion_length}: leaves no room for a prompt in the model's context of "
            f"{context} tokens."
        )
    for start in range(0, len(prompts), _BATCH):
        texts = []
        for index in range(start, min(start + _BATCH, len(prompts))):
            prompt = prompts[index]
            try:
                text = _rendered(tokenizer, prompt, kwargs)
            except Exception as error:  # noqa: BLE001 - reported with the row
                raise ConfigError(
                    f"{label}: row {index + 1}: the chat template cannot render prompt {_shown(prompt)} "
                    f"({type(error).__name__}: {' '.join(str(error).split())})."
                ) from None
            if not isinstance(prompt, str):
                dropped = next(
                    (m for m in prompt if isinstance(m["content"], str) and m["content"].strip() not in text), None
                )
                if dropped is not None:
                    raise ConfigError(
                        f"{label}: row {index + 1}: the chat template leaves out the {dropped['role']!r} message "
                        f"{_shown(dropped['content'], 40)} (a role it does not know?); use the roles it renders "
                        "(system, user, assistant)."
                    )
            texts.append(text)
        if budget is None:
            continue
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        for offset, length in enumerate(lengths):
            if length > budget:
                raise ConfigError(
                    f"{label}: row {start + offset + 1}: the prompt has {length} tokens; the model's context of "
                    f"{context} tokens minus max_completion_length={max_completion_length} leaves {budget}. Shorten "
                    "or drop the row, or lower max_completion_length."
                )
