"""Knights & Knaves (K&K) logic puzzles: solver, generator, prompt and loaders.

Puzzle semantics follow the generator of Xie et al. 2024 ("On Memorization of Large Language Models in Logical
Reasoning", mem-kk-logic ``data_prep/lib_kk.py``), the data Logic-RL (Xie et al. 2025), AR-Lopti and GRPO-SG train and
evaluate on (docs/methods.md §5):

* Every inhabitant is a knight (always tells the truth) or a knave (always lies) and makes one statement.
* A statement is a nested tuple. Leaves are ``("telling-truth", j)`` ("j is a knight") and ``("lying", j)``
  ("j is a knave"); a person may speak about anyone, including themself, except the leaf "I am a knave", which no
  inhabitant can utter. Operators are ``("not", leaf)``, ``("and", s1, s2)``, ``("or", s1, s2)`` with two different
  sub-statements, ``("->", s1, s2)`` ("if s1 then s2") and ``("<=>", s1, s2)`` ("s1 if and only if s2"); the depth
  is at most 2, so operands are leaves.
* An assignment (True = knight) is a solution when every person's role agrees with the truth of their statement.
  A puzzle is kept only if it differs from every puzzle sampled before and has exactly one solution, both checked by
  brute force over all ``2**n`` assignments.

The sampler draws from a ``numpy.random.default_rng(seed)`` stream in the same order as the original generator, so
``generate_puzzles(n, k, seed=1234)`` reproduces the published puzzles: indices 0-99 are the K&K test split
(``shared/data/kk/kk_test_regen_*``), 100-999 are Logic-RL's training rows and 1000-1099 its test rows
(``shared/data/kk/logicrl_test_*``); see the shared SOURCES.md.
"""

from __future__ import annotations

import ast
import itertools
import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sharpgrpo.data.registry import register_dataset
from sharpgrpo.paths import shared_data_dir
from sharpgrpo.validation import argument_rules, integer, one_of

Statement = tuple  # nested tuples, see the module docstring

LEAF_OPERATORS = ("telling-truth", "lying")
OPERATORS = ("not", "and", "or", "->", "<=>")
MIN_PEOPLE, MAX_PEOPLE = 2, 8
DEFAULT_SEED = 1234  # the seed of the published K&K data (mem-kk-logic data_gen_kk.py)
PUBLISHED_TEST_SIZE = 100  # indices 0-99 of each seed-1234 stream are the published K&K test split
LOGICRL_TRAIN_END = 1000  # Logic-RL trains on indices 100-999 and tests on 1000-1099 of the same stream

# The 51 names and 18 saying templates of the original generator (mem-kk-logic); keeping the lists and their order
# is what makes the seeded stream reproduce the published puzzles.
NAMES = (
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "William", "Mia", "James",
    "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry", "Evelyn", "Alexander", "Abigail", "Michael",
    "Emily", "Daniel", "Elizabeth", "Jacob", "Sofia", "Logan", "Avery", "Jackson", "Ella", "Sebastian", "Scarlett",
    "Jack", "Grace", "Aiden", "Chloe", "Owen", "Victoria", "Samuel", "Riley", "Matthew", "Aria", "Joseph", "Lily",
    "Luke", "Aurora", "David", "Zoey", "Oliver", "Penelope",
)  # fmt: skip
SAYING_TEMPLATES = (
    "{name} said that {content}.",
    "{name} told you that {content}.",
    '{name} said, "{content}."',
    '{name} stated, "{content}".',
    'According to {name}, "{content}".',
    'In {name}\'s words: "{content}".',
    '{name} remarked, "{content}".',
    '"{content}," {name} declared.',
    '{name} was heard saying, "{content}".',
    "{name} expressed that {content}.",
    '"{content}" - {name}.',
    'As {name} put it, "{content}".',
    '{name} asserted: "{content}".',
    '"{content}," {name} mentioned.',
    '{name} commented, "{content}".',
    'In a statement by {name}: "{content}".',
    '{name} noted, "{content}".',
    '"{content}," {name} claimed.',
)
QUIZ_PREFIX = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie. "
)
QUIZ_SUFFIX = "So who is a knight and who is a knave?"

