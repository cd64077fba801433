"""A reward function for tests/integration/test_rank_failure.py: the demo reward, except that on process 1 its
second call (step 2's generation batch) raises, as a reward server that goes down on one node would."""

from __future__ import annotations

import os

from sharpgrpo.data.demo import allowed_letters_reward

_calls = {"count": 0}


def reward_down_on_process_1(prompts, completions, allowed, **kwargs):
    _calls["count"] += 1
    if os.environ.get("RANK") == "1" and _calls["count"] == 2:
        raise ConnectionError("reward server unreachable")
    return allowed_letters_reward(prompts, completions, allowed)
