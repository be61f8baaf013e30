"""Name patterns users type for ops and modules, matched the same way everywhere."""

from __future__ import annotations

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
