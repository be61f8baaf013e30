"""A kernel's reference: the ATen ops it stands for, over its input buffers, for replay.

Replay gives a kernel its local error by re-running, in fp64 on its recorded inputs, what the
kernel was meant to compute. That is the graph Inductor was *given* (AOTAutograd's ATen graph),
not the graph after Inductor's post-grad passes: a pass that changes values (the issue's
`blocks.1.fc1` matmul scaled by 1.05) is part of the miscompile, and re-running the passed
graph would reproduce it and call the kernel honest. So while a dumper records, the graph is
copied just before the post-grad passes (`snapshot`); at code generation each output buffer's
origin node is looked up by name in that copy (passes keep the names of nodes they leave alone
and give fresh names to nodes they add) and the ops between the kernel's input buffers and it
are taken from the copy. An output whose node a pass added, or whose ops do not lead back to
the kernel's inputs in the copy, takes its ops from the graph after the passes, and says so.

The result is plain JSON (no code): `inputs` (buffer names, as the kernel row's
`extra.inputs`), `nodes` (`op` name and `args` in the dump's argument encoding, where tensor
placeholder i is value i: the inputs first, then each node's result), `outputs` (the value
index of each output, or null) and `graph` (per output: "given", "passed" or why none).

`fused_graph` writes the same form for `accuracy repro`: every node Inductor fused into the
kernel, from the graph after its passes (what it compiled, so a re-compile meets the same
graph), no `graph` list. The repro script is printed from it by our own code after
validation (compiled/graphform.py): a dump carries data, never Python.
"""

from __future__ import annotations

import logging
import operator
import weakref
from typing import Any

from accuracy.dumper.compiled.irnodes import copy_source, output_node

log = logging.getLogger(__name__)

GIVEN, PASSED = "given", "passed"  # the graph Inductor was given / after its post-grad passes
MAX_NODES = 2000  # ops in one kernel's reference; more is not one kernel's worth
_SNAPSHOTS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_saved: dict[str, Any] = {}


def _copy(gm: Any) -> dict[str, Any]:
    """Name -> node of a copy of `gm`'s graph (copied nodes keep their names)."""
    import torch.fx as fx

    g = fx.Graph()
    g.graph_copy(gm.graph, {})
    return {n.name: n for n in g.nodes}


