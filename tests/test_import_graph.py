"""The packages' import graph: one-way layers, no cycles, a pure core.

Read from the source with :mod:`ast` (nothing is imported), so a new cycle fails here
before it shows up as an ImportError in some import order.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("maps_core", "app")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str) -> list[tuple[str, bool]]:
    """(imported module of our packages, inside a function?) for every import statement."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.append((mod, in_function))
                # ``from pkg import submodule`` imports the submodule too
                found.extend((f"{mod}.{a.name}", in_function) for a in child.names
                             if f"{mod}.{a.name}" in MODULES)
            visit(child, nested)

    visit(tree, False)
    return [(m, f) for m, f in found if m in MODULES and m != name]


GRAPH = {name: sorted({m for m, _ in _imports(name)}) for name in MODULES}


def _cycles() -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            strong(v)
    return out


def test_the_module_list_is_real():
    assert {"maps_core.maps", "maps_core.query", "maps_core.storage", "app.cli", "app.main"} <= set(MODULES)
    assert "maps_core.query" in GRAPH["maps_core.maps"]  # the parser sees imports


def test_no_import_cycles():
    assert _cycles() == []


def test_the_cycle_finder_finds_cycles(monkeypatch):
    """Guard against a finder that never reports: a planted back edge is a cycle."""
    monkeypatch.setitem(GRAPH, "maps_core.storage", [*GRAPH["maps_core.storage"], "maps_core.maps"])
    assert any("maps_core.maps" in c and "maps_core.storage" in c for c in _cycles())


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("maps_core")))
def test_core_is_pure_and_imports_at_the_top(name):
    """The core never imports the service (or fastapi / pydantic), and imports nothing
    inside functions (an in-function import hides a layering problem)."""
    tree = ast.parse(MODULES[name].read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.ImportFrom) and not n.level}
    assert not names & {"app", "fastapi", "pydantic", "pydantic_settings", "starlette"}
    assert [m for m, in_function in _imports(name) if in_function] == []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
            assert inner == [], f"{name}.{node.name} imports inside a function"
