"""The demo task: write a word using only the letters the prompt allows.

A prompt names three allowed letters out of ``a``-``h``; the reward is the fraction of the first
``DEMO_WORD_LENGTH`` characters of the completion that are allowed (missing characters count as wrong). The
tiny model's warm start (``sharpgrpo.models.tiny``) teaches the format on solutions that follow the prompt only
part of the time, so it starts well below 1 and RL must learn to read the prompt reliably: learning is visible
within a few dozen steps on CPU.
"""

from __future__ import annotations

import itertools
import random

from sharpgrpo.validation import argument_rules, integer

DEMO_LETTERS = "abcdefgh"
DEMO_WORD_LENGTH = 8
WARM_START_FOLLOW_PROMPT = 0.4


def demo_prompt(allowed: str) -> str:
    return f"letters: {' '.join(allowed)}\nword:"


@argument_rules(num_prompts=integer(1), seed=integer(0))
def demo_dataset(num_prompts: int = 512, seed: int = 0):
    """A ``datasets.Dataset`` with ``prompt`` and ``allowed`` columns (every 3-letter subset, shuffled, cycled)."""
    from datasets import Dataset

    subsets = ["".join(c) for c in itertools.combinations(DEMO_LETTERS, 3)]
    rng = random.Random(seed)
    rows = []
    while len(rows) < num_prompts:
        rng.shuffle(subsets)
        rows.extend(subsets)
    rows = rows[:num_prompts]
    return Dataset.from_dict({"prompt": [demo_prompt(a) for a in rows], "allowed": rows})


def allowed_letters_reward(prompts, completions, allowed, **kwargs) -> list[float]:
    """Fraction of the first ``DEMO_WORD_LENGTH`` non-space characters of each completion that are allowed."""
    rewards = []
    for completion, letters in zip(completions, allowed, strict=True):
        if isinstance(completion, list):  # conversational: the last message's content
            completion = completion[-1]["content"] if completion else ""
        characters = "".join(completion.split())[:DEMO_WORD_LENGTH]
        rewards.append(sum(c in letters for c in characters) / DEMO_WORD_LENGTH)
    return rewards


def warm_start_texts(seed: int = 0, count: int = 2000, follow_prompt: float = WARM_START_FOLLOW_PROMPT) -> list[str]:
    """Synthetic, partly correct demo solutions: each letter is drawn from the allowed ones with probability
    ``follow_prompt``, else uniformly from ``a``-``h`` (so the warm-started model reads the prompt, imperfectly)."""
    rng = random.Random(seed)
    subsets = ["".join(c) for c in itertools.combinations(DEMO_LETTERS, 3)]
    texts = []
    for _ in range(count):
        allowed = rng.choice(subsets)
        word = "".join(
            rng.choice(allowed if rng.random() < follow_prompt else DEMO_LETTERS) for _ in range(DEMO_WORD_LENGTH)
        )
        texts.append(demo_prompt(allowed) + " " + word)
    return texts


def register_demo() -> None:
    """Register the demo task as dataset ``demo`` and reward function ``allowed_letters`` (idempotent)."""
    from reward_fns import REWARD_FUNCTIONS, register_reward
    from sharpgrpo.data import DATASETS

    if "demo" not in DATASETS:
        DATASETS.register("demo")(demo_dataset)
    if "allowed_letters" not in REWARD_FUNCTIONS:
        register_reward("allowed_letters", columns=("allowed",))(allowed_letters_reward)
