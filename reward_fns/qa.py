"""Search-QA exact-match reward (Search-R1, Jin et al. 2025, ``verl/utils/reward_score/qa_em.py``; GRPO-SG Eq. 20;
docs/methods.md §5).

+1 if the normalised text of the last ``<answer>...</answer>`` in the completion equals any normalised gold answer,
else -1. Normalisation is SQuAD's ``normalize_answer`` as Search-R1 uses it: lower-case, delete ASCII punctuation
(``string.punctuation``) without inserting a space, replace the articles a/an/the by a space, collapse whitespace. No
accent folding. Only the completion is searched: Search-R1 scores prompt + response and therefore skips the first
``<answer>`` (the example in its prompt); here a completion without a closed answer tag simply scores -1.
"""

from __future__ import annotations

import re
import string
from typing import Any

from reward_fns import register_reward
from reward_fns._common import as_list, completion_text, last_tagged_block, per_completion

CORRECT, WRONG = 1.0, -1.0
ARTICLES = re.compile(r"\b(a|an|the)\b")
PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower, remove punctuation, remove articles, collapse whitespace (in that order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in PUNCTUATION)
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


def extract_answer(text: str) -> str | None:
    """Text of the last ``<answer>...</answer>`` block, or None."""
    return last_tagged_block(text, "<answer>", "</answer>")


def gold_answers(golden_answers: Any) -> list[str]:
    """Golds as a list of strings: a string, a list/tuple/array of strings, or Search-R1's ``{"target": [...]}``."""
    if isinstance(golden_answers, dict):
        golden_answers = golden_answers.get("target", list(golden_answers.values()))
    if golden_answers is None:
        return []
    if isinstance(golden_answers, str):
        return [golden_answers]
    if hasattr(golden_answers, "tolist"):
        golden_answers = golden_answers.tolist()
    if isinstance(golden_answers, (list, tuple, set)):
        return [str(gold) for gold in golden_answers if gold is not None]
    return [str(golden_answers)]


def exact_match(prediction: str, golden_answers: Any) -> bool:
    """Normalised ``prediction`` equals some normalised gold."""
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) == normalized for gold in gold_answers(golden_answers))


def qa_em_answer_check(prompts, completions, golden_answers, **kwargs) -> list[bool | None]:
    """Exact match of the last ``<answer>`` block (the reward's own test, as a verdict; None without a gold)."""
    completions = as_list(completions)
    golds = per_completion(golden_answers, len(completions))
    verdicts: list[bool | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        answer = None if gold is None else extract_answer(completion_text(completion))
        verdicts.append(None if gold is None else answer is not None and exact_match(answer, gold))
    return verdicts


@register_reward("qa_em", columns=("golden_answers",), answer_check=qa_em_answer_check)
def qa_em_reward(prompts, completions, golden_answers, **kwargs) -> list[float | None]:
    """+1 / -1 exact match of the last ``<answer>`` block against ``golden_answers`` (a string or a list per row).

    A row whose gold is None (another task's sample in a mixed dataset) gets None. Never raises on any text.
    """
    completions = as_list(completions)
    golds = per_completion(golden_answers, len(completions))
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        if gold is None:
            rewards.append(None)
            continue
        answer = extract_answer(completion_text(completion))
        rewards.append(CORRECT if answer is not None and exact_match(answer, gold) else WRONG)
    return rewards
