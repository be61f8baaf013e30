"""Name patterns users type for ops and modules, matched the same way everywhere."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase


def op_matches(pattern: str, op: str) -> bool:
    """`aten.mm` matches every overload (`aten.mm.default`, ...); globs like `aten.*norm*` work;
    a bare name (`mm`, `addmm`) means the aten op, as users write it; the C++ spelling that
    DebugMode and profiler traces print (`aten::addmm`) means the same op."""
    pattern = pattern.replace("::", ".")
    if "." not in pattern and not any(c in pattern for c in "*?["):
        pattern = "aten." + pattern
    return op == pattern or op.startswith(pattern + ".") or fnmatchcase(op, pattern)


def strip_root(module: str) -> str:
    """`MyModel.encoder.layers.0` -> `encoder.layers.0` (module trackers prefix the root class)."""
    _, _, rest = module.partition(".")
    return rest


def module_matches(pattern: str, module: str) -> bool:
    """Match a module path with or without its leading root class name.

    `encoder.layers.0.*` matches `MyModel.encoder.layers.0.linear1`, as a user who wrote
    `model.encoder.layers[0]` expects. A pattern also matches the module itself and everything
    under it when it names a module exactly (`encoder.layers.0`).
    """
    for name in (module, strip_root(module)):
        if not name:
            continue
        if fnmatchcase(name, pattern) or name == pattern or name.startswith(pattern + "."):
            return True
    return False


def closest(pattern: str, names: Iterable[str], limit: int = 8) -> list[str]:
    """Up to `limit` of `names`, the closest to `pattern` first (by the op's own name, so
    `aten.gleu` finds `aten.gelu.default` before `aten.gt.Scalar`): what a 'matches nothing'
    error lists, so a misspelling reads as one and the right spelling is on the screen."""
    from difflib import SequenceMatcher

    want = _bare(pattern.replace("::", "."))
    unique = sorted(set(names))

    def score(name: str) -> float:
        return SequenceMatcher(None, want, _bare(name), autojunk=False).ratio()

    return sorted(unique, key=lambda n: (-score(n), n))[:limit]


def _bare(name: str) -> str:
    """`aten.gelu.default` -> `gelu`: the part a user misspells (other names whole)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "c10d", "_c10d_functional"):
        return parts[1]
    return name


def unmatched_ops(patterns: Iterable[str], ops: Iterable[str]) -> list[str]:
    """The patterns of `patterns` that match none of `ops`."""
    names = set(ops)
    return [p for p in patterns if not any(op_matches(p, n) for n in names)]


def no_op_message(pattern: str, ops: Iterable[str], where: str) -> str:
    """'op pattern X matches no op in WHERE; its ops, closest first: ...' (one line)."""
    near = closest(pattern, ops)
    listed = ", ".join(near) if near else "none"
    return (f"op pattern {pattern!r} matches no op in {where}; its ops, closest first: "
            f"{listed} (`aten.gelu`, `aten::gelu`, `gelu` and globs such as `aten.*norm*` "
            "all match aten.gelu's overloads)")