def install() -> None:
    """Copy each graph before Inductor's post-grad passes (called by inductor.install)."""
    try:
        from torch._inductor import compile_fx
    except Exception as e:  # noqa: BLE001 - no Inductor: nothing to snapshot
        log.info("Inductor not available (%s): no kernel references", e)
        return
    orig = getattr(compile_fx, "_recursive_post_grad_passes", None)
    if orig is None or "rpgp" in _saved:
        log.info("Inductor has no _recursive_post_grad_passes: kernel references come from "
                 "the graph after its passes")
        return

    def snapshot(gm: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _SNAPSHOTS[gm] = _copy(gm)
        except Exception:  # noqa: BLE001 - the compile goes on; replay says what it lacks
            log.debug("cannot copy the graph before post-grad passes", exc_info=True)
        return orig(gm, *args, **kwargs)

    _saved["rpgp"] = (compile_fx, orig)
    compile_fx._recursive_post_grad_passes = snapshot


def uninstall() -> None:
    if "rpgp" in _saved:
        mod, orig = _saved.pop("rpgp")
        mod._recursive_post_grad_passes = orig


def _fx_graph(g: Any) -> Any:
    import torch.fx as fx

    return g.graph if isinstance(getattr(g, "graph", None), fx.Graph) else g.module.graph


def _input_node(g: Any, src: str, fused: set[Any], placeholders: dict[str, Any]) -> Any:
    """The FX node whose value buffer `src` holds (the kernel reads it)."""
    node = placeholders.get(src)
    if node is not None:
        return node
    buf = g.try_get_buffer(src)
    node = buf.get_origin_node() if buf is not None else None
    if node is None and buf is not None:
        feeding = [o for o in buf.get_origins() if o not in fused
                   and any(u in fused for u in o.users)]
        node = feeding[0] if len(feeding) == 1 else None
    return node


def _is_sym(n: Any) -> bool:
    """A node whose value is a symbolic size (a SymInt graph input, `sym_size`, `s0*s1`):
    replay evaluates it from the launch's recorded shapes instead of computing it."""
    from accuracy.dumper.compiled.symbolic import is_symbolic

    return is_symbolic((getattr(n, "meta", None) or {}).get("val"))


def _between(out: Any, inputs: dict[Any, int]) -> list[Any] | str:
    """The nodes computing `out` from `inputs`, in graph order, or why there are none.
    Symbolic sizes are leaves (written down as expressions, not as the ops computing them)."""
    seen: set[Any] = set()
    stack = [out]
    while stack:
        n = stack.pop()
        if n in seen or n in inputs:
            continue
        if n is not out and _is_sym(n):
            seen.add(n)
            continue
        if n.op != "call_function":
            return f"reads {n.name} ({n.op}), which is not one of the kernel's input buffers"
        seen.add(n)
        if len(seen) > MAX_NODES:
            return f"more than {MAX_NODES} ops between its inputs and it"
        stack.extend(n.all_input_nodes)
    order = {n: i for i, n in enumerate(out.graph.nodes)}
    return sorted(seen, key=order.__getitem__)


def _finished_in_place(g: Any) -> dict[str, str]:
    """Buffer -> the extern kernel that mutates it later (`scatter_add` lowers to a kernel
    filling the buffer and an `aten.scatter_reduce_` fallback writing into it): such a
    kernel output is named after the node whose value the extern kernel completes."""
    from torch._inductor import ir

    out: dict[str, str] = {}
    for op in getattr(g, "operations", None) or []:
        if not isinstance(op, ir.ExternKernel):
            continue
        try:
            names = op.get_mutation_names()
        except NotImplementedError:
            continue
        for n in names:
            out.setdefault(n, getattr(op, "python_kernel_name", None) or type(op).__name__)
    return out


def _target(n: Any) -> str:
    import torch

    if n.target is operator.getitem:
        return "getitem"
    if isinstance(n.target, torch._ops.OpOverload):
        return str(n.target)
    raise ValueError(f"{n.name} calls {n.target!r}, not an ATen/prims op")


class _Encoder:
    """Writes FX nodes down as the form's nodes (shared by the replay reference and the
    fused subgraph `accuracy repro` prints): value i is input i for i < `base`, then each
    node's result; a symbolic size becomes a `sym` node holding its expression."""

    def __init__(self, g: Any, base: int) -> None:
        self.g, self.base = g, base
        self.nodes: list[dict[str, Any]] = []
        self.index: dict[Any, int] = {}  # node (of either graph) -> value index
        self.sym_index: dict[int | str, int] = {}  # size expression -> value index

    def sym_value(self, val: Any) -> int:
        """The value index of a symbolic size: a `sym` node holding its expression."""
        from accuracy.dumper.compiled.symbolic import sym_text

        expr = sym_text(self.g, val)
        if expr not in self.sym_index:
            self.sym_index[expr] = self.base + len(self.nodes)
            self.nodes.append({"op": "sym", "expr": expr})
        return self.sym_index[expr]

    def add(self, chosen: list[Any], inputs: dict[Any, int]) -> None:
        """Write down `chosen` (in graph order) over `inputs` (node -> input index);
        ValueError or KeyError when one cannot be (an argument only its repr shows, a node
        read that is neither an input nor written before it)."""
        import torch
        import torch.fx as fx

        from accuracy.dumper.compiled.symbolic import is_symbolic
        from accuracy.dumpfile.argcodec import encode_call

        for n in chosen:
            if n in self.index:
                continue
            if _is_sym(n) and n not in inputs:
                self.index[n] = self.sym_value(n.meta["val"])
                continue
            dummies: dict[int, int] = {}

            def ref(a: fx.Node, dummies: dict[int, int] = dummies) -> torch.Tensor:
                t = torch.empty(0)
                if a in inputs:
                    dummies[id(t)] = inputs[a]
                elif a not in self.index and _is_sym(a):  # a size read, not computed here
                    dummies[id(t)] = self.sym_value(a.meta["val"])
                else:
                    dummies[id(t)] = self.index[a]
                return t

            def sym(a: Any, dummies: dict[int, int] = dummies) -> Any:
                if not is_symbolic(a):
                    return a
                t = torch.empty(0)  # a SymInt in the arguments: its expression
                dummies[id(t)] = self.sym_value(a)
                return t

            args = fx.node.map_aggregate(fx.node.map_arg(n.args, ref), sym)
            kwargs = fx.node.map_aggregate(fx.node.map_arg(n.kwargs, ref), sym)
            text = encode_call(args, kwargs, lambda t, dummies=dummies: dummies[id(t)])
            if '"__repr__"' in text:
                raise ValueError(f"{n.name} takes an argument only its repr can show")
            self.index[n] = self.base + len(self.nodes)
            self.nodes.append({"op": _target(n), "node": n.name, "args": text})


def _sources(g: Any, names: list[str], outputs: list[int], before: dict[str, str] | None,
             fused: set[Any]) -> tuple[list[tuple[str, str]], dict[Any, int]]:
    """The kernel's inputs (its buffers that are not outputs, then each in-place output's
    value before the launch) as (name, buffer), and node -> input index in the graph after
    the passes."""
    post = _fx_graph(g)
    placeholders = {n.name: n for n in post.nodes if n.op == "placeholder"}
    srcs = [(n, n) for i, n in enumerate(names) if i not in outputs]
    srcs += [(f"{b}_before", old) for b, old in (before or {}).items()]
    post_in: dict[Any, int] = {}
    for k, (_, src) in enumerate(srcs):
        node = _input_node(g, src, fused, placeholders)
        if node is not None:
            post_in.setdefault(node, k)
    return srcs, post_in


def _with_sizes(g: Any, form: dict[str, Any], srcs: list[tuple[str, str]], names: list[str],
                outputs: list[int], enc: _Encoder) -> dict[str, Any]:
    """`form` with the symbolic size of each input and output buffer, for a dynamic-shape
    kernel: a reader binds the symbols from the recorded shapes."""
    from accuracy.dumper.compiled.symbolic import sizes_of, symbolic

    in_sizes = [sizes_of(g, src) for _, src in srcs]
    out_sizes = [sizes_of(g, names[i]) for i in outputs]
    if enc.sym_index or any(symbolic(d) for d in in_sizes + out_sizes):
        form["sizes"] = {"inputs": in_sizes, "outputs": out_sizes}
    return form


def fused_graph(g: Any, names: list[str], outputs: list[int],
                before: dict[str, str] | None = None) -> dict[str, Any]:
    """The FX nodes Inductor fused into the kernel (after its passes: what it compiled), as
    data in the reference's form, for `accuracy repro`: `inputs`, `nodes`, `outputs` (the
    value of each output buffer's node, null where none is known). ValueError or KeyError
    when they cannot be isolated from the rest of the graph (a node reads a value no input
    buffer holds)."""
    post = _fx_graph(g)
    fused: set[Any] = set()
    for i in outputs:
        fused |= set(g.try_get_buffer(names[i]).get_origins())
    for n in list(fused):  # a multi-output node's getitem users belong with it
        fused |= {u for u in n.users if u.target is operator.getitem}
    out_nodes = [output_node(g, names[i]) for i in outputs]
    if all(n is None for n in out_nodes):
        raise ValueError("no output buffer names its node")
    srcs, post_in = _sources(g, names, outputs, before, fused)
    enc = _Encoder(g, len(srcs))
    enc.add([n for n in post.nodes if n in fused and n not in post_in], post_in)
    outs = [None if n is None else post_in[n] if n in post_in else enc.index[n]
            for n in out_nodes]
    form = {"inputs": [s for s, _ in srcs], "nodes": enc.nodes, "outputs": outs}
    if len(enc.nodes) > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} fused ops")
    return _with_sizes(g, form, srcs, names, outputs, enc)


