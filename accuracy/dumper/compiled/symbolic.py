"""Sizes of a `dynamic=True` program as text the dump keeps (accuracy/dumpfile/symsizes.py).

Inductor's buffer sizes and the SymInt values its graph passes to ops are sympy expressions
over the shape environment's symbols (`s0`, `s0*s1`); at code generation they are written
down as text, simplified by the graph's own size variables (which may have replaced one symbol
by another), and checked to be the arithmetic the dump's reader evaluates. A static size stays
an int.
"""

from __future__ import annotations

from typing import Any

from accuracy.dumpfile.symsizes import parse


def expr_text(g: Any, expr: Any) -> int | str:
    """A size expression as an int or checked text; ValueError when it is not arithmetic
    the reader evaluates."""
    try:
        return int(expr)
    except (TypeError, ValueError):
        pass
    try:
        expr = g.sizevars.simplify(expr)
        return int(expr)
    except Exception:  # noqa: BLE001 - still symbolic (or no sizevars): the expression
        pass
    text = str(expr)
    parse(text)
    return text


def sym_text(g: Any, val: Any) -> int | str:
    """A SymInt/SymFloat (a node's `meta['val']`) as expression text."""
    node = getattr(val, "node", None)
    expr = getattr(node, "expr", None)
    if expr is None:
        raise ValueError(f"{type(val).__name__} without an expression")
    return expr_text(g, expr)


def is_symbolic(val: Any) -> bool:
    """Whether a node's value is a symbolic scalar (a size, not a tensor)."""
    import torch

    return isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool)


def sizes_of(g: Any, name: str) -> list[int | str] | None:
    """The size of buffer or graph input `name`, each dimension an int or expression text;
    None when unknown."""
    try:
        node = g.graph_inputs.get(name) if name in g.graph_inputs else g.try_get_buffer(name)
        if node is None or not hasattr(node, "get_size"):
            return None
        return [expr_text(g, s) for s in node.get_size()]
    except Exception:  # noqa: BLE001 - no layout or no text for it: unknown
        return None


def layout_of(g: Any, name: str) -> tuple[list[int | str], list[int | str]] | None:
    """(size, stride) of buffer or graph input `name` as ints or expression text."""
    try:
        node = g.graph_inputs.get(name) if name in g.graph_inputs else g.try_get_buffer(name)
        if node is None:
            return None
        return ([expr_text(g, s) for s in node.get_size()],
                [expr_text(g, s) for s in node.get_stride()])
    except Exception:  # noqa: BLE001 - no layout: the output's own layout
        return None


def symbolic(dims: Any) -> bool:
    """Whether a size list holds an expression."""
    return any(isinstance(d, str) for d in dims or ())
