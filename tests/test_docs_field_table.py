"""docs/methods.md's config field map (§9) says what the code declares: every field of ours is listed there once, with
the default it is declared with (``sharpgrpo.strategy_params`` and ``sharpgrpo.config``)."""

import re
from dataclasses import MISSING, fields
from fractions import Fraction
from pathlib import Path

import pytest
from trl import GRPOConfig

from sharpgrpo import SharpGRPOConfig
from sharpgrpo.validation import Renamed

DOCS = Path(__file__).resolve().parents[1] / "docs" / "methods.md"
NOT_LISTED = {"importance_sampling_level"}  # TRL's field; the table lists the level we add, not a default of ours


def field_table() -> dict[str, str]:
    """field name -> its 'default' cell, from the table under '## 9. Config field map'."""
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## 9. Config field map"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    table = section[section.index("| field | default |"):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        names_cell, default_cell = [cell.strip() for cell in line.strip("|").split("|")][:2]
        names = re.findall(r"`([^`]+)`", names_cell)
        defaults = [d.strip() for d in re.sub(r"\s*\([^)]*\)", "", default_cell).split(",")]
        if len(defaults) != len(names):
            defaults = [default_cell] * len(names)  # one cell for a group (a list default)
        first = names[0]
        for name, default in zip(names, defaults, strict=True):
            full = first.rsplit("_", 1)[0] + name if name.startswith("_") else name  # `_high` after `random_weight_low`
            assert full not in rows, f"{full} is listed twice"
            rows[full] = default
    return rows


def documented_value(cell: str):
    cell = cell.strip().strip("`")
    if cell.lower() in ("true", "false"):
        return cell.lower() == "true"
    if cell == "None":
        return None
    if cell.startswith("[") and cell.endswith("]"):
        return [item.strip() for item in cell[1:-1].split(",") if item.strip()]
    if re.fullmatch(r"-?\d+/\d+", cell):
        return float(Fraction(cell))
    try:
        return float(cell) if any(c in cell for c in ".e") else int(cell)
    except ValueError:
        return cell


def our_fields():
    trl = {f.name for f in fields(GRPOConfig)}
    return [f for f in fields(SharpGRPOConfig) if f.name not in trl and not isinstance(getattr(f, "rule", None), Renamed)]


def declared_default(field):
    return field.default_factory() if field.default is MISSING else field.default


def test_every_field_of_ours_is_in_the_table():
    rows = field_table()
    missing = [f.name for f in our_fields() if f.name not in rows]
    assert not missing, f"docs/methods.md §9 does not list {missing}"


@pytest.mark.parametrize("field", our_fields(), ids=lambda f: f.name)
def test_the_table_states_the_declared_default(field):
    documented = documented_value(field_table()[field.name])
    declared = declared_default(field)
    if isinstance(declared, float):
        assert documented == pytest.approx(declared, rel=1e-12), field.name
    else:
        assert documented == declared, field.name


def test_the_table_lists_no_field_that_does_not_exist():
    names = {f.name for f in fields(SharpGRPOConfig)}
    assert set(field_table()) - names - NOT_LISTED == set()
