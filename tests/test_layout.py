"""The package's layout keeps its rules, read from the code's own imports (every ``import`` and ``from`` of
``sharpgrpo``, at module or function level; ``if TYPE_CHECKING:`` blocks aside):

* the wings stand on floors (``FLOORS``, lowest first): a module imports only from its own wing or from a wing on a
  lower floor, never one above it or beside it;
* no module imports itself back through others (no circles);
* the top level holds about ten modules, and the README's layout section names every wing and top-level module.
"""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sharpgrpo"

# Lowest first. Wings on one floor do not import each other.
FLOORS = [
    {"registry", "validation", "paths", "settings"},  # base: no sharpgrpo imports but each other
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
    assert wings - set(FLOOR) == set(), "a new wing or top-level module: give it a floor in FLOORS and the README"


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


def test_the_top_level_is_small_and_the_readme_names_every_wing():
    top = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert len(top) <= 10, top
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme[readme.index("### Layout"):readme.index("### Tests and benchmarks")]
    wings = sorted(path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file())
    for name in [f"{w}/" for w in wings] + [f"{m}.py" for m in top if m not in ("__init__", "__main__")]:
        assert f"`{name}" in layout, f"README's layout does not name {name}"
