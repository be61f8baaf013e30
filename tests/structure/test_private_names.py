"""No part of `accuracy` reaches into another part's private names (#45): a name with a
leading underscore is its module's own business, so the part that owns it can change it.

Read from the source with `ast` (every import, in functions and under `if TYPE_CHECKING:`
too). A part is a top-level package or module of `accuracy` (`dumpfile`, `server`, `cli`).
Three rules:

- no import of another part's private name (`from accuracy.x.y import _z`) or module
  (`accuracy.x._y`); the root package's own private helpers (`accuracy._lazy`) serve every
  part, which all live inside it;
- no assignment to a private attribute of anything but `self`/`cls` (`a._b = ...`,
  `a._b += ...`, `del a._b`, `setattr(a, "_b", ...)`), wherever the attribute is defined:
  what a class keeps private only it may set. torch's internals we must patch are listed
  in TORCH_PATCHES, each with why;
- no read of a private attribute that only other parts define (`owner._recorder`,
  `getattr(owner, "_scope")`). A name that the reading part defines too is not flagged (it
  may be its own), nor is an attribute of an object imported from outside `accuracy`
  (`torch._C`, `os._exit`); torch attributes that share a name with one of ours are listed
  in TORCH_NAMES.

`setattr` with a computed name cannot be read this way and is not checked.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "accuracy"

# torch internals patched on purpose: (the assignment target as written, why)
TORCH_PATCHES: list[tuple[str, str]] = [
    ("compile_fx._recursive_post_grad_passes", "compiled/reference: the graph before Inductor's "
     "post-grad passes is copied for the replay"),
    ("mod._recursive_post_grad_passes", "compiled/reference: the original put back"),
    ("eval_frame._callback_from_stance", "dumper/compiled/watch: dynamo's frame callback, to see "
     "which frames compile inside a dumped block"),
    ("convert_frame.CatchErrorsWrapper._handle_skip", "dumper/compiled/watch: frames dynamo skips"),
    ("mod._callback_from_stance", "dumper/compiled/watch: the original put back"),
    ("cls._handle_skip", "dumper/compiled/watch: the original put back"),
    ("root._accuracy_import", "dumper/compiled/codegen: our mark on Inductor's wrapper "
     "codegen that the generated module imports our hook once"),
]
# torch attributes read under a name one of our parts also defines: (name, what it is)
TORCH_NAMES: list[tuple[str, str]] = [
    ("_base", "torch.Tensor._base: the tensor a view was made from"),
]
# Reaches allowed for now, each with why; a stale entry fails test_known_lists_are_current.
KNOWN_IMPORTS: list[tuple[str, str, str]] = []  # (file, name, why); none today
KNOWN_ASSIGNMENTS: list[tuple[str, str, str]] = []  # (file, name, why); none today
KNOWN_READS: list[tuple[str, str, str]] = []  # (file, name, why); none today


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def _imports(module: str, path: Path, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """(`accuracy.x.y.name` or `accuracy.x.y`, line) for each import and dotted use."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                yield f"{base}.{a.name}", node.lineno
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            text = ast.unparse(node)
            if text.startswith("accuracy.") and not isinstance(node.value, ast.Call):
                yield text, node.lineno


def private_imports(source: dict[str, tuple[Path, ast.AST]]) -> list[tuple[str, str, int]]:
    """(file, imported accuracy name, line) of each private name taken from another part."""
    out = []
    for module, (path, tree) in source.items():
        for name, line in _imports(module, path, tree):
            parts = name.split(".")
            if parts[0] != "accuracy" or len(parts) < 2 or _part(name) == _part(module):
                continue
            private = [i for i, p in enumerate(parts) if _private(p)]
            if not private or (private == [1] and len(parts) > 2):  # the root's own helper
                continue
            out.append((_rel(path), name, line))
    return sorted(set(out))


def _walk_with_self(tree: ast.AST) -> Iterator[tuple[ast.AST, frozenset[str]]]:
    """Every node, with the names that are the object's own there: the first parameter of
    the enclosing method (`self`, `cls`), also inside functions nested in it."""

    def visit(node: ast.AST, own: frozenset[str], in_class: bool) -> Iterator[
            tuple[ast.AST, frozenset[str]]]:
        yield node, own
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                args = child.args.posonlyargs + child.args.args
                mine = own | {args[0].arg} if in_class and args else own
                yield from visit(child, mine, False)
            else:
                yield from visit(child, own, isinstance(child, ast.ClassDef))

    yield from visit(tree, frozenset(), False)


def _owner_is_self(node: ast.expr, own: frozenset[str]) -> bool:
    return isinstance(node, ast.Name) and node.id in own


def private_assignments(source: dict[str, tuple[Path, ast.AST]]) -> list[tuple[str, str, int]]:
    """(file, target as written, line) of each private attribute set on another object."""
    out = []
    for path, tree in source.values():
        for node, own in _walk_with_self(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign | ast.Delete):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("setattr", "delattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str) and _private(node.args[1].value):
                if not _owner_is_self(node.args[0], own):
                    out.append((_rel(path), f"{ast.unparse(node.args[0])}."
                                f"{node.args[1].value}", node.lineno))
                continue
            while targets:
                t = targets.pop()
                if isinstance(t, ast.Tuple | ast.List | ast.Starred):
                    targets += list(t.elts) if not isinstance(t, ast.Starred) else [t.value]
                elif isinstance(t, ast.Attribute) and _private(t.attr) \
                        and not _owner_is_self(t.value, own):
                    out.append((_rel(path), ast.unparse(t), node.lineno))
    return sorted(set(out))


def _defined(tree: ast.AST) -> Iterator[str]:
    """Private names a module defines: functions, classes, module names, attributes it sets."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr
        elif isinstance(node, ast.arg):
            yield node.arg


def _foreign_roots(tree: ast.AST) -> set[str]:
    """Names a module binds to things imported from outside `accuracy` (torch, os, ...)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names
                    if not a.name.startswith("accuracy")}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module \
                and not node.module.startswith("accuracy"):
            out |= {a.asname or a.name for a in node.names}
    return out


