"""Every registered strategy is documented where users look: a row in docs/strategies.md's strategy table and a section
of docs/methods.md whose heading names it. A strategy module dropped into ``sharpgrpo/strategies/`` registers itself
(the package imports every public module), so this is what keeps "a new method is four files" honest: the module,
its parameters, its test, its docs section; a strategy without its docs fails here, naming what is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sharpgrpo.strategies import STRATEGIES

ROOT = Path(__file__).resolve().parents[2]


def builtin_strategies() -> list[str]:
    """The strategies the package itself registers (a test's own registrations aside)."""
    return [name for name in STRATEGIES.names() if STRATEGIES.get(name).__module__.startswith("sharpgrpo.strategies.")]


def table_rows(root: Path) -> set[str]:
    """Names in the first column of the strategy table (docs/strategies.md, the page's first table)."""
    page = (root / "docs" / "strategies.md").read_text(encoding="utf-8")
    start = page.index("\n| name |")
    table = page[start:page.index("\n\n", start + 1)]
    return set(re.findall(r"^\| `([\w.-]+)` \|", table, flags=re.MULTILINE))


def methods_headings(root: Path) -> set[str]:
    """Names written in backticks in docs/methods.md's section headings."""
    methods = (root / "docs" / "methods.md").read_text(encoding="utf-8")
    return {name for heading in re.findall(r"^#{2,4} .*$", methods, flags=re.MULTILINE)
            for name in re.findall(r"`([\w.-]+)`", heading)}


def undocumented(root: Path, names: list[str]) -> list[str]:
    """What each strategy of ``names`` lacks, one line each (empty: all documented)."""
    rows, headings = table_rows(root), methods_headings(root)
    missing = [f"{name}: no row in docs/strategies.md's strategy table" for name in names if name not in rows]
    missing += [f"{name}: no docs/methods.md section heading naming it" for name in names if name not in headings]
    return missing


def test_the_registry_holds_the_shipped_strategies():
    assert {"grpo_sg", "equal", "cw_grpo", "thr", "clip_cov", "gmpo"} <= set(builtin_strategies())


@pytest.mark.parametrize("name", builtin_strategies())
def test_every_registered_strategy_is_documented(name):
    assert not undocumented(ROOT, [name]), undocumented(ROOT, [name])


def test_a_strategy_without_docs_is_named(tmp_path):
    """The check itself: a strategies page and methods page missing one strategy name exactly that strategy."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "strategies.md").write_text(
        "# Strategies\n\n| name | kind |\n|---|---|\n| `a` | weight |\n\n| name |\n|---|\n| `b` |\n")
    (tmp_path / "docs" / "methods.md").write_text("## 1. A (`a`)\n\n## 2. Something about `b` in the text\n`b`\n")
    assert undocumented(tmp_path, ["a"]) == []
    assert undocumented(tmp_path, ["a", "b"]) == ["b: no row in docs/strategies.md's strategy table"]
    (tmp_path / "docs" / "methods.md").write_text("## 1. A\n\nmentions `a` only in the text\n")
    assert undocumented(tmp_path, ["a"]) == ["a: no docs/methods.md section heading naming it"]