# Logic-RL / GRPO-SG App. B.1.3 prompt, character for character as in Logic-RL's K&K parquet files (including the
# missing space in "and<answer>" and the double space before "Now"). The assistant turn is opened with <think>, which
# is why kk_reward prepends "<think>" to the completion before checking the format.
KK_SYSTEM_PROMPT = (
    "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within <think> </think> "
    "and<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
    "</answer>.  Now the user asks you to solve a logical reasoning problem. After thinking, when you finally reach "
    "a conclusion, clearly state the identity of each character within <answer> </answer> tags. i.e., <answer> (1) "
    "Zoey is a knight\n(2) ... </answer>.\n"
)
KK_CHAT_TEMPLATE = (
    "<|im_start|>system\n" + KK_SYSTEM_PROMPT + "<|im_end|>\n<|im_start|>user\n{quiz}\n<|im_end|>\n"
    "<|im_start|>assistant\n<think>"
)
PROMPT_FORMATS = ("chat_string", "conversational", "conversational_prefill")


# ----------------------------------------------------------------------------------------------------------------
# Solving
# ----------------------------------------------------------------------------------------------------------------
def evaluate(statement: Statement, assignment: Sequence[bool]) -> bool:
    """Truth value of ``statement`` when person ``i`` is a knight iff ``assignment[i]``."""
    operator = statement[0]
    if operator == "telling-truth":
        return bool(assignment[statement[1]])
    if operator == "lying":
        return not assignment[statement[1]]
    if operator == "not":
        return not evaluate(statement[1], assignment)
    if operator == "and":
        return all(evaluate(s, assignment) for s in statement[1:])
    if operator == "or":
        return any(evaluate(s, assignment) for s in statement[1:])
    if operator == "->":
        return (not evaluate(statement[1], assignment)) or evaluate(statement[2], assignment)
    if operator == "<=>":
        return evaluate(statement[1], assignment) == evaluate(statement[2], assignment)
    raise ValueError(f"Unknown K&K operator {operator!r} in {statement!r}.")


def _truth_table(statement: Statement, knight_masks: Sequence[int], all_ones: int) -> int:
    """Truth values of ``statement`` under all ``2**n`` assignments at once, as a bitset (bit a = assignment a).

    Same brute force as :func:`evaluate` over every assignment, vectorised with Python integers so that rejection
    sampling of 8-person puzzles stays fast.
    """
    operator = statement[0]
    if operator == "telling-truth":
        return knight_masks[statement[1]]
    if operator == "lying":
        return all_ones & ~knight_masks[statement[1]]
    if operator == "not":
        return all_ones & ~_truth_table(statement[1], knight_masks, all_ones)
    if operator == "and":
        table = all_ones
        for sub in statement[1:]:
            table &= _truth_table(sub, knight_masks, all_ones)
        return table
    if operator == "or":
        table = 0
        for sub in statement[1:]:
            table |= _truth_table(sub, knight_masks, all_ones)
        return table
    if operator == "->":
        return all_ones & (
            ~_truth_table(statement[1], knight_masks, all_ones) | _truth_table(statement[2], knight_masks, all_ones)
        )
    if operator == "<=>":
        return all_ones & ~(
            _truth_table(statement[1], knight_masks, all_ones) ^ _truth_table(statement[2], knight_masks, all_ones)
        )
    raise ValueError(f"Unknown K&K operator {operator!r} in {statement!r}.")


def _assignments(n_people: int) -> list[tuple[bool, ...]]:
    # Same order as itertools.product([True, False], repeat=n): assignment 0 is all knights.
    return list(itertools.product((True, False), repeat=n_people))


