"""The ``addition`` task: single-digit addition asked through a chat model's template.

A real instruct model (``sharpgrpo-smol``) answers these right about half of the time at temperature 0.7 and most
groups of samples are mixed, so GRPO has a signal from the first step and learning is visible within minutes on a CPU.
The prompt asks for the number only; the reward (``reward_fns.addition``) reads the last number of the reply.

Columns: ``prompt`` (one user message, or the plain question with ``conversational=False``) and ``answer`` (a + b,
an int). Operands are drawn uniformly from ``0..max_operand``; with the default 9 there are only 100 distinct
questions, so training revisits them: the task measures whether RL sharpens what the model can already do, not
generalisation.
"""

from __future__ import annotations

import random

from sharpgrpo.data.registry import register_dataset
from sharpgrpo.validation import argument_rules, integer, one_of

ADDITION_PROMPT = "What is {a} + {b}? Answer with the number only."


def addition_question(a: int, b: int) -> str:
    return ADDITION_PROMPT.format(a=a, b=b)


@register_dataset("addition")
@argument_rules(num_prompts=integer(1), max_operand=integer(1), seed=integer(0), conversational=one_of(False, True))
def addition_dataset(num_prompts: int = 1000, max_operand: int = 9, seed: int = 0, conversational: bool = True):
    """``num_prompts`` questions ``a + b``, a and b uniform in ``0..max_operand`` (seeded); see the module doc."""
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(0, max_operand), rng.randint(0, max_operand)) for _ in range(num_prompts)]
    questions = [addition_question(a, b) for a, b in pairs]
    prompts = [[{"role": "user", "content": q}] for q in questions] if conversational else questions
    return Dataset.from_dict({"prompt": prompts, "answer": [a + b for a, b in pairs]})
