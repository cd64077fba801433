"""The package's layout keeps its rules, read from the code's own imports (every ``import`` and ``from`` of
``sharpgrpo``, at module or function level; ``if TYPE_CHECKING:`` blocks aside):

* the wings stand on floors (``FLOORS``, lowest first): a module imports only from its own wing or from a wing on a
  lower floor, never one above it or beside it;
* no module imports itself back through others (no circles);
* the top level holds about ten modules, and the layout section of docs/development.md names every wing and top-level module.
"""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sharpgrpo"

# Lowest first. Wings on one floor do not import each other.
FLOORS = [
    {"validation", "paths"},  # base: no sharpgrpo imports
    {"registry", "settings"},  # name-keyed registries (their errors suggest names: validation.did_you_mean)
    {"strategy_params"},  # the one home of strategy parameters
    {"strategies"},  # pure tensor code: the methods, their registry and interfaces
    {"data"},
    {"models"},  # prepared models (tiny is warm-started on the demo's text)
    {"training", "run"},  # what the trainer's hooks call; the command's front end and lifetime
    {"config"},
    {"trainer"},
    {"__init__"},  # the public faces, loaded lazily
    {"evaluation"},
    {"diagnostics", "search", "tasks"},
    {"compare"},
    {"cli"},
    {"__main__"},
]
FLOOR = {wing: index for index, floor in enumerate(FLOORS) for wing in floor}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def wing(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def is_module(name: str) -> bool:
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or path.is_dir()


def imports() -> dict[str, set[str]]:
    """module -> the sharpgrpo modules it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module, tree = module_name(path), ast.parse(path.read_text(encoding="utf-8"))
        type_checking = {
            id(inner) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)
        }  # fmt: skip
        for node in ast.walk(tree):
            if id(node) in type_checking:
                continue
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sharpgrpo"):
                submodules = {f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}")}
                graph[module].update(submodules)
                if len(submodules) < len(node.names):  # names defined in the module itself, not only its submodules
                    graph[module].add(node.module)
            elif isinstance(node, ast.Import):
                graph[module].update(a.name for a in node.names if a.name.startswith("sharpgrpo"))
            assert not (isinstance(node, ast.ImportFrom) and node.level), f"{module}: relative import"
        graph[module].discard(module)
    return graph


def test_every_wing_has_a_floor():
    wings = {wing(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert wings - set(FLOOR) == set(), "a new wing or top-level module: give it a floor in FLOORS and docs/development.md"


@pytest.mark.parametrize("module, targets", sorted(imports().items()), ids=lambda v: v if isinstance(v, str) else "")
def test_imports_run_down_only(module, targets):
    source = wing(module)
    for target in sorted(targets):
        if wing(target) == source:
            continue
        assert FLOOR[wing(target)] < FLOOR[source], (
            f"{module} imports {target}: {wing(target)} is not on a floor below {source}"
        )


def test_no_circles():
    graph = imports()
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in graph.get(module, ()):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_the_top_level_is_small_and_the_layout_names_every_wing():
    top = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
    layout = layout_section()
    wings = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    for name in [f"{w}/" for w in wings] + [f"{m}.py" for m in top if m not in ("__init__", "__main__")]:
        assert f"`{name}" in layout, f"docs/development.md's layout does not name {name}"


def test_the_trainer_stays_glue():
    """trainer.py overrides TRL's hooks and hands on; what they call lives in training/ (at most 300 lines)."""
    lines = (PACKAGE / "trainer.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"sharpgrpo/trainer.py has {lines} lines; move what a hook calls into sharpgrpo/training/"


def layout_section() -> str:
    """docs/development.md's "Layout" section."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    return page[page.index("## Layout"):page.index("## Tests and benchmarks")]


def test_the_layout_names_every_training_module():
    """``training/`` is grouped by the hook that calls it: the layout names each group and each module in it."""
    layout = layout_section()
    training = PACKAGE / "training"
    names = [f"{path.name}/" for path in training.iterdir() if (path / "__init__.py").is_file()]
    names += [path.name for path in training.rglob("*.py") if path.name != "__init__.py"]
    missing = sorted(name for name in names if f"`{name}`" not in layout)
    assert not missing, f"docs/development.md's layout does not name training's {missing}"


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def resolves(reference: str) -> bool:
    """``sharpgrpo.a.b`` names a module, or a name defined in (or imported by) the longest module prefix."""
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            return cut == len(parts) or parts[cut] in defined_names(module)
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_code_the_docs_name_exists(doc):
    """Every file path (``sharpgrpo/...``, ``tests/...``, ``benchmarks/...``) and every dotted ``sharpgrpo.x.y`` the
    user docs name exists: a module moved or renamed fails here until the docs follow it."""
    import re

    text = doc.read_text(encoding="utf-8")
    paths = set(re.findall(r"(?<![\w/.])((?:sharpgrpo|tests|benchmarks)/[\w/.-]*\w)", text))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    wings = {path.stem for path in PACKAGE.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()}
    dotted = {d for d in re.findall(r"(?<![\w/.])(sharpgrpo(?:\.\w+)+)", text)
              if d.count(".") >= 2 or d.split(".")[1] in wings}  # `sharpgrpo.telemetry` is a metadata key
    unresolved = sorted(d for d in dotted if not resolves(d))
    assert not missing and not unresolved, f"{doc.name} names {missing + unresolved}, which do not exist"


def test_references_to_methods_sections_exist():
    """Every ``docs/methods.md §N`` (or ``§N.M``) in the code, tests, README and benchmarks names a section that
    exists."""
    import re

    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", methods, flags=re.MULTILINE))
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"),
             *DOCS]
    wrong = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        for number in re.findall(r"docs/methods\.md(?:'s)?,? (?:section )?§ ?(\d+(?:\.\d+)?)", text):
            if number not in sections:
                wrong.add(f"{path.relative_to(ROOT)}: §{number}")
    assert not wrong, f"references to sections docs/methods.md does not have: {sorted(wrong)}"
