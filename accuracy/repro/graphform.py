"""A kernel's fused graph read from a dump: validated into a closed form, printed as Python.

`accuracy repro` writes a script that people run. What the dump holds for it is data (the
`fused_graph` form of dumper/compiled/reference.py: input names, nodes of an op name and
arguments in the dump's argument encoding, output value indices), and the script's code is
printed here, by this module, from the validated form: every identifier is ours (`v3`, `torch.ops`,
`torch.device`) or an op name that `safeops.compute_op` resolved to a real ATen/prims
`OpOverload` on the allow-list; every literal is the `repr` of a validated number, bool, None
or word, or our own spelling of a dtype, device, memory format or layout looked up by name.
Nothing of the dump's text is copied into the script, and nothing is parsed as Python.

A malformed form (a wrong type, an unknown op, a placeholder pointing forward, sizes past the
limits) is a UsageError with one line; nothing is written then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from keyword import iskeyword
from typing import Any

from accuracy.errors import UsageError

MAX_NODES = 2000  # as dumper/compiled/reference.py writes at most
MAX_INPUTS = 1000
MAX_LIST = 4096  # elements of one list argument
MAX_DEPTH = 3  # lists nested in one argument (Tensor?[] is one)
MAX_TEXT = 1 << 20  # one node's encoded arguments
MAX_WORD = 256
GETITEM, SYM = "getitem", "sym"


class FormError(UsageError):
    """The recorded graph is not a form `accuracy repro` accepts."""


@dataclass(frozen=True)
class Ref:
    """Value `index` of the graph: an input, then each node's result."""

    index: int


@dataclass(frozen=True)
class Node:
    op: str  # "namespace.op.overload" (resolved and allowed) or GETITEM
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Graph:
    inputs: list[str]
    nodes: list[Node | int | float]  # a symbolic size: its value for this launch
    outputs: list[int | None]


def _fail(why: str) -> FormError:
    return FormError(f"the recorded subgraph is refused: {why} (damaged or crafted dump)")


def validate(form: Any, n_outputs: int, env: dict[str, int] | None = None) -> Graph:
    """The closed form of `form` (the `fused_graph` of a dump's kernel row), with `sym` nodes
    evaluated under `env` (the launch's size bindings); FormError when anything in it is not
    what dumper/compiled/reference.py writes."""
    if not isinstance(form, dict):
        raise _fail(f"it is a {type(form).__name__}, not a table")
    inputs, nodes, outputs = form.get("inputs"), form.get("nodes"), form.get("outputs")
    if not isinstance(inputs, list) or not isinstance(nodes, list) \
            or not isinstance(outputs, list):
        raise _fail("it lacks the lists inputs, nodes and outputs")
    if len(inputs) > MAX_INPUTS or len(nodes) > MAX_NODES:
        raise _fail(f"over {MAX_INPUTS} inputs or {MAX_NODES} nodes")
    if not all(isinstance(b, str) and 0 < len(b) <= MAX_WORD for b in inputs):
        raise _fail("an input name is not a short text")
    if len(outputs) != n_outputs:
        raise _fail(f"{len(outputs)} outputs for a kernel of {n_outputs}")
    done: list[Node | int | float] = []
    values: list[Any] = [Ref(i) for i in range(len(inputs))]  # what a placeholder stands for
    for k, raw in enumerate(nodes):
        node = _node(k, raw, values, env or {})
        done.append(node)
        values.append(node if not isinstance(node, Node) else Ref(len(values)))
    n_values = len(inputs) + len(done)
    for o in outputs:
        if o is not None and (type(o) is not int or not 0 <= o < n_values):
            raise _fail(f"output value {str(o)[:40]!r} is not a value of the graph")
    return Graph(list(inputs), done, list(outputs))


def _node(k: int, raw: Any, values: list[Any], env: dict[str, int]) -> Node | int | float:
    from accuracy import safeops
    from accuracy.dumpfile import symsizes
    from accuracy.dumpfile.argcodec import decode_call

    if not isinstance(raw, dict):
        raise _fail(f"node {k} is not a table")
    op = raw.get("op")
    if op == SYM:
        try:
            value = symsizes.evaluate(raw.get("expr"), env)
        except ValueError as e:
            raise _fail(f"node {k}'s size: {str(e)[:120]}") from None
        if type(value) not in (int, float) or (type(value) is int and abs(value) >= 2 ** 63):
            raise _fail(f"node {k}'s size is no number")
        return value
    text = raw.get("args")
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise _fail(f"node {k}'s arguments are not text of at most {MAX_TEXT} characters")
    try:
        args, kwargs = decode_call(text, values)
    except ValueError as e:
        raise _fail(f"node {k}'s arguments: {str(e)[:120]}") from None
    for v in [*args, *kwargs.values()]:
        _check_value(k, v, 0)
    if op == GETITEM:
        if kwargs or len(args) != 2 or not isinstance(args[0], Ref) or type(args[1]) is not int:
            raise _fail(f"node {k} is a getitem of something else than a value and an index")
        return Node(GETITEM, tuple(args), {})
    try:
        fn = safeops.compute_op(op)
        safeops.check_call(fn, args, kwargs)
    except safeops.RefusedOp as e:
        raise _fail(f"node {k}: {e}") from None
    return Node(op, tuple(args), dict(kwargs))