def reference_graph(g: Any, names: list[str], outputs: list[int],
                    before: dict[str, str] | None = None) -> dict[str, Any]:
    """The reference of one kernel launch (see the module docstring); `g` is Inductor's
    GraphLowering at code generation, `names` the kernel's buffers, `outputs` the positions
    it materialises, `before` in-place outputs -> the buffer whose value they start from."""
    fused: set[Any] = set()
    for i in outputs:
        fused |= set(g.try_get_buffer(names[i]).get_origins())
    srcs, post_in = _sources(g, names, outputs, before, fused)
    given = _SNAPSHOTS.get(getattr(g, "module", None))
    given_in = {given[n.name]: k for n, k in post_in.items()
                if given is not None and n.name in given}
    enc = _Encoder(g, len(srcs))
    out_idx: list[int | None] = []
    how: list[str] = []
    finished = _finished_in_place(g)
    for i in outputs:
        # a write into a mutated buffer is the source of its `copy_`, looked up in each graph
        # from the copy (a pass may have put its own node between them)
        raw = output_node(g, names[i], follow_copy=False)
        node = copy_source(raw)
        if names[i] in finished:
            out_idx.append(None)
            how.append(f"its buffer is finished in place by extern kernel {finished[names[i]]} "
                       f"after this launch: the kernel writes only its starting value, not "
                       f"{node.name if node is not None else 'its node'}'s")
            continue
        if node is None:
            out_idx.append(None)
            how.append("Inductor names no origin node for its buffer (a quantity of its own, "
                       "e.g. a Welford sum of squares)")
            continue
        if isinstance(node.meta.get("val"), tuple | list):
            out_idx.append(None)
            how.append(f"one output of multi-output node {node.name} (which one is not kept)")
            continue
        chosen, kind, inputs = None, "", post_in
        why_given = "the graph before Inductor's passes was not copied"
        if given is not None:
            why_given = f"node {node.name} was added by Inductor's graph passes"
            gnode = copy_source(given[raw.name]) if raw.name in given else None
            if gnode is not None:
                got = _between(gnode, given_in)
                if isinstance(got, list):
                    chosen, kind, inputs, node = got, GIVEN, given_in, gnode
                else:
                    why_given = got
        if chosen is None:
            got = _between(node, post_in)
            if isinstance(got, str):
                out_idx.append(None)
                how.append(got)
                continue
            chosen, kind = got, f"{PASSED} ({why_given})"
        try:
            enc.add(chosen, inputs)
        except (ValueError, KeyError) as e:
            out_idx.append(None)
            how.append(f"cannot be written down: {e}")
            continue
        out_idx.append(inputs[node] if node in inputs else enc.index[node])
        how.append(kind)
    ref = {"inputs": [s for s, _ in srcs], "nodes": enc.nodes, "outputs": out_idx, "graph": how}
    return _with_sizes(g, ref, srcs, names, outputs, enc)
