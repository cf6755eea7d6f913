"""The rooms and their doors: which package may import which, no import circles, small folders
and short functions.

Every import counts, function-local ones included (they run too); only imports under
`if TYPE_CHECKING:` are left out, since they never run. docs/architecture.md draws the same
rules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("workloads", "sim", "executor", "servelab")

# Each room and the rooms it may import (itself always). The order is the layering:
# a room imports only rooms listed before it.
ALLOWED: dict[str, tuple[str, ...]] = {
    "workloads": (),
    "sim.specs": (),  # specifications as data, and the engine's default limits
    "sim.engine": ("workloads", "sim.specs"),
    "sim.cost": ("workloads", "sim.engine", "sim.specs"),
    "sim.replay": ("workloads", "sim.engine", "sim.specs", "sim.cost"),
    "sim.cluster": ("workloads", "sim.engine", "sim.specs", "sim.cost", "sim.replay"),
    "sim": ("workloads", "sim.engine", "sim.specs", "sim.cost", "sim.replay", "sim.cluster"),
    "executor": ("workloads", "sim"),
    "servelab": ("workloads", "sim", "executor"),
}
MAX_MODULES_PER_FOLDER = 15
MAX_FUNCTION_LINES = 60


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, known: set[str]) -> set[str]:
    """The project modules `module` imports when it runs (a `from P import m` of a submodule
    counts as importing P.m)."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1]
                                    + ([base] if base else []))
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name in known and name != module}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, name, known) for name, path in modules.items()}


def room_of(module: str) -> str:
    """The room a module lives in: a sub-package of sim, or a top-level package."""
    parts = module.split(".")
    if parts[0] == "sim" and len(parts) > 1 and f"sim.{parts[1]}" in ALLOWED:
        return f"sim.{parts[1]}"
    return parts[0]


def test_every_import_goes_through_an_allowed_door():
    wrong = []
    for module, targets in _graph().items():
        room = room_of(module)
        for target in targets:
            other = room_of(target)
            if other != room and not any(
                    other == allowed or other.startswith(allowed + ".") or (
                        allowed == "sim" and target.startswith("sim"))
                    for allowed in ALLOWED[room]):
                wrong.append(f"{module} -> {target}")
    assert not wrong, "imports that cross the rooms' rules:\n" + "\n".join(sorted(wrong))


def test_no_import_circles():
    graph = _graph()
    # Packages' __init__ modules import nothing here, so a module-level graph is the whole story.
    state: dict[str, int] = {}
    circles = []

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                circles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in state:
                walk(target, stack)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_sim_and_workloads_never_import_torch():
    for name, path in _modules().items():
        if name.startswith(("sim", "workloads")):
            text = path.read_text()
            assert "import torch" not in text, name


def test_no_folder_holds_more_than_fifteen_modules():
    crowded = []
    for top in (*PACKAGES, "tests", "benchmarks"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            count = len(list(folder.glob("*.py")))
            if count > MAX_MODULES_PER_FOLDER:
                crowded.append(f"{folder.relative_to(ROOT)}: {count}")
    assert not crowded, crowded


def test_no_function_is_longer_than_sixty_lines():
    """Counted from `def` to the last line of the body, decorators aside."""
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} (line {node.lineno}): {lines} lines")
    assert not long, "functions over the limit:\n" + "\n".join(long)


def test_installed_top_level_names_are_the_four_packages():
    tomllib = pytest.importorskip("tomllib")

    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    found = find_packages(str(ROOT), include=include)
    assert {name.split(".")[0] for name in found} == set(PACKAGES)
