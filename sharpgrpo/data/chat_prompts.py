"""Plain-string prompts given to a model whose tokenizer has a chat template.

TRL renders the tokenizer's chat template only for conversational prompts (lists of messages); a string prompt is
tokenised verbatim. An instruct model then sees text without its role markers, which it was never trained on, and
nothing says so. :func:`warn_if_template_unused` warns once in that case, naming the loader's ``conversational``
argument, unless the user chose either way or the strings already carry the template's markers (e.g. the K&K
``chat_string`` prompt, Logic-RL's prompt already in ChatML).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

_warned = False


def template_markers(tokenizer) -> list[str]:
    """The special tokens the tokenizer's chat template writes around a message (ChatML: ``<|im_start|>``, ...)."""
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    special = set(tokenizer.all_special_tokens)
    special |= {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
    return sorted(token for token in special if token and token in rendered)


def unused_template_message(
    dataset, tokenizer, dataset_name: str, dataset_kwargs: dict[str, Any], loader
) -> str | None:
    """Why the prompts of ``dataset`` will not go through the tokenizer's chat template, or None when they will, or
    when that is the user's choice (``conversational`` given) or the data's design (a loader without that option)."""
    if not getattr(tokenizer, "chat_template", None) or "conversational" in dataset_kwargs:
        return None
    if "conversational" not in inspect.signature(loader).parameters:
        return None
    markers = template_markers(tokenizer)
    prompts = dataset["prompt"][:64]
    plain = [p for p in prompts if isinstance(p, str) and not any(marker in p for marker in markers)]
    if not plain:
        return None
    return (
        f"dataset_name={dataset_name!r}: the prompts are plain strings, tokenised verbatim; the model's tokenizer has "
        "a chat template, which TRL applies only to conversational prompts. For an instruct model set "
        "dataset_kwargs `conversational: true` (each prompt becomes one user message); `conversational: false` "
        "keeps the plain strings without this warning."
    )


def warn_if_template_unused(dataset, tokenizer, dataset_name: str, dataset_kwargs: Any = None) -> None:
    """Warn once per process when plain-string prompts skip the tokenizer's chat template (see the module)."""
    global _warned
    from sharpgrpo.data.checks import dataset_loader, parse_dataset_kwargs

    message = unused_template_message(
        dataset, tokenizer, dataset_name, parse_dataset_kwargs(dataset_kwargs), dataset_loader(dataset_name)
    )
    if message is not None and not _warned:
        _warned = True
        warnings.warn(message, UserWarning, stacklevel=2)
