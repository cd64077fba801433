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
from reward_fns._common import as_list, per_completion, scored_text

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
