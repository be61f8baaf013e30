"""Symbolic sizes of a `dynamic=True` compiled program, as the dump stores them.

A kernel compiled with dynamic shapes reads sizes that are symbols (`s0`, `s0*s1`): its
reference (accuracy/dumper/compiled/reference.py) keeps them as expression text, and the symbolic
size of each buffer it read and wrote. Replay binds the symbols of one launch from the shapes
its buffers were recorded with, then evaluates the sizes the ops need.

The text comes from a file: it is parsed with `ast` and evaluated by this module's own walk
over integer arithmetic and a few named functions (the ones sympy prints for Inductor's size
expressions), never by `eval`; anything else is refused with a ValueError. Torch-free.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable, Iterable
from typing import Any

MAX_CHARS = 1000  # one size expression; longer is no size
MAX_NODES = 200
_SYMBOL = re.compile(r"^[a-z]{1,3}[0-9]+$")  # s0, u3, ps1... (sympy's names for sizes)
_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


def _floordiv(a: Any, b: Any) -> Any:
    return a // b


def _modular_indexing(x: Any, div: Any, mod: Any) -> Any:
    return (x // div) % mod


def _ceildiv(a: Any, b: Any) -> Any:
    return -(-a // b)


def _exact_div(a: Any, b: Any) -> Any:
    if b == 0 or a % b:
        raise ValueError(f"{a}/{b} is not a whole size")
    return a // b


_FUNCS: dict[str, Callable[..., Any]] = {
    "FloorDiv": _floordiv, "CleanDiv": _exact_div, "IntTrueDiv": _exact_div,
    "ModularIndexing": _modular_indexing, "Mod": operator.mod, "PythonMod": operator.mod,
    "CeilDiv": _ceildiv, "Max": max, "Min": min, "Abs": abs,
    "ToFloat": float, "TruncToInt": lambda x: int(math.trunc(x)),
    "FloatTrueDiv": operator.truediv, "OpaqueUnaryFn_sqrt": math.sqrt, "sqrt": math.sqrt,
}


class Unbound(ValueError):
    """The expression names a symbol no binding holds."""

    def __init__(self, name: str) -> None:
        super().__init__(f"symbolic size {name} is not bound")
        self.name = name


def parse(text: str) -> ast.expr:
    """The expression tree of one size expression, checked to be arithmetic only."""
    if not isinstance(text, str) or len(text) > MAX_CHARS:
        raise ValueError("size expression is not text of at most "
                         f"{MAX_CHARS} characters")
    if text.count("(") > 50:
        raise ValueError("size expression nested too deep")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, MemoryError, RecursionError):
        raise ValueError(f"size expression {text[:80]!r} does not parse") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ValueError(f"size expression of over {MAX_NODES} terms")
    for n in nodes:
        ok = isinstance(n, ast.BinOp | ast.UnaryOp | ast.Call | ast.Name | ast.Constant
                        | ast.operator | ast.unaryop | ast.Load)
        if isinstance(n, ast.Constant) and (isinstance(n.value, bool)
                                            or not isinstance(n.value, int | float)):
            ok = False
        if isinstance(n, ast.Name) and not (_SYMBOL.match(n.id) or n.id in _FUNCS):
            ok = False
        if isinstance(n, ast.Call) and (not isinstance(n.func, ast.Name)
                                        or n.func.id not in _FUNCS or n.keywords):
            ok = False
        if not ok:
            raise ValueError(f"size expression {text[:80]!r} holds {type(n).__name__}, "
                             "not integer arithmetic")
    return tree


def symbols(text: str) -> set[str]:
    """The symbols an expression names."""
    return {n.id for n in ast.walk(parse(text)) if isinstance(n, ast.Name)
            and n.id not in _FUNCS}


def _eval(node: ast.expr, env: dict[str, int]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise Unbound(node.id)
        return env[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.USub):
            return -v
        if isinstance(node.op, ast.UAdd):
            return v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow):
            if not isinstance(b, int) or not 0 <= b <= 64 or abs(a) > 2 ** 32:
                raise ValueError("size power out of range")
            return a ** b
        if isinstance(node.op, ast.Div):
            return _exact_div(a, b) if isinstance(a, int) and isinstance(b, int) else a / b
        fn = _BINOPS.get(type(node.op))
        if fn is not None:
            if isinstance(node.op, ast.FloorDiv | ast.Mod) and b == 0:
                raise ValueError("size divided by zero")
            return fn(a, b)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _FUNCS[node.func.id](*[_eval(a, env) for a in node.args])
    raise ValueError(f"size expression holds {type(node).__name__}")


def evaluate(text: str | int, env: dict[str, int]) -> Any:
    """The value of a size expression (an int stays an int) under `env`; Unbound when it
    names a symbol `env` lacks, ValueError when it is no arithmetic."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    try:
        return _eval(parse(text), env)
    except (ArithmeticError, TypeError, RecursionError) as e:
        raise ValueError(f"size expression {str(text)[:80]!r}: {e}") from None


def bind(pairs: Iterable[tuple[str | int, int]]) -> dict[str, int]:
    """Symbol -> value from (size expression, recorded size) pairs: a dimension that is one
    symbol binds it; one with a single unbound symbol in which it is linear (`s0*s1` once
    `s0` is bound, `2*s0 + 1`) is solved for it. ValueError when the recorded sizes
    contradict each other (the shapes are not what the reference was built for)."""
    eqs = [(parse(e), int(v)) for e, v in pairs if isinstance(e, str)]
    env: dict[str, int] = {}
    changed = True
    while changed:
        changed = False
        for tree, value in eqs:
            free = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                    and n.id not in _FUNCS and n.id not in env}
            if len(free) != 1:
                continue
            name = free.pop()
            got = _solve(tree, value, name, env)
            if got is not None:
                env[name] = got
                changed = True
    for tree, value in eqs:
        try:
            if _eval(tree, env) != value:
                raise ValueError(f"recorded size {value} is not {ast.unparse(tree)} with "
                                 + ", ".join(f"{k}={v}" for k, v in sorted(env.items())))
        except (Unbound, ArithmeticError, TypeError):
            continue
    return env


def _solve(tree: ast.expr, value: int, name: str, env: dict[str, int]) -> int | None:
    """The integer `x` with tree(name=x) == value, when the tree is linear in it."""
    try:
        f0 = _eval(tree, {**env, name: 0})
        f1 = _eval(tree, {**env, name: 1})
        f2 = _eval(tree, {**env, name: 2})
    except (Unbound, ValueError, ArithmeticError, TypeError):
        return None
    slope = f1 - f0
    if slope == 0 or f2 - f1 != slope or (value - f0) % slope:
        return None
    x = (value - f0) // slope
    try:
        return x if x >= 0 and _eval(tree, {**env, name: x}) == value else None
    except (ValueError, ArithmeticError, TypeError):
        return None
