"""The documentation site (mkdocs.yml; CI runs ``mkdocs build --strict``): the README is a short first page that
starts with the quick-start commands CI installs from and links every page; every page under docs/ is in the site's
nav and reachable from the first page by links; the configuration reference is current with the config's field help,
and a field of ours without help text is refused."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> set[str]:
    """Every page of the site, relative to docs/ (docs/tools/ holds the build's scripts, not pages)."""
    return {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if "tools" not in p.relative_to(DOCS).parts}


def nav_pages(nav) -> list[str]:
    found = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            found += nav_pages(value) if isinstance(value, list) else [value]
    return found


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = nav_pages(config["nav"])
    assert nav[0] == "index.md" and "docs/tools/hooks.py" in config["hooks"]  # the README, made the first page
    assert sorted(set(nav) - {"index.md"}) == sorted(pages()), "a page is missing from mkdocs.yml's nav (or too many)"
    assert len(nav) == len(set(nav))


def test_every_page_is_reachable_from_the_first_page():
    """Following the links of the README (the site's first page) and then of each page reached reaches every page."""
    hooks = load("hooks")
    seen, todo = set(), ["index.md"]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        text = hooks.readme_as_index(hooks.README.read_text(encoding="utf-8")) if page == "index.md" else \
            (DOCS / page).read_text(encoding="utf-8")
        for target in LINK.findall(text):
            resolved = (Path(page).parent / target).as_posix()
            assert (DOCS / resolved).is_file(), f"{page}: a link to {target}, which is not a page"
            todo.append(resolved)
    assert pages() - seen == set()


def test_the_readme_is_a_short_first_page_that_starts_with_the_quick_start():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count("\n") <= 250
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    setup, tests = blocks[0].strip(), blocks[1].strip()
    assert setup.endswith("python train.py --config configs/demo.yaml") and tests.endswith("python -m pytest -q")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert setup.removesuffix(" && python train.py --config configs/demo.yaml") in ci and tests in ci
    assert "mkdocs build --strict" in ci
    for page in pages():
        assert f"](docs/{page})" in readme, f"the README's map does not link docs/{page}"


def test_the_configuration_reference_is_current():
    reference = load("config_reference")
    assert (DOCS / "configuration.md").read_text(encoding="utf-8") == reference.render(), (
        "docs/configuration.md is stale: run python docs/tools/config_reference.py"
    )


def test_the_configuration_reference_covers_every_field_of_ours():
    from trl import GRPOConfig

    from sharpgrpo.config import SharpGRPOConfig

    reference = load("config_reference")
    ours = reference.own_fields(SharpGRPOConfig, GRPOConfig)
    assert {"strategies", "weight_placement", "sg_tau", "cw_sigma_eps"} <= {f.name for f in ours}
    assert not {f.name for f in ours} & {f.name for f in dataclasses.fields(GRPOConfig)}
    assert reference.missing_help(ours) == []
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert [f.name for f in ours if f"| `{f.name}` |" not in page] == []


def test_a_field_without_help_text_is_refused():
    """The check itself: a field of ours with no help (or a blank one) is named, and render refuses the config."""
    reference = load("config_reference")

    @dataclasses.dataclass
    class Base:
        theirs: int = 0

    @dataclasses.dataclass
    class Ours(Base):
        documented: int = dataclasses.field(default=1, metadata={"help": "What it does."})
        silent: int = 2
        blank: str = dataclasses.field(default="", metadata={"help": "  "})

    fields = reference.own_fields(Ours, Base)
    assert [f.name for f in fields] == ["documented", "silent", "blank"]
    assert reference.missing_help(fields) == ["silent", "blank"]


def test_render_refuses_a_config_field_without_help(monkeypatch):
    reference = load("config_reference")
    monkeypatch.setattr(reference, "missing_help", lambda fields: [fields[-1].name])
    with pytest.raises(ValueError, match="config fields without help text: "):
        reference.render()


def test_the_first_page_links_resolve_in_the_site():
    hooks = load("hooks")
    index = hooks.readme_as_index("see [Strategies](docs/strategies.md#composing) and `docs/methods.md`")
    assert index == "see [Strategies](strategies.md#composing) and `docs/methods.md`"
