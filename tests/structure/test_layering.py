"""Data flows one way: the dumper records, the others read what it wrote.

The import graph is read from the source with `ast` (every import, also those inside
functions, since a lazy import is still an arrow, and those under `if TYPE_CHECKING:`, since
an annotation is read too). The package root `accuracy/__init__.py` is the public facade and
re-exports the parts, so it is left out of the circle check.

The pipeline's parts, in the order data flows through them (STAGES): a part may import a
part upstream of it only through that part's public face, the names and submodules its
`__init__.py` lists in `__all__`; it imports nothing downstream of it but the one write step
the flow itself is (the dumper hands its records to the dump file's writer). Parts outside
the pipeline (aten, errors, patterns, live, monitor, compiled, debugger, ...) are not ranked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import accuracy

ROOT = Path(accuracy.__file__).parent
# What the dumper may not import: the parts that read dumps (they build on the dumper).
DUMPER_MUST_NOT_IMPORT = ("replay", "overflow", "compare", "server")
# backend -> dumper -> dump file -> replay / compare / overflow (compare writes the report
# files) -> server: the order data flows through the pipeline's parts.
STAGES = {"device_backend": 0, "dumper": 1, "dumpfile": 2, "replay": 3, "compare": 3,
          "overflow": 3, "server": 4}
# The imports downstream the flow itself makes: the dumper writes (and in load mode reads)
# dump files.
WITH_THE_FLOW = {("dumper", "dumpfile")}
# Reaches past a public face that another branch of #45 removes; the lead empties this list
# at merge (a stale entry fails test_known_reaches_are_current). (file, module imported, why)
KNOWN_REACHES: list[tuple[str, str, str]] = [
    # the seam helper owns these files (the overflow finding record, replay's rerun)
    ("accuracy/overflow/scan.py", "accuracy.dumpfile.reader", "seam: scan.py"),
    ("accuracy/replay/ops.py", "accuracy.dumpfile.reader", "seam: replay/ops.py"),
    ("accuracy/replay/ops.py", "accuracy.device_backend.quantizer", "seam: replay/ops.py"),
    # overflow's public face re-exports the dumper's online overflow names: the dumper's
    # own face (dumper/__init__.py, the seam helper's) does not export them yet
    ("accuracy/overflow/__init__.py", "accuracy.dumper.finite_probe", "seam: dumper face"),
    ("accuracy/overflow/__init__.py", "accuracy.dumper.overflow_watch", "seam: dumper face"),
]


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported accuracy module, line) for every import in one file."""
    return [(m, line) for m, _, line in _imported_names(path)]


def _imported_names(path: Path) -> list[tuple[str, str | None, int]]:
    """(imported accuracy module, name taken from it or None, line) for every import in one
    file, relative imports resolved."""
    out: list[tuple[str, str | None, int]] = []
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base == "accuracy":  # `from accuracy import dumper`: the names are parts
                out += [(f"accuracy.{a.name}", None, node.lineno) for a in node.names]
            else:
                out += [(base, a.name, node.lineno) for a in node.names]
    return [(m, n, line) for m, n, line in out if m.startswith("accuracy.")]


def public_face(part: str) -> tuple[set[str], set[str]]:
    """(the names a part's `__init__.py` lists in `__all__`, the submodules among them),
    read with ast. A listed name that `__init__` binds to something taken from a submodule
    (`from .profiles import profiles`: a function) is a name, not that submodule."""
    init = ROOT / part / "__init__.py"
    if not init.exists():
        return set(), set()
    tree = ast.parse(init.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = set(ast.literal_eval(node.value))
    taken = {a.asname or a.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module
             and node.module.rsplit(".", 1)[-1] != part for a in node.names}
    modules = {n for n in names - taken
               if (ROOT / part / f"{n}.py").exists() or (ROOT / part / n).is_dir()}
    return names, modules


def _through_face(module: str, name: str | None,
                  faces: dict[str, tuple[set[str], set[str]]]) -> bool:
    """Whether `from module import name` (or `import module`) uses only the public face of
    the part `module` belongs to: the part itself with exported names, or a submodule it
    exports (then anything in that submodule)."""
    parts = module.split(".")
    names, modules = faces[parts[1]]
    if len(parts) == 2:
        return name is None or name in names
    return parts[2] in modules


def reaches(graph_root: Path = ROOT) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(imports of an upstream part past its public face as (file, module, line), imports
    against the flow as 'file:line imports module')."""
    faces = {p: public_face(p) for p in STAGES}
    past_face: list[tuple[str, str, int]] = []
    against: list[str] = []
    for path in sorted(graph_root.rglob("*.py")):
        src = _part(_module_name(path))
        if src not in STAGES:
            continue
        rel = str(path.relative_to(graph_root.parent))
        for module, name, line in _imported_names(path):
            dst = _part(module)
            if dst == src or dst not in STAGES:
                continue
            if STAGES[dst] < STAGES[src]:
                if not _through_face(module, name, faces):
                    past_face.append((rel, module, line))
            elif STAGES[dst] > STAGES[src] and (src, dst) not in WITH_THE_FLOW:
                against.append(f"{rel}:{line} imports {module}")
    return past_face, against


def test_upstream_parts_are_imported_through_their_public_face():
    past_face, _ = reaches()
    known = {(f, m) for f, m, _ in KNOWN_REACHES}
    bad = [f"{f}:{line} imports {m}" for f, m, line in past_face if (f, m) not in known]
    assert not bad, ("import an upstream part through its public face (its __init__'s "
                     "__all__), or add what is needed there:\n" + "\n".join(bad))


def test_no_part_imports_a_part_downstream_of_it():
    _, against = reaches()
    assert not against, "data flows one way; these import against it:\n" + "\n".join(against)


def test_known_reaches_are_current():
    past_face, _ = reaches()
    found = {(f, m) for f, m, _ in past_face}
    for f, m, who in KNOWN_REACHES:
        assert (f, m) in found, f"{f} -> {m} ({who}) is gone: remove it from KNOWN_REACHES"


def test_the_face_check_reads_exports_and_submodules():
    faces = {"dumpfile": ({"Dump", "schema"}, {"schema"})}
    assert _through_face("accuracy.dumpfile", "Dump", faces)
    assert _through_face("accuracy.dumpfile.schema", "address", faces)
    assert not _through_face("accuracy.dumpfile", "DumpWriter", faces)
    assert not _through_face("accuracy.dumpfile.writer", "DumpWriter", faces)
    assert "load_dump" in public_face("dumpfile")[0] and "dumper" in public_face("dumper")[0]
    assert "schema" in public_face("dumpfile")[1] and "reader" not in public_face("dumpfile")[1]
    # device_backend exports the function profiles(), not its module `profiles`
    names, modules = public_face("device_backend")
    assert "profiles" in names and "profiles" not in modules


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
