"""The FX node an Inductor IR buffer holds, for the two readers of a kernel's buffers: the
recording hooks (compiled/inductor.py) and replay's reference graphs (compiled/reference.py).

An in-place write (a compiled optimizer's parameter update, BatchNorm's running statistics)
has no origin node of its own: Inductor names it after the `copy_` into the mutated buffer, and
its value is that copy's source.
"""

from __future__ import annotations

from typing import Any


def output_node(g: Any, name: str, follow_copy: bool = True) -> Any:
    """The FX node whose value IR buffer `name` holds after its kernel: its origin node; for
    a mutation of a graph input or an earlier buffer (no origin node of its own), the source
    of the `copy_` into it (the `copy_` itself without `follow_copy`)."""
    buf = g.try_get_buffer(name)
    node = buf.get_origin_node() if hasattr(buf, "get_origin_node") else None
    if node is None and buf is not None:
        real = (getattr(getattr(g, "scheduler", None), "mutation_real_name", None)
                or {}).get(name)
        copies = [n for n in getattr(buf, "get_origins", lambda: ())()
                  if "copy_" in str(getattr(n, "target", ""))]
        into = [n for n in copies if n.args and getattr(n.args[0], "name", None) == real]
        pick = into or copies
        node = pick[0] if len(pick) == 1 else None
    return copy_source(node) if follow_copy else node


def copy_source(node: Any) -> Any:
    """The node whose value a `copy_` into a mutated buffer writes (its source), else `node`:
    an in-place write's value is its source's."""
    for _ in range(8):
        if node is None or "copy_" not in str(getattr(node, "target", "")) \
                or len(node.args) < 2 or not hasattr(node.args[1], "meta"):
            return node
        node = node.args[1]
    return node
