"""Knights & Knaves rewards: Logic-RL's training reward and the evaluation check behind the accuracy tables.

Training reward (Logic-RL, Xie et al. 2025, ``verl/utils/reward_score/kk.py``; GRPO-SG Table 5; docs/methods.md §5)::

    format  +1 if <think>, </think>, <answer>, </answer> each occur exactly once, in that order, else -1
    answer  +2    all roles right          (only scored when the format is right)
            -1.5  parses, some role wrong
            -2    does not parse, or the format is wrong
    total in {3, -0.5, -1, -3}

The answer is the stripped text of the last ``<answer>...</answer>``. It parses only if the number of
case-insensitive occurrences of "knight" and "knave" (as substrings, so "knights" counts) equals the number of people
and every gold name matches ``\\bNAME\\b\\s+is\\s+a\\s+\\b(knight|knave)\\b`` (numbering and order free; word
boundaries keep Ella and Isabella apart). Logic-RL's prompt ends with ``<|im_start|>assistant\\n<think>`` and scores
the text after ``<|im_start|>assistant``, so the text scored here is ``"<think>" + completion`` when the prompt ends
with an opened ``<think>``, and the completion as is otherwise.
"""

from __future__ import annotations

import re
from typing import Any

from reward_fns import register_reward
from reward_fns._common import as_list, completion_text, last_tagged_block, per_completion, scored_text

FORMAT_TAGS = ("<think>", "</think>", "<answer>", "</answer>")
ROLE_WORD = re.compile(r"\b(knight|knave)\b", re.IGNORECASE)
# Logic-RL's parse_solution_text_format: per line, the first word is the name, the first knight/knave its role.
GOLD_LINE = re.compile(r"\b([A-Za-z]+)\b.*?\b(knight|knave)\b", re.IGNORECASE)

FORMAT_REWARD, FORMAT_PENALTY = 1.0, -1.0
ANSWER_CORRECT, ANSWER_WRONG, ANSWER_UNPARSEABLE = 2.0, -1.5, -2.0


def parse_gold(solution_text_format: Any) -> dict[str, str]:
    """``{"Zoey": "knight", ...}`` from ``(1) Zoey is a knight\\n(2) ...`` (Logic-RL parse_solution_text_format)."""
    if not isinstance(solution_text_format, str):
        return {}
    roles = {}
    for line in solution_text_format.split("\n"):
        match = GOLD_LINE.search(line.strip())
        if match:
            roles[match.group(1)] = match.group(2).lower()
    return roles


def has_logicrl_format(text: str) -> bool:
    """Each of <think>, </think>, <answer>, </answer> exactly once and in that order (Logic-RL)."""
    if any(text.count(tag) != 1 for tag in FORMAT_TAGS):
        return False
    positions = [text.find(tag) for tag in FORMAT_TAGS]
    return positions == sorted(positions)


def last_answer(text: str) -> str | None:
    """Stripped text of the last ``<answer>...</answer>`` block, or None."""
    answer = last_tagged_block(text, "<answer>", "</answer>")
    return None if answer is None else answer.strip()


def parse_answer(answer_text: str, names: list[str]) -> dict[str, str] | None:
    """Roles claimed in the answer, or None when it does not parse (Logic-RL parse_model_answer)."""
    lowered = answer_text.lower()
    if lowered.count("knight") + lowered.count("knave") != len(names):
        return None
    roles = {}
    for name in names:
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+\b(knight|knave)\b", answer_text, re.IGNORECASE)
        if match is None:
            return None
        roles[name] = match.group(1).lower()
    return roles


