"""DAPO's soft overlong punishment as a reward function (``overlong_penalty``; docs/methods.md §15.4).

DAPO (Yu et al. 2025, arXiv:2503.14476, Eq. 13) penalises a completion of |y| tokens that runs into the last
``L_cache`` tokens of the length budget ``L_max``:

    R_length(y) = 0                                   |y| <= L_max - L_cache
                  ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                  -1                                   L_max < |y|

times a penalty factor, added to the task reward. As verl's DAPO reward manager computes it
(verl-project/verl@1dda039 ``verl/workers/reward_manager/dapo.py`` L121-127):
``min(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, 0)``, with ``L_max`` the maximum response length and
|y| the number of response tokens (the end-of-sequence token included). TRL truncates completions at
``max_completion_length``, so |y| never exceeds L_max here and the two agree.

``overlong_penalty_reward(max_completion_length, buffer_length, penalty_factor)`` builds the reward function for the
Python API; in a config, ``reward_funcs: [math, overlong_penalty]`` reads ``max_completion_length``,
``overlong_buffer_length`` and ``overlong_penalty_factor`` (verl's ``data.max_response_length``,
``overlong_buffer.len`` and ``overlong_buffer.penalty_factor``).
"""

from __future__ import annotations

from reward_fns import register_reward


def overlong_penalty_values(lengths: list[int], max_length: int, buffer_length: int,
                            penalty_factor: float = 1.0) -> list[float]:
    """DAPO Eq. 13 for completions of ``lengths`` tokens: 0 up to ``max_length - buffer_length`` tokens, then falling
    linearly to ``-penalty_factor`` at ``max_length`` (verl dapo.py L121-127). Raises ValueError for a buffer that is
    not in [1, max_length] or a negative factor."""
    check_overlong_settings(max_length, buffer_length, penalty_factor)
    expected = max_length - buffer_length
    return [min(-(length - expected) / buffer_length * penalty_factor, 0.0) for length in lengths]


def check_overlong_settings(max_length: int, buffer_length: int, penalty_factor: float) -> None:
    """One line naming the setting when the buffer is not in [1, max_completion_length] or the factor is < 0 (verl
    dapo.py L45-56 asserts the same)."""
    if not 1 <= buffer_length <= max_length:
        raise ValueError(
            f"overlong_buffer_length={buffer_length}: must be in [1, max_completion_length={max_length}] (DAPO's "
            "L_cache, the last tokens of the budget over which the overlong penalty grows)."
        )
    if penalty_factor < 0:
        raise ValueError(f"overlong_penalty_factor={penalty_factor}: must be >= 0.")


def overlong_penalty_reward(max_completion_length: int, buffer_length: int, penalty_factor: float = 1.0):
    """The ``overlong_penalty`` reward with its settings bound: ``f(prompts, completions, completion_ids, **kwargs)``
    -> one penalty per completion from its token count (``completion_ids``, which TRL passes to every reward)."""
    check_overlong_settings(max_completion_length, buffer_length, penalty_factor)

    def overlong_penalty(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise ValueError("overlong_penalty needs the completions' token ids (TRL's `completion_ids` argument).")
        lengths = [len(ids) for ids in completion_ids]
        return overlong_penalty_values(lengths, max_completion_length, buffer_length, penalty_factor)

    overlong_penalty.settings = (max_completion_length, buffer_length, penalty_factor)
    return overlong_penalty


def configure(args):
    """The ``overlong_penalty`` reward bound to a config's ``max_completion_length``, ``overlong_buffer_length``
    (None: a fifth of ``max_completion_length``, DAPO's 4096 of 20480, at least 1) and ``overlong_penalty_factor``."""
    buffer_length = args.overlong_buffer_length
    if buffer_length is None:
        buffer_length = max(1, args.max_completion_length // 5)
    return overlong_penalty_reward(args.max_completion_length, buffer_length, args.overlong_penalty_factor)


@register_reward("overlong_penalty", columns=(), configure=configure)
def overlong_penalty(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
    """The registered name: a config's ``reward_funcs: [..., overlong_penalty]`` is replaced by
    :func:`overlong_penalty_reward` of the config's ``max_completion_length``, ``overlong_buffer_length`` and
    ``overlong_penalty_factor`` (:func:`configure`); called unbound it names what it misses."""
    raise ValueError(
        "overlong_penalty needs its settings: list it in a config's reward_funcs (it reads max_completion_length, "
        "overlong_buffer_length and overlong_penalty_factor) or pass "
        "reward_fns.overlong.overlong_penalty_reward(max_completion_length, buffer_length, penalty_factor)."
    )

