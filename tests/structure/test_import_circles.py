"""No import circle in `accuracy` (#13): data flows one way, and each module can be read, tested
and imported without the ones that use it.

The graph is built from the source with `ast`: every `import` and `from ... import` counts,
at module level, inside a function (a deferred import is still a dependency) or under
`if TYPE_CHECKING:` (an annotation-only import is still a circle for a reader, who must read
both modules to read either). `from pkg import name` points at the submodule `pkg.name` when
there is one, else at `pkg` (its `__init__`).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "accuracy"
ROOT = "accuracy"  # see import_graph

# Circles and arrows still open on other branches of #13, removed when the lead merges them;
# the lead empties these lists at merge (a stale entry fails test_known_lists_are_current).
KNOWN: list[tuple[frozenset[str], str]] = []  # circles allowed for now: none
# dumper/ must import nothing downstream (replay, overflow, compare, server, live): online
# overflow and load mode become observers under dumper/ (the dumper engineer).
KNOWN_DUMPER_ARROWS: list[tuple[str, str, str]] = []  # allowed for now: none
DOWNSTREAM = ("replay", "overflow", "compare", "server", "live")


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, anywhere: in functions and under `if TYPE_CHECKING:` too."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def import_graph() -> dict[str, set[str]]:
    """module -> the modules it imports. `import accuracy` (for `__version__`, `__file__`) is
    left out: every module imports its root package anyway, and the root's `__init__` holds
    only names loaded on first use (PEP 562), which tests/test_cli_startup.py keeps light."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level-1 more
                    pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)]
                    base = ".".join(pkg + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            for t in targets:
                while t and t not in mods and "." in t:  # `import a.b.func`-like: the module
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod and t != ROOT:
                    graph[mod].add(t)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as one cycle
    through its members, for the message."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) for comp in sccs]


def _cycle_in(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One cycle inside a strongly connected component: a shortest way back to its start."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def test_the_graph_sees_deferred_and_annotation_only_imports():
    graph = import_graph()
    # accuracy/cli.py imports the parts by name (importlib), never statically
    assert "accuracy.errors" in graph["accuracy.cli"]
    # overflow/scan imports confirm inside scan()
    assert "accuracy.overflow.confirm" in graph["accuracy.overflow.scan"]
    # compare/__init__ names compare() for type checkers only (it loads it on first use)
    assert "accuracy.compare.api" in graph["accuracy.compare"]
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.b\nelse:\n" \
             "    import c\ndef f():\n    from d import e\n"
    found = [n.names[0].name for n in _imports(ast.parse(source))][1:]
    assert found == ["a.b", "c", "e"]
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(loop) == [["a", "b", "c", "a"]]


def test_no_import_circle():
    found = circles(import_graph())
    unknown = [c for c in found if not any(set(c) <= members for members, _ in KNOWN)]
    assert not unknown, "import circles:\n" + "\n".join(" -> ".join(c) for c in unknown)


def test_dumper_imports_nothing_downstream():
    graph = import_graph()
    arrows = sorted((m, t) for m in graph if m.startswith("accuracy.dumper")
                    for t in graph[m] if t.split(".")[1:2] and t.split(".")[1] in DOWNSTREAM)
    unknown = [a for a in arrows if a not in {(m, t) for m, t, _ in KNOWN_DUMPER_ARROWS}]
    assert not unknown, "dumper imports downstream parts:\n" + "\n".join(
        f"{m} -> {t}" for m, t in unknown)


def test_known_lists_are_current():
    """An entry whose circle or arrow is gone must leave the list (so the list stays true)."""
    graph = import_graph()
    found = circles(graph)
    for members, who in KNOWN:
        assert any(set(c) <= members for c in found), f"{sorted(members)} ({who}) is gone"
    for m, t, who in KNOWN_DUMPER_ARROWS:
        assert t in graph.get(m, set()), f"{m} -> {t} ({who}) is gone"


def test_errors_module_imports_no_part():
    assert import_graph()["accuracy.errors"] == set()
