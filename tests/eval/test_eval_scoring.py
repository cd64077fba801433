"""Each task judges completions with the project's reward functions against the right gold fields."""

from __future__ import annotations

from sharpgrpo.data.kk import generate_puzzles
from sharpgrpo.evaluation.tasks import KKTask, MathTask, Problem, QATask


def test_kk_score_reads_the_gold_of_each_problem():
    rows = generate_puzzles(3, 2)
    problems = [
        Problem(
            id=str(i), group="3", prompt=row["prompt"], reference={"solution_text_format": row["solution_text_format"]}
        )
        for i, row in enumerate(rows)
    ]
    right = [f"reasoning</think><answer>{row['solution_text_format']}</answer>" for row in rows]
    flipped = [
        text.replace("knight", "KNIGHTX").replace("knave", "knight").replace("KNIGHTX", "knave") for text in right
    ]
    scores = KKTask().score(problems, [[right[0], flipped[0], "no answer"], [flipped[1], right[1]]])
    assert scores == [[True, False, False], [False, True]]
    # Swapped golds: each puzzle's correct answer is wrong for the other puzzle (unless both solutions coincide).
    if rows[0]["names"] != rows[1]["names"]:
        assert KKTask().score(problems, [[right[1]], [right[0]]]) == [[False], [False]]


def test_math_score_uses_math_verify_per_problem():
    problems = [
        Problem(id="a", group="amc", prompt="p", reference={"answer": ["142"]}, sampled=True),
        Problem(id="b", group="math500", prompt="p", reference={"answer": ["\\frac{1}{2}"]}),
    ]
    completions = [["so \\boxed{142}", "\\boxed{141}", "142"], ["\\boxed{0.5}"]]
    assert MathTask().score(problems, completions) == [[True, False, False], [True]]


def test_qa_score_exact_match():
    problems = [Problem(id="q", group="nq", prompt="p", reference={"golden_answers": ["The Beatles", "Beatles"]})]
    completions = [["<answer> the beatles </answer>", "<answer>Rolling Stones</answer>", "The Beatles"]]
    assert QATask().score(problems, completions) == [[True, False, False]]
