"""Small offline tasks beside the demo (``sharpgrpo.data.demo``), for comparing strategies on the tiny model.

``register_tasks()`` registers every task's dataset and reward function (idempotent); ``train.py`` calls it.
"""

from __future__ import annotations


def register_tasks() -> None:
    """Register the demo and the other offline tasks (datasets, reward functions, evaluation tasks)."""
    from sharpgrpo.data.demo import register_demo
    from sharpgrpo.tasks.strict_letters import register_strict_letters

    register_demo()
    register_strict_letters()