def solve(statements: Sequence[Statement]) -> list[tuple[bool, ...]]:
    """All assignments (True = knight) consistent with ``statements``, by brute force over ``2**n`` assignments.

    Person ``i`` is consistent when ``assignment[i] == evaluate(statements[i], assignment)`` (a knight's statement is
    true, a knave's is false). Solutions come in ``itertools.product([True, False], repeat=n)`` order.
    """
    n_people = len(statements)
    assignments = _assignments(n_people)
    knight_masks = [sum(1 << a for a, assignment in enumerate(assignments) if assignment[i]) for i in range(n_people)]
    all_ones = (1 << len(assignments)) - 1
    consistent = all_ones
    for person, statement in enumerate(statements):
        # knight(person) <=> statement holds
        consistent &= all_ones & ~(knight_masks[person] ^ _truth_table(statement, knight_masks, all_ones))
    return [assignment for a, assignment in enumerate(assignments) if consistent >> a & 1]


def parse_statements(text: str) -> tuple[Statement, ...]:
    """Parse the ``statements`` field of the K&K files (a Python literal of nested tuples) and validate it."""
    statements = ast.literal_eval(text)
    if not isinstance(statements, tuple):
        raise ValueError(f"K&K statements must be a tuple of statements, got {type(statements).__name__}.")

    def check(statement: Any) -> None:
        if not isinstance(statement, tuple) or not statement:
            raise ValueError(f"Malformed K&K statement {statement!r}.")
        if statement[0] in LEAF_OPERATORS:
            if len(statement) != 2 or not isinstance(statement[1], int) or not 0 <= statement[1] < len(statements):
                raise ValueError(f"Malformed K&K leaf {statement!r}.")
        elif statement[0] in OPERATORS:
            arity_ok = len(statement) == 2 if statement[0] == "not" else len(statement) >= 3
            if statement[0] in ("->", "<=>"):
                arity_ok = len(statement) == 3
            if not arity_ok:
                raise ValueError(f"Wrong number of operands in K&K statement {statement!r}.")
            for sub in statement[1:]:
                check(sub)
        else:
            raise ValueError(f"Unknown K&K operator in {statement!r}.")

    for statement in statements:
        check(statement)
    return statements


# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------
class PuzzleSampler:
    """Random K&K statements with the distribution of Xie et al. 2024 (depth 2, two operands for and/or).

    At each node a die picks a leaf (1/6, and always at depth 1), "not" (1/6), "and"/"or" (1/6 each) or "->"/"<=>"
    (1/6 each). The calls on ``rng`` happen in the original generator's order, which makes seeded streams identical.
    """

    def __init__(self, n_people: int, seed: int = DEFAULT_SEED, depth: int = 2, width: int = 2):
        if not MIN_PEOPLE <= n_people <= MAX_PEOPLE:
            raise ValueError(f"n_people must be in [{MIN_PEOPLE}, {MAX_PEOPLE}], got {n_people}.")
        self.n_people = n_people
        self.depth = depth
        self.width = width
        self.rng = np.random.default_rng(seed)

    def statement(self, speaker: int, depth: int) -> Statement:
        dice = int(self.rng.integers(0, 6))
        if depth == 1 or dice == 0:
            while True:
                leaf = str(self.rng.choice(LEAF_OPERATORS))
                person = int(self.rng.integers(0, self.n_people))
                if not (leaf == "lying" and person == speaker):  # nobody can say "I am a knave"
                    return (leaf, person)
        if dice == 1:
            return ("not", self.statement(speaker, depth - 1))
        if dice in (2, 3):
            count = int(self.rng.integers(2, self.width + 1))
            return (("and", "or")[dice - 2],) + self._distinct_statements(speaker, depth - 1, count)
        return (("->", "<=>")[dice - 4],) + self._distinct_statements(speaker, depth - 1, 2)

    def _distinct_statements(self, speaker: int, depth: int, count: int) -> tuple[Statement, ...]:
        chosen: list[Statement] = []
        while len(chosen) < count:
            candidate = self.statement(speaker, depth)
            if candidate not in chosen:
                chosen.append(candidate)
        return tuple(chosen)

    def puzzle(self) -> tuple[Statement, ...]:
        return tuple(self.statement(person, self.depth) for person in range(self.n_people))

    def valid_puzzles(self, max_retry: int = 1000) -> Iterator[tuple[tuple[Statement, ...], tuple[bool, ...]]]:
        """Endless stream of ``(statements, solution)``: new puzzles with exactly one solution."""
        seen: set[tuple[Statement, ...]] = set()
        while True:
            for _ in range(max_retry):
                statements = self.puzzle()
                if statements in seen:
                    continue
                solutions = solve(statements)
                if len(solutions) != 1:
                    continue
                seen.add(statements)
                yield statements, solutions[0]
                break
            else:
                raise RuntimeError(
                    f"No new valid {self.n_people}-person puzzle in {max_retry} samples: the stream is running out "
                    "of distinct puzzles (only 399 two-person puzzles have exactly one solution)."
                )


