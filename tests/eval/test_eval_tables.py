"""Aggregation of judged problems into the papers' tables, and the markdown format."""

from __future__ import annotations

import pytest

from sharpgrpo.evaluation.report import fraction, markdown_table, percent
from sharpgrpo.evaluation.tasks import KKTask, MathTask, QATask, group_metrics


def record(group, correct, sampled=False):
    return {"id": f"{group}/{id(correct)}", "group": group, "sampled": sampled, "correct": list(correct)}


def test_markdown_table_format():
    table = markdown_table(["Model", "3", "Avg."], [["base", "0.10", "0.20"], ["a|b", 1, 2.5]])
    assert table == ("| Model | 3 | Avg. |\n| --- | ---: | ---: |\n| base | 0.10 | 0.20 |\n| a\\|b | 1 | 2.5 |\n")
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], [["only one"]])
    assert (fraction(0.634), percent(0.634), percent(None)) == ("0.63", "63.4", "-")


def test_group_metrics_greedy_and_sampled():
    greedy = group_metrics([record("g", [True]), record("g", [False]), record("g", [True])])
    assert greedy == {"problems": 3, "samples": 1, "accuracy": pytest.approx(2 / 3), "correct": 2}
    sampled = group_metrics([record("s", [True, False, False, False]), record("s", [False] * 4)])
    assert sampled["samples"] == 4 and sampled["avg@4"] == pytest.approx(1 / 8)
    assert sampled["pass@k"] == {"1": pytest.approx(1 / 8), "2": pytest.approx(0.25), "4": pytest.approx(0.5)}
    with pytest.raises(ValueError, match="different sample counts"):
        group_metrics([record("s", [True]), record("s", [True, False])])


def test_kk_summary_and_table():
    records = [record("3", [True]), record("3", [False]), record("4", [True]), record("4", [True])]
    records += [record("10", [False])]  # sizes sort numerically, not as strings
    summary = KKTask().summarize(records)
    assert list(summary["by_people"]) == ["3", "4", "10"]
    assert summary["by_people"]["3"]["accuracy"] == 0.5
    assert summary["overall"] == {"accuracy": 3 / 5, "correct": 3, "problems": 5}
    assert summary["avg_over_people"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    table = KKTask().markdown(summary, "Qwen2.5-3B + GRPO-SG")
    assert "| Model | 3 ppl | 4 ppl | 10 ppl | Avg. | Overall |\n" in table
    assert "| Qwen2.5-3B + GRPO-SG | 0.50 | 1.00 | 0.00 | 0.50 | 0.60 |\n" in table


def test_math_summary_paper_columns_and_table():
    records = [record("olympiad_bench", [True]), record("olympiad_bench", [False])]
    records += [record("math500", [True])]
    records += [record("amc", [True] * 8 + [False] * 8, sampled=True)]
    records += [record("aime24", [True] + [False] * 15, True), record("aime24", [False] * 16, True)]
    summary = MathTask().summarize(records)
    assert list(summary["datasets"]) == ["olympiad_bench", "math500", "amc", "aime24"]  # the papers' order
    assert summary["datasets"]["math500"]["decoding"] == "greedy"
    assert summary["datasets"]["aime24"]["decoding"] == "sampled"
    aime = summary["datasets"]["aime24"]
    assert aime["avg@16"] == pytest.approx(1 / 32)
    assert aime["pass@k"]["16"] == pytest.approx(0.5) and aime["pass@k"]["1"] == pytest.approx(1 / 32)
    assert aime["pass@k"]["4"] == pytest.approx((4 / 16) / 2)  # one correct of 16: pass@4 = 4/16
    paper = summary["paper_table"]
    assert list(paper) == ["Olympiad Bench", "MATH 500", "AMC avg@16", "AIME pass@16", "AIME avg@16", "Avg."]
    assert paper["Avg."] == pytest.approx((0.5 + 1.0 + 0.5 + 0.5 + 1 / 32) / 5)
    table = MathTask().markdown(summary, "model")
    assert "| Model | Olympiad Bench | MATH 500 | AMC avg@16 | AIME pass@16 | AIME avg@16 | Avg. |" in table
    assert "| model | 50.0 | 100.0 | 50.0 | 50.0 | 3.1 | 50.6 |" in table
    assert "| AIME | sampled | 2 | 16 | 3.1 | 3.1 | 6.2 | 12.5 | 25.0 | 50.0 |" in table
    assert "| MATH 500 | greedy | 1 | 1 | 100.0 | - | - | - | - | - |" in table


def test_qa_summary_and_table():
    records = [record("nq", [True]), record("nq", [False]), record("hotpotqa", [False])]
    summary = QATask().summarize(records)
    assert summary["datasets"]["nq"]["exact_match"] == 0.5
    assert summary["avg"] == pytest.approx(0.25)
    table = QATask().markdown(summary, "m")
    assert "| Model | nq | hotpotqa | Avg. |\n" in table and "| m | 50.00 | 0.00 | 25.00 |\n" in table