def _check_value(k: int, v: Any, depth: int) -> None:
    """A decoded argument is of the closed types (the codec already made dtypes, devices,
    memory formats and layouts real torch objects by name lookup)."""
    import torch

    from accuracy.dumpfile.argcodec import LAYOUTS, MEMORY_FORMATS

    if v is None or type(v) in (bool, float, complex):
        return
    if type(v) is int:
        if abs(v) >= 2 ** 63:
            raise _fail(f"node {k} holds an integer past 64 bits")
        return
    if type(v) in (Ref, str):  # a Ref is one the codec bounded to values before the node;
        return                 # a word is checked against its parameter (safeops.check_call)
    if type(v) is list:
        if depth >= MAX_DEPTH or len(v) > MAX_LIST:
            raise _fail(f"node {k} holds a list nested over {MAX_DEPTH} deep or of over "
                        f"{MAX_LIST} items")
        for x in v:
            _check_value(k, x, depth + 1)
        return
    if isinstance(v, torch.dtype | torch.device) or v in MEMORY_FORMATS.values() \
            or v in LAYOUTS.values():
        return
    raise _fail(f"node {k} holds a {type(v).__name__}, not a number, word or tensor")


# -- printing: every character of the code below comes from this module ------------------


def _lit(v: Any) -> str:
    import torch

    from accuracy.dumpfile.dtypes import dtype_name, torch_dtypes

    if type(v) is Ref:
        return f"v{int(v.index)}"
    if v is None or type(v) is bool:
        return repr(v)
    if type(v) is int:
        return repr(int(v))
    if type(v) is float:
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "-float('inf')"
        return repr(float(v))
    if type(v) is complex:
        return f"complex({_lit(v.real)}, {_lit(v.imag)})"
    if type(v) is str:
        return repr(str(v))
    if type(v) is list:
        return "[" + ", ".join(_lit(x) for x in v) + "]"
    if isinstance(v, torch.dtype):
        name = dtype_name(v)
        if not name.isidentifier() or torch_dtypes().get(name) is not v:
            raise _fail(f"dtype {name[:40]!r} has no name of its own in torch")
        return f"torch.{name}"
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    for table in _tables():
        for spelled, obj in table.items():
            if v is obj:
                return spelled  # "torch.contiguous_format", "torch.strided"
    raise _fail(f"a {type(v).__name__} cannot be written down")


def _tables() -> tuple[dict[str, Any], ...]:
    from accuracy.dumpfile.argcodec import LAYOUTS, MEMORY_FORMATS

    return (MEMORY_FORMATS, LAYOUTS)


def python(graph: Graph, name: str = "forward") -> str:
    """The graph as a Python function `name(v0, v1, ...)` returning a tuple of its outputs
    (None where an output has no value), printed from the validated form."""
    n = len(graph.inputs)
    lines = [f"def {name}({', '.join(f'v{i}' for i in range(n))}):"]
    consts: dict[int, int | float] = {}  # symbolic sizes (arguments hold their values)
    for k, node in enumerate(graph.nodes):
        index = n + k
        if not isinstance(node, Node):
            consts[index] = node
            continue
        if node.op == GETITEM:
            lines.append(f"    v{index} = {_lit(node.args[0])}[{_lit(node.args[1])}]")
            continue
        ns, packet, overload = node.op.split(".")
        if not all(key.isidentifier() for key in node.kwargs):  # schema names (check_call)
            raise _fail(f"node {k} names a parameter that is no identifier")
        call = [_lit(a) for a in node.args]
        call += [f"{key}={_lit(v)}" for key, v in node.kwargs.items() if not iskeyword(key)]
        spelled = [f"{key!r}: {_lit(v)}" for key, v in node.kwargs.items() if iskeyword(key)]
        if spelled:  # a parameter named like a keyword (`random_.from`)
            call.append("**{" + ", ".join(spelled) + "}")
        lines.append(f"    v{index} = torch.ops.{ns}.{packet}.{overload}({', '.join(call)})")
    outs = [("None" if o is None else _lit(consts[o]) if o in consts else f"v{int(o)}")
            for o in graph.outputs]
    lines.append(f"    return ({''.join(o + ', ' for o in outs)})")
    return "\n".join(lines) + "\n"