# ----------------------------------------------------------------------------------------------------------------
# Natural language
# ----------------------------------------------------------------------------------------------------------------
def _render_leaf(leaf: Statement, names: Sequence[str], negated: bool = False) -> str:
    role = "a knight" if leaf[0] == "telling-truth" else "a knave"
    return f"{names[leaf[1]]} is {'not ' if negated else ''}{role}"


def render_statement(statement: Statement, names: Sequence[str]) -> str:
    """English text of a depth-<=2 statement, e.g. ``If Zoey is a knave then Oliver is a knight``."""
    operator = statement[0]
    if operator == "not":
        return _render_leaf(statement[1], names, negated=True)
    if operator in ("and", "or"):
        return f" {operator} ".join(_render_leaf(sub, names) for sub in statement[1:])
    if operator == "->":
        return f"If {_render_leaf(statement[1], names)} then {_render_leaf(statement[2], names)}"
    if operator == "<=>":
        return f"{_render_leaf(statement[1], names)} if and only if {_render_leaf(statement[2], names)}"
    return _render_leaf(statement, names)


def solution_text_format(names: Sequence[str], solution: Sequence[bool]) -> str:
    """The gold answer Logic-RL scores against: ``(1) NAME is a knight\\n(2) NAME is a knave...``."""
    return "\n".join(
        f"({i}) {name} is {'a knight' if knight else 'a knave'}"
        for i, (name, knight) in enumerate(zip(names, solution, strict=True), 1)
    )


def render_puzzle(statements: Sequence[Statement], solution: Sequence[bool], seed: int) -> dict[str, Any]:
    """Quiz text with random names and saying templates drawn from ``default_rng(seed)`` (original formatter order)."""
    rng = np.random.default_rng(seed)
    n_people = len(statements)
    names = [str(name) for name in rng.choice(NAMES, size=n_people, replace=False)]
    quiz = QUIZ_PREFIX + f"You meet {n_people} inhabitants: " + ", ".join(names[:-1]) + ", and " + names[-1] + "."
    for speaker, statement in enumerate(statements):
        template = str(rng.choice(SAYING_TEMPLATES))
        quiz += " " + template.format(name=names[speaker], content=render_statement(statement, names))
    quiz += " " + QUIZ_SUFFIX
    roles = [f"{name} is {'a knight' if knight else 'a knave'}" for name, knight in zip(names, solution, strict=True)]
    return {
        "quiz": quiz,
        "names": names,
        "solution": [bool(knight) for knight in solution],
        "solution_text": ", ".join(roles[:-1]) + ", and " + roles[-1] + ".",
        "solution_text_format": solution_text_format(names, solution),
    }


def kk_prompt(quiz: str, prompt_format: str = "chat_string") -> str | list[dict[str, str]]:
    """The GRPO-SG App. B.1.3 / Logic-RL prompt for ``quiz``.

    ``chat_string``: the exact Qwen chat-formatted string of Logic-RL's data, ending in
    ``<|im_start|>assistant\\n<think>`` (a plain-text prompt; kk_reward then scores ``"<think>" + completion``).
    ``conversational``: system and user messages for TRL's chat template; the model must open ``<think>`` itself.
    ``conversational_prefill``: the same plus an assistant message ``"<think>"``, which TRL continues
    (``continue_final_message``); with Qwen2.5's template this renders to the ``chat_string`` prompt.
    """
    if prompt_format == "chat_string":
        return KK_CHAT_TEMPLATE.format(quiz=quiz)
    messages = [{"role": "system", "content": KK_SYSTEM_PROMPT}, {"role": "user", "content": quiz + "\n"}]
    if prompt_format == "conversational":
        return messages
    if prompt_format == "conversational_prefill":
        return messages + [{"role": "assistant", "content": "<think>"}]
    raise ValueError(f"Unknown K&K prompt_format {prompt_format!r}; valid: {', '.join(PROMPT_FORMATS)}.")


