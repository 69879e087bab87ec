"""The package's layers, written once, and a walk of its imports that keeps them.

Layers, lowest first. A module may import modules of its own group and of
any lower layer; groups of one layer are independent of each other; nothing
imports upward, and no import chain forms a cycle. Every import counts,
module-level or inside a function, TYPE_CHECKING ones included: an import
moved into a function to dodge a loop is still the loop.

    python tests/test_layers.py     prints the figures (edges, upward imports,
                                    cycles, function-level imports, `Any`)
"""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "providers", "cache")

# The layers are the folders, lowest first: (layer, groups), a group being
# one folder (a module prefix). A module belongs to the longest prefix it
# starts with, so `engine` is the engine core: the modules at the top of
# engine/, every subfolder of engine/ being a layer of its own. This list is
# the only place the layers are written; docs/architecture.md shows it.
LAYERS: list[tuple[str, list[list[str]]]] = [
    ("shared types", [["providers.base"]]),
    ("providers, cache", [["providers"], ["cache"]]),
    ("engine core", [["engine"]]),
    ("development server", [["engine.loopback"]]),
    ("benchmark", [["engine.benchmark"]]),
    ("command line", [["engine.cli"]]),
    ("entry point", [["tulving_bench"]]),
]


def module_files() -> dict[str, Path]:
    files = {"tulving_bench": REPO / "tulving_bench.py"}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join(parts)] = path
    return files


def _target(name: str, modules: set[str]) -> str | None:
    """The project module an import names (`a.b.c` may be a.b's attribute c)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports(files: dict[str, Path]) -> list[tuple[str, str, bool]]:
    """(importer, imported, inside a function) for every import of a project module."""
    modules = set(files)
    edges = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        in_function: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                names = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for name in names:
                target = _target(name, modules)
                if target is not None and target != module:
                    edges.append((module, target, id(node) in in_function))
                    break  # `from a.b import c, d`: one edge per statement and target module
    return sorted(set(edges))


def any_names(tree: ast.AST) -> int:
    """How many times a module names `typing.Any` (the figure the size check keeps under its limit)."""
    return sum(1 for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "Any")


def layer_of(module: str) -> tuple[int, int] | None:
    """(layer index, group index) by the longest matching prefix."""
    best: tuple[int, tuple[int, int]] | None = None
    for li, (_, groups) in enumerate(LAYERS):
        for gi, prefixes in enumerate(groups):
            for prefix in prefixes:
                if module == prefix or module.startswith(prefix + "."):
                    if best is None or len(prefix) > best[0]:
                        best = (len(prefix), (li, gi))
    return None if best is None else best[1]


def violations(edges: list[tuple[str, str, bool]]) -> list[str]:
    found = []
    for a, b, _ in edges:
        la, lb = layer_of(a), layer_of(b)
        if la is None or lb is None:
            continue
        if la[0] < lb[0]:
            found.append(f"{a} ({LAYERS[la[0]][0]}) imports upward {b} ({LAYERS[lb[0]][0]})")
        elif la[0] == lb[0] and la[1] != lb[1]:
            found.append(f"{a} imports {b}: independent groups of the layer {LAYERS[la[0]][0]!r}")
    return found


def cycles(edges: list[tuple[str, str, bool]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b, _ in edges:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    unplaced = [m for m in module_files() if layer_of(m) is None]
    assert not unplaced, f"modules in no layer of tests/test_layers.py: {unplaced}"


def test_no_import_goes_upward_or_across_independent_groups():
    assert violations(imports(module_files())) == []


def test_no_import_cycle():
    assert cycles(imports(module_files())) == []


def test_the_walker_sees_upward_imports_and_cycles(tmp_path, monkeypatch):
    """The checks themselves can fail: a cache module that imports the
    scheduler inside a function, and a pair of modules importing each other."""
    edges = [("cache.store", "engine.scheduler", True), ("engine.dispatch", "engine.scheduler", False),
             ("engine.scheduler", "engine.dispatch", False)]
    assert violations(edges) == ["cache.store (providers, cache) imports upward engine.scheduler (engine core)"]
    assert cycles(edges) == [["engine.dispatch", "engine.scheduler"]]
    assert violations([("providers.openai_http", "cache.keys", False)])  # independent groups


def _figures() -> None:
    files = module_files()
    edges = imports(files)
    any_count = sum(any_names(ast.parse(p.read_text(encoding="utf-8"))) for p in files.values())
    print(f"modules {len(files)}, import edges {len(edges)}, inside functions "
          f"{sum(1 for e in edges if e[2])}")
    print(f"upward or cross-group imports {len(violations(edges))}, cycles {len(cycles(edges))}, "
          f"`Any` names {any_count}")
    for line in violations(edges):
        print("  ", line)
    for component in cycles(edges):
        print("   cycle:", " <-> ".join(component))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _figures()