def private_reads(source: dict[str, tuple[Path, ast.AST]]) -> list[tuple[str, str, int]]:
    """(file, attribute, line) of each private attribute read that only other parts define."""
    defined_by: dict[str, set[str]] = {}
    for module, (_, tree) in source.items():
        for name in _defined(tree):
            if _private(name):
                defined_by.setdefault(name, set()).add(_part(module))
    torch_names = {n for n, _ in TORCH_NAMES}
    out = []
    for module, (path, tree) in source.items():
        foreign = _foreign_roots(tree)
        for node, own in _walk_with_self(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                owner, attr = node.value, node.attr
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) \
                    and isinstance(node.args[1].value, str):
                owner, attr = node.args[0], node.args[1].value
            else:
                continue
            if not _private(attr) or _owner_is_self(owner, own) or attr in torch_names:
                continue
            root = owner
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                continue
            owners = defined_by.get(attr, set())
            if owners and _part(module) not in owners:
                out.append((_rel(path), attr, node.lineno))
    return sorted(set(out))


@functools.cache
def _source() -> dict[str, tuple[Path, ast.AST]]:
    return {m: (p, ast.parse(p.read_text(), str(p))) for m, p in _modules().items()}


def test_no_part_imports_another_parts_private_name():
    known = {(f, n) for f, n, _ in KNOWN_IMPORTS}
    bad = [f"{f}:{line} {n}" for f, n, line in private_imports(_source()) if (f, n) not in known]
    assert not bad, ("private names of another part (give the name a public one there):\n"
                     + "\n".join(bad))


def test_no_private_attribute_is_set_from_outside():
    patches = {t for t, _ in TORCH_PATCHES}
    known = {(f, t) for f, t, _ in KNOWN_ASSIGNMENTS}
    bad = [f"{f}:{line} {t} = ..." for f, t, line in private_assignments(_source())
           if t not in patches and (f, t) not in known]
    assert not bad, ("private attributes set from outside their class (give the class a "
                     "method or a public attribute):\n" + "\n".join(bad))


def test_no_part_reads_another_parts_private_attribute():
    known = {(f, a) for f, a, _ in KNOWN_READS}
    bad = [f"{f}:{line} .{a}" for f, a, line in private_reads(_source()) if (f, a) not in known]
    assert not bad, ("private attributes of another part read (give them a public name "
                     "there):\n" + "\n".join(bad))


def test_known_lists_are_current():
    """An entry whose reach is gone must leave its list (so the lists stay true)."""
    source = _source()
    imports = {(f, n) for f, n, _ in private_imports(source)}
    assignments = private_assignments(source)
    reads = {(f, a) for f, a, _ in private_reads(source)}
    for f, n, who in KNOWN_IMPORTS:
        assert (f, n) in imports, f"{f} no longer imports {n} ({who}): remove the entry"
    for f, t, who in KNOWN_ASSIGNMENTS:
        assert (f, t) in {(g, u) for g, u, _ in assignments}, f"{f}: {t} ({who}) is gone"
    for f, a, who in KNOWN_READS:
        assert (f, a) in reads, f"{f} no longer reads .{a} ({who}): remove the entry"
    for t, why in TORCH_PATCHES:
        assert t in {u for _, u, _ in assignments}, f"{t} ({why}) is no longer patched"


def _one(text: str, module: str = "accuracy.compare.x") -> dict[str, tuple[Path, ast.AST]]:
    path = PACKAGE / Path(*module.split(".")[1:]).with_suffix(".py")
    return {module: (path, ast.parse(text))}


def test_the_checks_find_what_they_are_for():
    src = _one("from typing import TYPE_CHECKING\n"
               "from accuracy.dumpfile.reader import _H5\n"
               "from accuracy._lazy import lazy_getattr\n"
               "from accuracy.compare.engine import _own\n"
               "if TYPE_CHECKING:\n    from accuracy.server._x import y\n"
               "def f():\n    import accuracy.replay._cache\n")
    assert [n for _, n, _ in private_imports(src)] == [
        "accuracy.dumpfile.reader._H5", "accuracy.replay._cache", "accuracy.server._x.y"]
    src = _one("def f(d, o, cls):\n    d._seq = 1\n    o.x._n += 1\n    setattr(d, '_a', 2)\n"
               "    cls._handle = 1\n    setattr(d, 'public', 3)\n    d._p, d.q = 1, 2\n"
               "class C:\n    def m(self):\n        self._ok = 1\n"
               "        def inner():\n            self._ok2 = 2\n")
    assert {t for _, t, _ in private_assignments(src)} == {
        "d._seq", "o.x._n", "d._a", "cls._handle", "d._p"}
    src = {**_one("class R:\n    def __init__(self):\n        self._recorder = 1\n"
                  "        self._mine = 2\n", "accuracy.dumper.core"),
           **_one("import torch\ndef f(owner):\n    owner._mine\n    torch._C\n"
                  "    return owner._recorder, getattr(owner, '_recorder')\n"
                  "class S:\n    def g(self, o):\n        self._mine = o._mine\n",
                  "accuracy.compiled.source")}
    assert [(a, line) for _, a, line in private_reads(src)] == [("_recorder", 5)]
