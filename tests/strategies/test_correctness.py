"""One notion of "correct" (docs/methods.md §3 "Positive set"): the reward functions' answer checks, else the fallback."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from reward_fns import answer_check, get_reward_function
from sharpgrpo.strategies import correctness
from sharpgrpo.strategies.correctness import FALLBACK_ADVANTAGE, FALLBACK_BINARY, answer_verdicts, correct_completions

GOLD = "(1) Zoey is a knight\n(2) Oliver is a knave"
RIGHT = "<think>Zoey tells the truth.</think><answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>"
WRONG_GOOD_FORMAT = "<think>Zoey lies.</think><answer>(1) Zoey is a knave\n(2) Oliver is a knight</answer>"
NO_FORMAT = "Zoey is a knight and Oliver is a knave, I think"


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """TRL's group normalisation (scale_rewards='group')."""
    grouped = rewards.view(-1, group_size)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)


def test_kk_wrong_answer_with_good_format_and_positive_advantage_is_not_correct():
    kk = get_reward_function("kk")
    completions = [RIGHT, WRONG_GOOD_FORMAT] + [NO_FORMAT] * 6
    prompts = ["Who is a knight?"] * 8
    columns = {"solution_text_format": [GOLD] * 8}
    rewards = torch.tensor(kk(prompts, completions, **columns))
    assert rewards.tolist() == [3.0, -0.5] + [-3.0] * 6
    advantages = group_advantages(rewards, 8)
    assert advantages[1] > 0  # the wrong answer looks "good" to A > 0 (the old positive set)
    verdicts = answer_verdicts([kk], prompts, completions, columns)
    assert verdicts.tolist() == [1.0] + [0.0] * 7
    correct = correct_completions(verdicts, rewards, advantages, torch.zeros(8, dtype=torch.long))
    assert correct.tolist() == [True] + [False] * 7
    # Independent of format: a right answer inside broken tags (no <think>) is still right.
    broken = "<answer>(1) Zoey is a knight\n(2) Oliver is a knave</answer>"
    assert answer_check(kk)(["q"], [broken], solution_text_format=[GOLD]) == [True]
    assert kk(["q"], [broken], solution_text_format=[GOLD]) == [-3.0]
    assert answer_check(kk)(["q"], [RIGHT], solution_text_format=[None]) == [None]


def test_math_and_qa_answer_checks():
    qa = answer_check(get_reward_function("qa_em"))
    assert qa(["q"] * 3, ["<answer> The Eiffel Tower</answer>", "<answer>Louvre</answer>", "no tags"],
              golden_answers=[["Eiffel Tower"]] * 3) == [True, False, False]
    math_check = answer_check(get_reward_function("math"))
    assert math_check(["q"] * 3, ["so \\boxed{\\frac12}", "\\boxed{0.6}", "x"], answer=["0.5", "0.5", None]) == [
        True, False, None]
    assert answer_check(get_reward_function("think_format")) is None  # a format reward has no answer


def test_several_answer_checks_combine_and_missing_verdicts_fall_back():
    def always(prompts, completions, **kwargs):
        return [True] * len(completions)

    def first_wrong(prompts, completions, **kwargs):
        return [False] + [None] * (len(completions) - 1)

    def no_check(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    always.answer_check = always
    first_wrong.answer_check = first_wrong
    verdicts = answer_verdicts([always, first_wrong, no_check], ["q"] * 3, ["a", "b", "c"])
    assert verdicts.tolist() == [0.0, 1.0, 1.0]
    assert answer_verdicts([no_check], ["q"], ["a"]) is None
    # A group with a row without verdict falls back as a whole; the other group keeps its verdicts.
    verdicts = torch.tensor([1.0, 0.0, math.nan, 0.0])
    rewards = torch.tensor([0.0, 0.0, 1.0, 0.0])
    correct = correct_completions(verdicts, rewards, torch.tensor([1.0, -1.0, 1.0, -1.0]), torch.tensor([0, 0, 1, 1]))
    assert correct.tolist() == [True, False, True, False]


def test_fallback_rules_and_one_time_warning(monkeypatch):
    monkeypatch.setattr(correctness, "_warned", set())
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    binary = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # the all-0 group has no correct completion
    with pytest.warns(UserWarning, match="binary rewards"):
        assert correct_completions(None, binary, group_advantages(binary, 3), groups).tolist() == [
            True, False, False, False, False, False]
    plus_minus = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0])  # QA-style +-1 without a check: the higher value
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the binary rule already warned once in this process
        assert correct_completions(None, plus_minus, group_advantages(plus_minus, 3), groups).tolist() == [
            True, False, False, True, True, False]
    graded = torch.tensor([0.9, 0.2, 0.4, 0.5, 0.5, 0.5])
    with pytest.warns(UserWarning, match="A > 0"):
        assert correct_completions(None, graded, group_advantages(graded, 3), groups).tolist() == [
            True, False, False, False, False, False]
    assert correctness.fallback_rule(binary) == FALLBACK_BINARY
    assert correctness.fallback_rule(graded) == FALLBACK_ADVANTAGE