def generate_puzzles(
    n_people: int,
    num_puzzles: int,
    seed: int = DEFAULT_SEED,
    start_index: int = 0,
    prompt_format: str = "chat_string",
) -> list[dict[str, Any]]:
    """Puzzles ``start_index .. start_index + num_puzzles - 1`` of the seeded ``n_people`` stream, as K&K rows.

    Row ``i`` is rendered with formatter seed ``seed + i``, as in the original data. Each row has the fields of the
    K&K files (``quiz, names, solution, solution_text, solution_text_format, statements, index``) plus ``n_people``
    and ``prompt``.
    """
    if num_puzzles < 0 or start_index < 0:
        raise ValueError("num_puzzles and start_index must be non-negative.")
    stream = PuzzleSampler(n_people, seed=seed).valid_puzzles()
    rows = []
    for index, (statements, solution) in enumerate(itertools.islice(stream, start_index + num_puzzles)):
        if index < start_index:
            continue
        row = render_puzzle(statements, solution, seed=seed + index)
        row.update(statements=str(statements), index=index, n_people=n_people)
        row["prompt"] = kk_prompt(row["quiz"], prompt_format)
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------------------------------
# Loading the shared files
# ----------------------------------------------------------------------------------------------------------------
def load_kk_file(path: str | Path, prompt_format: str = "chat_string") -> list[dict[str, Any]]:
    """Rows of a K&K jsonl file in either shared format, normalised.

    Both the generator/HF format (``kk_test_regen_*``: no prompt) and Logic-RL's verl format (``logicrl_test_*``:
    ``prompt`` is a list holding one message with the chat string) are accepted. Each returned row keeps the generator
    fields (``quiz, names, solution, solution_text_format, statements, index``), adds ``n_people`` and sets ``prompt``
    to :func:`kk_prompt` of the quiz (for Logic-RL rows this equals the stored prompt; a test checks it).
    """
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            raw = json.loads(line)
            solution_text = raw.get("solution_text_format")
            if solution_text is None:
                solution_text = raw["reward_model"]["ground_truth"]["solution_text_format"]
            row = {
                "quiz": raw["quiz"],
                "names": list(raw["names"]),
                "solution": [bool(x) for x in raw["solution"]],
                "solution_text": raw.get("solution_text", ""),
                "solution_text_format": solution_text,
                "statements": raw["statements"],
                "index": int(raw["index"]),
                "n_people": len(raw["names"]),
                "prompt": kk_prompt(raw["quiz"], prompt_format),
            }
            rows.append(row)
    return rows


def shared_kk_path(n_people: int, source: str = "regen") -> Path:
    """Path of a shared K&K file; FileNotFoundError where the shared data or that file is absent."""
    file_names = {"regen": f"kk_test_regen_{n_people}ppl.jsonl", "logicrl": f"logicrl_test_{n_people}ppl.jsonl"}
    if source not in file_names:
        raise ValueError(f"Unknown K&K source {source!r}; valid: regen, logicrl.")
    if source == "logicrl" and not 3 <= n_people <= 7:
        raise FileNotFoundError(
            f"Logic-RL's K&K test sets cover 3 to 7 people, not {n_people} people; use source='regen' (2 to 8)."
        )
    directory = shared_data_dir("kk")
    path = None if directory is None else directory / file_names[source]
    if path is None or not path.is_file():
        origin = (
            f"Logic-RL data/kk/instruct/{n_people}ppl/test.parquet, one JSON object per row"
            if source == "logicrl"
            else "the shared K&K regeneration (shared/data/kk/SOURCES.md)"
        )
        raise FileNotFoundError(
            f"The shared K&K file {file_names[source]} ({origin}) is not available: put it into "
            "$SHARPGRPO_SHARED_DIR/data/kk/ or shared/data/kk/ beside the repository checkout. Without it, the "
            "`kk` dataset and `sharpgrpo eval --task kk` (no --data) use the seeded generator, and "
            "`--data K-and-K/knights-and-knaves` reads the public puzzles from the Hub."
        )
    return path


