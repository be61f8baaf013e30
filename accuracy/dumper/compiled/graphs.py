"""Where a compiled program's work runs, read from the Python stack.

Two questions the rows of a compiled region need answered at run time:

- **Which call of a compiled region a backward belongs to.** AOTAutograd runs each call of a
  compiled graph as one `torch.autograd.Function` (`CompiledFunction`), whose `ctx` *is* the
  autograd node the engine runs for that call's backward (`torch._C._current_autograd_node()`
  there). So each call's names (`names.RegionCall`) are filed on the node in its forward, and
  its backward kernels and ops read them back: blocks sharing one compiled program (one compile
  id) each name their own backward, and nothing is guessed from the order of launches.
- **Which FX node an ATen op of an `aot_eager`/`eager` graph runs for.** Those backends run
  the graph's generated `forward` (a GraphModule's code, `<eval_with_key>` files); its line
  numbers map to nodes (`_lineno_map`), and each node keeps its module (`nn_module_stack`, or
  `fwd_nn_module_stack` in a backward graph) and user source line (`stack_trace`), as the nodes
  Inductor fuses into kernels do.
"""

from __future__ import annotations

import weakref
from types import FrameType
from typing import Any

from accuracy.dumper.compiled.names import RegionCall

KEY = "accuracy_region"  # autograd node metadata: the RegionCall of its forward
_LIMIT = 96  # frames walked at most
_GRAPH_FILE = "<eval_with_key>"
_lines: weakref.WeakKeyDictionary[Any, tuple[Any, int, dict, list]] = \
    weakref.WeakKeyDictionary()


def _is_compiled_ctx(ctx: Any) -> bool:
    from torch.autograd.function import BackwardCFunction

    return isinstance(ctx, BackwardCFunction) and \
        getattr(getattr(type(ctx), "_forward_cls", None), "_aot_id", None) is not None


def autograd_ctx(frame: FrameType | None) -> Any:
    """The autograd node of the AOTAutograd compiled function whose forward is running
    (its `ctx`), or None (an inference graph, or not inside one)."""
    f = frame
    for _ in range(_LIMIT):
        if f is None:
            return None
        code = f.f_code
        if code.co_argcount and code.co_varnames[0] == "ctx":
            ctx = f.f_locals.get("ctx")
            if _is_compiled_ctx(ctx):
                return ctx
        if code.co_name == "compile_wrapper":  # the region's entry: no Function below it
            return None
        f = f.f_back
    return None


def file_call(frame: FrameType | None, call: RegionCall) -> None:
    """File `call` on the autograd node of the compiled function running now (once per
    call: the first kernel or op of its forward)."""
    ctx = autograd_ctx(frame)
    if ctx is not None and KEY not in ctx.metadata:
        ctx.metadata[KEY] = call


def backward_call() -> RegionCall | None:
    """The RegionCall filed on the autograd node the engine runs now, if any."""
    import torch

    node = torch._C._current_autograd_node()
    if node is None:
        return None
    try:
        return node.metadata.get(KEY)
    except Exception:  # noqa: BLE001 - a node without metadata
        return None


def _graph_of(gm: Any) -> tuple[Any, int, dict, list] | None:
    hit = _lines.get(gm)
    if hit is None:
        code = getattr(getattr(type(gm), "forward", None), "__code__", None)
        lines = getattr(gm, "_lineno_map", None)
        if code is None or not lines:
            return None
        hit = _lines[gm] = (code, code.co_firstlineno, lines, list(gm.graph.nodes))
    return hit


def graph_node(frame: FrameType | None, internal: Any) -> tuple[Any, FrameType] | None:
    """(the FX node, its frame) of the GraphModule `forward` running the op called from
    `frame`: the innermost generated graph code on the stack, looked for only below the first
    frame `internal(filename)` calls user code (ordinary ops stop there)."""
    import torch

    f = frame
    for _ in range(_LIMIT):
        if f is None:
            return None
        code = f.f_code
        name = code.co_filename
        if name.startswith(_GRAPH_FILE):
            gm = f.f_locals.get("self")
            if isinstance(gm, torch.fx.GraphModule):
                g = _graph_of(gm)
                if g is None or g[0] is not code:
                    return None
                idx = g[2].get(f.f_lineno - g[1])
                return (g[3][idx], f) if idx is not None and idx < len(g[3]) else None
        elif not internal(name):
            return None
        f = f.f_back
    return None


def in_region(frame: FrameType | None) -> bool:
    """Whether a compiled region's call (dynamo's `compile_wrapper`) is on the stack."""
    f = frame
    for _ in range(_LIMIT):
        if f is None:
            return False
        if f.f_code.co_name == "compile_wrapper" and "_dynamo" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False
