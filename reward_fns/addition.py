"""Addition reward: 1.0 when the last number in the reply equals the gold sum, else 0.0 (the ``addition`` task of
``sharpgrpo.data.addition``). The reply may be "7", "3 + 4 = 7." or "The answer is 7.0"; a reply with no number, or
whose last number is another one ("7, not 8"), scores 0."""

from __future__ import annotations

import re

from reward_fns import register_reward
from reward_fns._common import as_list, completion_text, per_completion

CORRECT, WRONG = 1.0, 0.0
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (an integer or a decimal, a leading minus sign included), or None."""
    matches = _NUMBER.findall(text)
    return float(matches[-1]) if matches else None


def addition_correct(prompts, completions, answer, **kwargs) -> list[bool | None]:
    """Whether the last number of each reply equals the gold ``answer`` (None for a row without a numeric gold)."""
    completions = as_list(completions)
    golds = per_completion(answer, len(completions))
    verdicts: list[bool | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        try:
            gold = float(gold)
        except (TypeError, ValueError):
            verdicts.append(None)
            continue
        verdicts.append(last_number(completion_text(completion)) == gold)
    return verdicts


@register_reward("addition", columns=("answer",), answer_check=addition_correct)
def addition_reward(prompts, completions, answer, **kwargs) -> list[float | None]:
    """1.0 / 0.0 by :func:`addition_correct`; None for a row without a gold (another task's sample)."""
    return [None if v is None else (CORRECT if v else WRONG) for v in addition_correct(prompts, completions, answer)]
