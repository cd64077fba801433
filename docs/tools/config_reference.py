"""The configuration reference page, ``docs/configuration.md``, generated from the config's own field help.

Every field sharpgrpo adds to TRL's ``GRPOConfig`` (the trainer's fields in ``sharpgrpo/config.py`` and the strategy
parameters in ``sharpgrpo/strategy_params.py``) is listed with its default, its accepted values (the field's rule,
worded as its error message words it) and its help. A field of ours without help text is refused: the page cannot be
generated, and ``tests/test_docs_site.py`` fails naming it. Regenerate the committed page after changing a field:

    python docs/tools/config_reference.py

``tests/test_docs_site.py`` checks that the committed page equals what this script writes.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "configuration.md"

HEADER = """# Configuration reference

Every field sharpgrpo adds to TRL's `GRPOConfig`, with its default, the values it accepts and its help: the same
text as `python train.py --help` prints. All of TRL's own fields (`learning_rate`, `beta`, `loss_type`, ...) keep
their meaning; the ones sharpgrpo holds to a stricter range are listed in
[Errors and debugging, "Stricter than TRL"](errors.md#stricter-than-trl). Each field is a YAML key and a
command-line option (`--sg_tau 0.2`); the equations and the decisions behind the defaults are in the
[method notes](methods.md) (section 9 maps each field onto them).

This page is generated from the config's own field help by `docs/tools/config_reference.py`; a test checks that it is
current and that every field has help.
"""


def own_fields(config_class, base_class) -> list[dataclasses.Field]:
    """The dataclass fields of ``config_class`` that ``base_class`` (TRL's config) does not declare, in order."""
    inherited = {f.name for f in dataclasses.fields(base_class)}
    return [f for f in dataclasses.fields(config_class) if f.name not in inherited]


def missing_help(fields: list[dataclasses.Field]) -> list[str]:
    """The names of the fields whose help text is missing or blank."""
    return [f.name for f in fields if not str(f.metadata.get("help") or "").strip()]


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def table(fields: list[dataclasses.Field], rules: dict) -> str:
    rows = ["| field | default | accepted | help |", "|---|---|---|---|"]
    for f in fields:
        rule = rules.get(f.name)
        accepted = _cell(rule.describe()) if rule is not None else ""
        rows.append(f"| `{f.name}` | {_cell(_default(f))} | {accepted} | {_cell(f.metadata['help'])} |")
    return "\n".join(rows) + "\n"


def render() -> str:
    """The page's text. Raises ``ValueError`` naming every field of ours without help text."""
    from trl import GRPOConfig

    from sharpgrpo.config import FIELD_RULES, SharpGRPOConfig
    from sharpgrpo.strategy_params import StrategyParams

    ours = own_fields(SharpGRPOConfig, GRPOConfig)
    missing = missing_help(ours)
    if missing:
        raise ValueError(f"config fields without help text: {', '.join(missing)}")
    params = {f.name for f in dataclasses.fields(StrategyParams)}
    trainer = [f for f in ours if f.name not in params]
    strategy = [f for f in ours if f.name in params]
    return (
        HEADER
        + "\n## Trainer fields\n\nDeclared in `sharpgrpo/config.py` (`SharpGRPOConfig`).\n\n"
        + table(trainer, FIELD_RULES)
        + "\n## Strategy parameters\n\nDeclared in `sharpgrpo/strategy_params.py` (`StrategyParams`); a parameter "
        "that no selected strategy reads warns, naming the strategy it belongs to.\n\n"
        + table(strategy, FIELD_RULES)
    )


if __name__ == "__main__":
    sys.path.insert(0, str(PAGE.parents[1]))
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")