def load_shared_kk(n_people: int, source: str = "regen", prompt_format: str = "chat_string") -> list[dict[str, Any]]:
    """The shared K&K evaluation puzzles for ``n_people``.

    ``source="regen"``: the published K&K test split (indices 0-99, 2-8 people). ``source="logicrl"``: Logic-RL's
    test rows (indices 1000-1099, 3-7 people), the split GRPO-SG / AR-Lopti report.
    """
    return load_kk_file(shared_kk_path(n_people, source), prompt_format=prompt_format)


# ----------------------------------------------------------------------------------------------------------------
# Registered datasets
# ----------------------------------------------------------------------------------------------------------------
def _people_range(min_people: int, max_people: int) -> list[int]:
    if not MIN_PEOPLE <= min_people <= max_people <= MAX_PEOPLE:
        raise ValueError(
            f"Need {MIN_PEOPLE} <= min_people <= max_people <= {MAX_PEOPLE}, got {min_people}, {max_people}."
        )
    return list(range(min_people, max_people + 1))


@register_dataset("kk")
@argument_rules(
    num_puzzles=integer(1),
    min_people=integer(MIN_PEOPLE, MAX_PEOPLE),
    max_people=integer(MIN_PEOPLE, MAX_PEOPLE),
    seed=integer(0),
    prompt_format=one_of(*PROMPT_FORMATS),
    start_index=integer(0),
)
def kk_train_dataset(
    num_puzzles: int = 4500,
    min_people: int = 3,
    max_people: int = 7,
    seed: int = DEFAULT_SEED,
    prompt_format: str = "chat_string",
    start_index: int = PUBLISHED_TEST_SIZE,
):
    """Generated K&K training puzzles, ``num_puzzles`` split evenly over ``min_people..max_people`` people.

    Each size takes indices ``start_index ..`` of its seeded stream. The defaults (seed 1234, start 100, 900 per size
    for 3-7 people) are Logic-RL's training rows; starting at 100 keeps the published test split (0-99) out of
    training, and staying below index 1000 keeps Logic-RL's test rows out too (a warning says when it does not).
    Columns: ``prompt`` (see :func:`kk_prompt`), ``solution_text_format`` (kk_reward's gold), and the puzzle fields.
    """
    import datasets

    sizes = _people_range(min_people, max_people)
    base, extra = divmod(num_puzzles, len(sizes))
    if seed == DEFAULT_SEED and start_index + base + (extra > 0) > LOGICRL_TRAIN_END:
        warnings.warn(
            "K&K puzzles at index >= 1000 of the seed-1234 streams are Logic-RL's test puzzles "
            "(shared logicrl_test_*); lower num_puzzles or change the seed to keep them out of training.",
            stacklevel=2,
        )
    rows = []
    for position, n_people in enumerate(sizes):
        count = base + (1 if position < extra else 0)
        rows += generate_puzzles(n_people, count, seed=seed, start_index=start_index, prompt_format=prompt_format)
    return datasets.Dataset.from_list(rows)


@register_dataset("kk_shared")
@argument_rules(source=one_of("logicrl", "regen"), prompt_format=one_of(*PROMPT_FORMATS))
def kk_shared_dataset(
    source: str = "logicrl",
    n_people: int | Sequence[int] | None = None,
    prompt_format: str = "chat_string",
):
    """The shared K&K evaluation puzzles as a dataset (all available sizes unless ``n_people`` is given)."""
    import datasets

    if n_people is None:
        n_people = list(range(3, 8)) if source == "logicrl" else list(range(MIN_PEOPLE, MAX_PEOPLE + 1))
    elif isinstance(n_people, int):
        n_people = [n_people]
    rows = []
    for n in n_people:
        rows += load_shared_kk(n, source=source, prompt_format=prompt_format)
    return datasets.Dataset.from_list(rows)
