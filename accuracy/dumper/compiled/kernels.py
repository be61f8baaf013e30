"""What a compiled kernel's launch site is: its buffers and the FX nodes its outputs came from.

Described at code generation (accuracy/dumper/compiled/codegen.py calls `describe_launch` for
each kernel launch Inductor generates), from the graph Inductor lowers (`V.graph`): which
buffers the kernel reads and which it materialises or writes in place, and for each output
the FX nodes fused into it (`origins`: their op, `nn_module_stack` and `stack_trace`), the
node whose value it holds, the layout of memory it reuses, and its fused subgraph and replay
reference (accuracy/dumper/compiled/reference.py). A description travels as JSON text inside
the generated module (`kernel_text` / `kernel_from_text`), so a program Inductor's caches hand
back describes itself exactly as a fresh one.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any

from accuracy.dumper.compiled.irnodes import output_node
from accuracy.dumper.compiled.names import split_root
from accuracy.dumper.compiled.symbolic import layout_of, sizes_of

log = logging.getLogger(__name__)

_site_ids = itertools.count(1)  # launch sites described in this process (generated names)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def next_site_id() -> int:
    """A fresh number for a launch site being generated (unique names in generated code)."""
    return next(_site_ids)


@dataclass
class Origin:
    """One FX node fused into a kernel output."""

    node: str
    op: str
    module: str  # path inside the compiled region ('' for its root)
    module_type: str
    source: str
    multi: bool = False  # one output of a multi-output node (var_mean...): not an eager value
    orig: str = ""  # the ATen op the user's code called, before decomposition (`original_aten`)
    index: int = -1  # which output of a multi-output node it is, when known (through getitem)
    # the traced variable `module` is relative to (`L['self']`, `L['model']`, `G['net']`)
    # and its module's class: named at run time as the eager dump names it (names.RegionCall)
    root: str = ""
    root_cls: str = ""
    # a value inside the decomposition of `orig` (BatchNorm backward's sum of grad * x_hat),
    # used only by that same call's other nodes: none of its outputs, so no eager value
    inner: bool = False


@dataclass
class KernelInfo:
    """A kernel launch site in generated code: its buffers and where its outputs came from."""

    kid: int
    kernel: str
    graph: str  # "forward", "backward" or "inference"
    buffers: list[str]
    outputs: list[int]  # positions in `buffers` the kernel materialises
    origins: dict[str, list[Origin]] = field(default_factory=dict)  # output buffer -> nodes
    primary: dict[str, str] = field(default_factory=dict)  # output buffer -> its origin node
    # output buffer -> the node whose value it holds (its origin node through views)
    held: dict[str, Origin] = field(default_factory=dict)
    # the kernel's fused FX subgraph as data (compiled/reference.py: fused_graph), for
    # `accuracy repro`, which prints its script from it after validating it
    fused_graph: dict[str, Any] | None = None
    # outputs written in place over a buffer an earlier kernel filled: their values before
    # the launch are inputs too (snapshotted by a line before it)
    before: list[str] = field(default_factory=list)
    # in-place output -> (size, stride) of the buffer whose memory it reuses: the value
    # before the launch is that buffer's, read with its layout, not the output's (a reused
    # `[32, 64]` matmul result reinterpreted as a transposed `[2, 4, 16, 16]` holds the
    # matmul's value only when read as `[32, 64]`)
    # (sizes of a `dynamic=True` program are expression text: compiled/symbolic.py)
    before_layout: dict[str, tuple[tuple[int | str, ...], tuple[int | str, ...]]] = field(
        default_factory=dict)
    # in-place output -> its own symbolic size: binds the layout's symbols at run time
    before_sizes: dict[str, list[int | str]] = field(default_factory=dict)
    reference: dict[str, Any] | None = None  # for replay: compiled/reference.py
    # dynamo's compile of the frame (its backward graph is compiled under the same one): ties
    # a backward kernel to the region its forward ran in
    compile_id: str = ""
    # outputs the kernel writes in place into a buffer it also names as an input (a graph
    # input an optimizer step or BatchNorm's running stats update, an earlier buffer) ->
    # the IR buffer of that mutation, which holds its origins
    mutated: dict[str, str] = field(default_factory=dict)
    # digest of the kernel's definition as generated (compiled/verify.py): checked against
    # the definition in the module that runs it before its launches are recorded
    src: str = ""

    def fused_ops(self) -> list[str]:
        seen: dict[str, None] = {}
        for os_ in self.origins.values():
            for o in os_:
                seen.setdefault(o.op, None)
        return list(seen)


def _type_name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ).rsplit(".", 1)[-1].strip("'>")


def module_site(meta: dict[str, Any]) -> tuple[str, str, str, str]:
    """(traced variable, path inside it, class, the traced variable's class) of the
    innermost module of a node (`nn_module_stack`, or a backward node's
    `fwd_nn_module_stack`: the forward node it differentiates); all '' without one."""
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return "", "", "", ""
    entries = list(stack.values())
    text, typ = entries[-1]
    root, path = split_root(str(text))
    root_cls = next((_type_name(t) for x, t in entries if split_root(str(x)) == (root, "")),
                    "")
    return root, path, _type_name(typ), root_cls


def _module_path(meta: dict[str, Any]) -> tuple[str, str]:
    root, path, typ, _ = module_site(meta)
    return path, typ


def _source(meta: dict[str, Any]) -> str:
    trace = meta.get("stack_trace") or ""
    for line in reversed(trace.splitlines()):
        m = re.match(r'\s*File "([^"]+)", line (\d+)', line)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
    return ""


_RESHAPES = ("aten._unsafe_view.", "aten.reshape.", "aten.view.")


def _is_view(node: Any) -> bool:
    target = getattr(node, "target", None)
    return bool(getattr(target, "is_view", False)) or str(target).startswith(_RESHAPES)


def _producer(node: Any) -> tuple[Any, int]:
    """The node whose value `node` shows: view, permute and reshape chains followed back to
    the node that computed it; (a multi-output node, output index) through a `getitem`."""
    import operator

    seen = 0
    while _is_view(node) and seen < 64:
        src = node.args[0] if node.args else None
        if not hasattr(src, "meta"):
            break
        node, seen = src, seen + 1
    if getattr(node, "target", None) is operator.getitem and node.args \
            and hasattr(node.args[0], "meta") and isinstance(node.args[1], int):
        return node.args[0], node.args[1]
    return node, -1


def _numels(node: Any) -> list[int]:
    """The element counts of a node's value (each output of a multi-output node)."""
    val = (getattr(node, "meta", {}) or {}).get("val")
    vals = val if isinstance(val, tuple | list) else [val]
    out = []
    for v in vals:
        try:
            out.append(int(v.numel()))
        except Exception:  # noqa: BLE001 - symbolic or no value: unknown
            out.append(-1)
    return out


def _held(on: Any, buf: Any, nodes: list[Any]) -> Origin | None:
    """The node whose value buffer `buf` holds: its origin node through views, unless that
    value has another size (Inductor names a reduction's buffer after a view feeding it);
    then the fused node of the buffer's size, a multi-output node first."""
    if on is None:
        return None
    try:
        n = 1
        for s in buf.get_size():
            n *= int(s)
    except Exception:  # noqa: BLE001 - symbolic sizes: trust the origin node
        return _origin(on)
    node, index = _producer(on)
    numels = _numels(node)
    if n in (numels if index < 0 else numels[index:index + 1]):
        return _origin(on)
    fits = [m for m in nodes if n in _numels(m)]
    fits.sort(key=lambda m: len(_numels(m)) == 1)  # multi-output nodes first
    if fits:
        return _origin(fits[0])
    # a node of another size: not the value the buffer holds, so not known to be inner
    return replace(_origin(on), inner=False)


def _placed(meta: dict[str, Any]) -> bool:
    """Whether a node's metadata says where it is: a module stack (an empty one: the traced
    module's own code), or a line of the traced code with no module stack (the traced
    module's own forward). A node a graph pass inserted has neither; a gradient sum
    AOTAutograd inserted (`is_gradient_acc`) has the line of no module."""
    if "nn_module_stack" in meta or "fwd_nn_module_stack" in meta:
        return True
    return bool(meta.get("stack_trace")) and not meta.get("is_gradient_acc")


def node_site(node: Any) -> tuple[str, str, str, str, str]:
    """(traced variable, module path inside it, class, the variable's class, source line) of
    an FX node; a node its metadata does not place (a `mul` a graph pass added after a
    matmul, a backward's gradient sum) takes its first input's module that has one."""
    meta = getattr(node, "meta", {}) or {}
    root, module, typ, root_cls = module_site(meta)
    source = _source(meta)
    if not module and not _placed(meta):  # a node a pass inserted: its inputs'
        for arg in getattr(node, "all_input_nodes", ()):
            am = getattr(arg, "meta", {}) or {}
            site = module_site(am)
            if site[1]:
                root, module, typ, root_cls = site
                source = source or _source(am)
                break
    return root, module, typ, root_cls, source


def _same_call(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two nodes' metadata say they come from one call of one ATen op: the same
    `original_aten` (by name: the graph's copies are not one object), autograd sequence
    number (`seq_nr`) and line. Without `seq_nr` never: two calls of one op in a row would
    pass for one."""
    orig, seq = a.get("original_aten"), a.get("seq_nr")
    return (orig is not None and seq is not None and str(b.get("original_aten")) == str(orig)
            and b.get("seq_nr") == seq and b.get("stack_trace") == a.get("stack_trace"))


def decomposition_inner(node: Any) -> bool:
    """Whether a node's value is a piece inside the decomposition of the ATen op the user's
    code called, not one of that op's outputs: the node is not that op itself, and every use
    of its value (through views and `getitem`s the same call takes) is another node of the same call
    (BatchNorm backward's sum of grad * (x - mean), which only its grad_weight and
    grad_input use). Eager never materialises it, so it must pair with no eager output."""
    meta = getattr(node, "meta", {}) or {}
    orig = meta.get("original_aten")
    if orig is None or str(getattr(node, "target", "")) == str(orig):
        return False
    todo, seen = list(getattr(node, "users", ())), set()
    while todo:
        user = todo.pop()
        if user in seen:
            continue
        seen.add(user)
        if getattr(user, "op", "") != "call_function" \
                or not _same_call(meta, getattr(user, "meta", {}) or {}):
            return False
        if _is_view(user) or user.target is operator.getitem:  # its value, seen anew
            todo.extend(user.users)
    return bool(seen)


def _origin(node: Any) -> Origin:
    """A node's op, module and source (`node_site`). A view of another node's value is
    described as that node (a view of `var_mean`'s output is one output of a multi-output
    node)."""
    node, index = _producer(node)
    meta = getattr(node, "meta", {}) or {}
    root, module, typ, root_cls, source = node_site(node)
    multi = index >= 0 or isinstance(meta.get("val"), tuple | list)
    orig = meta.get("original_aten")
    return Origin(node.name, str(getattr(node, "target", "")), module, typ, source, multi,
                  str(orig) if orig is not None else "", index, root, root_cls,
                  inner=index < 0 and decomposition_inner(node))


def _mutation_buffer(g: Any, name: str, used: set[str]) -> Any:
    """The IR buffer of the next mutation written into `name` (a graph input or an earlier
    buffer), in graph order; None when Inductor names none."""
    real = getattr(getattr(g, "scheduler", None), "mutation_real_name", None) or {}
    cands = [b for b, r in real.items() if r == name and b not in used]
    cands.sort(key=lambda b: (len(b), b))  # buf9 before buf10
    for b in cands:
        buf = g.try_get_buffer(b)
        if buf is not None and hasattr(buf, "get_origins"):
            used.add(b)
            return buf
    return None


def describe_launch(kernel_name: str, call_args: Any, seen: set[str],
              reuses: dict[str, str] | None = None,
              writes: set[str] | None = None,
              launch: set[str] | None = None) -> KernelInfo | None:
    from torch._inductor import ir
    from torch._inductor.virtualized import V

    g = V.graph
    writes = writes or set()
    used = g.__dict__.setdefault("_accuracy_mutations", set())
    mutated: dict[str, str] = {}
    graph = "backward" if getattr(g, "is_backward", False) else (
        "inference" if getattr(g, "is_inference", False) else "forward")
    names: list[str] = []
    outputs: list[int] = []
    origins: dict[str, list[Origin]] = {}
    primary: dict[str, str] = {}
    held: dict[str, Origin] = {}
    for a in call_args:
        if not isinstance(a, str) or not _NAME.match(a) or a in names:
            continue
        buf = None if a in g.graph_inputs else g.try_get_buffer(a)
        if a not in g.graph_inputs and (buf is None or not hasattr(buf, "get_origins")):
            continue
        names.append(a)
        if a in g.graph_inputs or a in seen or isinstance(buf, ir.ExternKernel):
            # a graph input or a buffer written earlier (by an extern kernel or another
            # kernel): an input, unless this kernel writes into it in place
            if a not in writes:
                continue
            buf = _mutation_buffer(g, a, used)
            mutated[a] = buf.get_name() if buf is not None else a
            outputs.append(len(names) - 1)
            if buf is None:
                origins[a], primary[a] = [], ""
                continue
        else:
            seen.add(a)
            outputs.append(len(names) - 1)
        nodes = sorted(buf.get_origins(), key=lambda n: n.name)
        origins[a] = [_origin(n) for n in nodes]
        on = output_node(g, buf.get_name())
        primary[a] = on.name if on is not None else ""
        h = _held(on, buf, nodes)
        if h is not None:
            held[a] = h
    if not outputs:
        return None
    info = KernelInfo(next_site_id(), kernel_name, graph, names, outputs, origins, primary, held,
                      compile_id=compile_id(), mutated=mutated)
    reuses = {**(reuses or {}), **{a: a for a in mutated}}  # in place: its own value before

    def filled(old: str) -> bool:
        """Whether the memory an output reuses held a value before this launch: a graph
        input, or a buffer an earlier kernel or extern call wrote. A buffer allocated and
        first written by this very kernel (a reduction it finishes in place) held nothing."""
        return old in seen or old in g.graph_inputs or isinstance(
            g.try_get_buffer(old), ir.ExternKernel)

    info.before = [names[i] for i in outputs if names[i] in reuses and filled(reuses[names[i]])]
    for b in info.before:
        layout = _layout(g, reuses[b])
        if layout is not None:
            info.before_layout[b] = layout
            if any(isinstance(d, str) for d in layout[0] + layout[1]):
                info.before_sizes[b] = sizes_of(g, b) or []
    irnames = [mutated.get(n, n) for n in names]  # an in-place output: its mutation's buffer
    from accuracy.dumper.compiled.reference import fused_graph, reference_graph
    try:
        info.fused_graph = fused_graph(g, irnames, outputs, {b: reuses[b] for b in info.before})
    except Exception as e:  # noqa: BLE001 - a reproducer is extra: the row stands without it
        log.debug("no subgraph for %s: %s", kernel_name, e)
    try:  # what replay re-runs for the kernel's local error (accuracy/replay/kernels.py)
        info.reference = reference_graph(g, irnames, outputs,
                                         {b: reuses[b] for b in info.before})
        _drop_partial(g, info, launch)
    except Exception as e:  # noqa: BLE001 - the row stands without it; replay says why
        log.debug("no reference for %s: %s", kernel_name, e)
    return info


PARTIAL = ("a later kernel or ATen call writes it in place (scatter into a zeroed buffer...): "
           "this kernel only starts its value, which is not its origin node's")


def _finished_later(g: Any, name: str, real: dict[str, str],
                    launch: set[str] | None) -> bool:
    """Whether a mutation into buffer `name` runs after the launch writing it: one computed
    by another launch (an extern `scatter_reduce_`, a later kernel). One among the launch's
    own operations (`launch`, see _launch_ops) leaves its final value; unknown ones count as
    later."""
    for m, r in real.items():
        if r != name:
            continue
        buf = g.try_get_buffer(m)
        op = buf.get_operation_name() if hasattr(buf, "get_operation_name") else None
        if launch is None or op not in launch:
            return True
    return False


def _drop_partial(g: Any, info: KernelInfo, launch: set[str] | None = None) -> None:
    """No replay reference for an output a mutation writes over afterwards: the value the
    kernel leaves there is not its origin node's (a scatter's zero fill is named after the
    scatter), and re-running the origin would call an honest kernel wrong. A mutation the
    launch itself runs (`launch`: its scheduler operations) is not afterwards: the buffer
    holds its origin node's value."""
    real = getattr(getattr(g, "scheduler", None), "mutation_real_name", None) or {}
    targets = set(real.values())
    ref = info.reference
    if ref is None or not targets:
        return
    for k, i in enumerate(info.outputs):
        b = info.buffers[i]
        if b not in info.mutated and b in targets and k < len(ref["outputs"]) \
                and ref["outputs"][k] is not None \
                and _finished_later(g, b, real, launch):  # None: its reason is said already
            ref["outputs"][k] = None
            ref["graph"][k] = PARTIAL


def compile_id() -> str:
    """The id of the dynamo compile running now ('' outside one)."""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.currentcompile_id()
        return "" if cid is None else str(cid)
    except Exception:  # noqa: BLE001 - torch moved it: every kernel shares one key
        return ""


def _layout(g: Any, name: str) -> tuple[tuple[int | str, ...], tuple[int | str, ...]] | None:
    """The size and stride of buffer or graph input `name` (expression text where symbolic,
    evaluated at run time from the output's shape), None when unknown."""
    got = layout_of(g, name)
    return None if got is None else (tuple(got[0]), tuple(got[1]))


def describe_extern(node: Any) -> tuple[str, Origin, str] | None:
    from torch._inductor.virtualized import V

    origins = sorted(getattr(node, "get_origins", lambda: ())(), key=lambda n: n.name)
    target = getattr(node, "op_overload", None)  # a fallback kernel's op: the node calling it
    on = next((n for n in origins if target is not None and n.target == target), None)
    if on is None and hasattr(node, "get_origin_node"):
        on = node.get_origin_node()
    if on is None:
        on = origins[-1] if origins else None
    if on is None:
        return None
    g = V.graph
    graph = "backward" if getattr(g, "is_backward", False) else (
        "inference" if getattr(g, "is_inference", False) else "forward")
    return graph, _origin(on), compile_id()


def kernel_text(info: KernelInfo) -> str:
    """A launch site's description as the JSON text its generated module registers."""
    return json.dumps(dataclasses.asdict(info), separators=(",", ":"))


def kernel_from_text(text: str) -> KernelInfo:
    """The inverse of `kernel_text`."""
    d = json.loads(text)
    d["origins"] = {b: [Origin(**o) for o in os_] for b, os_ in d["origins"].items()}
    d["held"] = {b: Origin(**o) for b, o in d["held"].items()}
    d["before_layout"] = {b: (tuple(size), tuple(stride))
                          for b, (size, stride) in d["before_layout"].items()}
    return KernelInfo(**d)


def extern_text(site: tuple[str, Origin, str]) -> str:
    graph, origin, cid = site
    return json.dumps([graph, dataclasses.asdict(origin), cid], separators=(",", ":"))
