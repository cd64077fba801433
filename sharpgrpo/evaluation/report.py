"""Markdown tables of evaluation results (GitHub-flavoured, one header row, right-aligned numbers)."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A pipe table; the first column is left-aligned, the others right-aligned. Cells are ``str()``-ed."""
    if any(len(row) != len(headers) for row in rows):
        raise ValueError("Every row needs one cell per header.")

    def clean(cell: object) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(clean(h) for h in headers) + " |"]
    lines.append("|" + "|".join([" --- "] + [" ---: "] * (len(headers) - 1)) + "|")
    lines += ["| " + " | ".join(clean(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def fraction(value: float | None, digits: int = 2) -> str:
    """0.634 -> ``0.63`` (the K&K tables' format); None -> ``-``."""
    return "-" if value is None else f"{value:.{digits}f}"


def percent(value: float | None, digits: int = 1) -> str:
    """0.634 -> ``63.4`` (the math and QA tables report percentages); None -> ``-``."""
    return "-" if value is None else f"{100 * value:.{digits}f}"