def kk_score(text: str, solution_text_format: str) -> float:
    """Logic-RL reward of an already prefill-completed response ``text`` (see the module docstring)."""
    gold = parse_gold(solution_text_format)
    format_ok = has_logicrl_format(text)
    format_score = FORMAT_REWARD if format_ok else FORMAT_PENALTY
    answer = last_answer(text)
    if not (format_ok and answer):
        return format_score + ANSWER_UNPARSEABLE
    predicted = parse_answer(answer, list(gold))
    if not predicted:
        return format_score + ANSWER_UNPARSEABLE
    return format_score + (ANSWER_CORRECT if predicted == gold else ANSWER_WRONG)


def kk_answer_check(prompts, completions, solution_text_format, **kwargs) -> list[bool | None]:
    """The K&K answer check, independent of the format term (docs/methods.md §3): the last ``<answer>...</answer>`` block
    parses (the training reward's parser, :func:`parse_answer`) and every person's role matches the solution.

    This is the "correct" of THR's positive set and pass@k's c: with the +-1 format term of :func:`kk_reward`, a
    group-normalised advantage A > 0 does not imply a right answer. None for rows without a gold."""
    completions = as_list(completions)
    count = len(completions)
    prompts = per_completion(prompts, count)
    golds = per_completion(solution_text_format, count)
    verdicts: list[bool | None] = []
    for prompt, completion, gold in zip(prompts, completions, golds, strict=True):
        if gold is None:
            verdicts.append(None)
            continue
        solution = parse_gold(str(gold))
        answer = last_answer(scored_text(prompt, completion))
        predicted = parse_answer(answer, list(solution)) if answer else None
        verdicts.append(bool(solution) and predicted == solution)
    return verdicts


@register_reward("kk", columns=("solution_text_format",), answer_check=kk_answer_check)
def kk_reward(prompts, completions, solution_text_format, **kwargs) -> list[float | None]:
    """Logic-RL K&K training reward for TRL: one of 3, -0.5, -1, -3 per completion.

    ``solution_text_format`` is the gold column (``(1) NAME is a knight\\n...``). A row whose gold is None (a sample of
    another task in a mixed dataset) gets None, which TRL ignores. Never raises on any completion text.
    """
    completions = as_list(completions)
    count = len(completions)
    prompts = per_completion(prompts, count)
    golds = per_completion(solution_text_format, count)
    rewards: list[float | None] = []
    for prompt, completion, gold in zip(prompts, completions, golds, strict=True):
        if gold is None:
            rewards.append(None)
            continue
        rewards.append(kk_score(scored_text(prompt, completion), str(gold)))
    return rewards


def first_role_after_name(answer: str, name: str) -> str | None:
    """Role in the first match of ``\\bNAME\\b.*?\\b(knight|knave)\\b`` (case-insensitive, ``.`` not crossing
    newlines), computed line by line in linear time: the first name in a line with a role word after it decides."""
    name_pattern = re.compile(rf"\b{re.escape(name)}\b", re.IGNORECASE)
    for line in answer.split("\n"):
        found = name_pattern.search(line)
        if found:
            role = ROLE_WORD.search(line, found.end())
            if role:
                return role.group(1).lower()
    return None


def kk_correct(completion: Any, solution_text_format: Any) -> bool:
    """Evaluation check behind the K&K accuracy tables, more lenient than the training reward.

    On the completion alone (no ``<think>`` requirement): ``</think>``, ``<answer>`` and ``</answer>`` each occur
    exactly once, in that order; in the answer block, the first match of ``\\bNAME\\b.*?\\b(knight|knave)\\b``
    (case-insensitive, within a line) gives each gold person's role; no count check. Correct iff every role matches.
    """
    text = completion_text(completion)
    tags = FORMAT_TAGS[1:]
    if any(text.count(tag) != 1 for tag in tags):
        return False
    think_end, answer_start, answer_end = (text.find(tag) for tag in tags)
    if not think_end < answer_start < answer_end:
        return False
    answer = text[answer_start + len("<answer>") : answer_end]
    gold = parse_gold(solution_text_format)
    return bool(gold) and all(first_role_after_name(answer, name) == role for name, role in gold.items())
