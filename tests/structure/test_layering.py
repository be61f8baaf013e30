"""Data flows one way: the dumper records, the others read what it wrote.

The import graph is read from the source with `ast` (every import, also those inside
functions, since a lazy import is still an arrow). The package root `accuracy/__init__.py`
is the public facade and re-exports the parts, so it is left out of the circle check.
"""

from __future__ import annotations

import ast
from pathlib import Path

import accuracy

ROOT = Path(accuracy.__file__).parent
# What the dumper may not import: the parts that read dumps (they build on the dumper).
DUMPER_MUST_NOT_IMPORT = ("replay", "overflow", "compare", "server")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported accuracy module, line) for every import in one file."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "accuracy":  # `from accuracy import dumper`: the names are parts
                out += [(f"accuracy.{a.name}", node.lineno) for a in node.names]
            else:
                out.append((node.module, node.lineno))
    return [(m, line) for m, line in out if m.startswith("accuracy.")]


def _part(module: str) -> str:
    """The top-level part of the package a module belongs to ('' for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and not parts[1].startswith("__") else ""


def _arrows() -> dict[str, dict[str, str]]:
    """part -> {imported part: 'file:line' of one such import}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = _part(_module_name(path))
        for module, line in _imports(path):
            dst = _part(module)
            if dst != src:
                where = f"{path.relative_to(ROOT.parent)}:{line}"
                graph.setdefault(src, {}).setdefault(dst, where)
    return graph


def test_dumper_imports_no_reader_part():
    bad = [f"{where} imports accuracy.{dst}" for dst, where in _arrows().get("dumper", {}).items()
           if dst in DUMPER_MUST_NOT_IMPORT]
    assert not bad, "the dumper must not depend on the parts reading its dumps:\n" + "\n".join(bad)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle in `graph`, as the list of parts around it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_between_parts():
    arrows = _arrows()
    graph = {src: {d for d in dsts if d} for src, dsts in arrows.items() if src}
    circle = _cycle(graph)
    assert circle is None, "import circle between parts: " + ", ".join(
        f"{a} -> {b} ({arrows[a][b]})" for a, b in zip(circle, circle[1:], strict=False))


def test_cycle_finder_finds_a_circle():
    """The check above can fail: a made-up graph with a circle is caught."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_import_aten_needs_no_torch():
    """Compare (torch-free) reads op names from accuracy.aten: importing it loads no torch."""
    import subprocess
    import sys

    code = "import sys, accuracy.aten; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    assert out == "False"
