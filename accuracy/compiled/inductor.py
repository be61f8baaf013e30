"""Inductor's kernels as a source of records: a call after every kernel launch.

Why this mechanism: Inductor's own `config.generate_intermediate_hooks` is emitted only by the
SIMD (Triton) scheduling and for extern kernels, so a CPU step gets none for its C++ kernels;
AOTInductor's value printer covers extern calls only. Every kernel launch, C++ or Triton, goes
through one method of the Python wrapper code generator,
`PythonWrapperCodegen.generate_kernel_call`. While a dumper records, that method is wrapped:
after each launch line it emits one line calling `_hook(kernel_id, [buffers])`, and at code
generation time it files, under `kernel_id`, what the buffers are (inputs or materialised
outputs), and for each output the FX nodes it came from (`origins`: the ATen ops fused into
it, their `nn_module_stack` and `stack_trace`). At run time the hook hands the live buffers to
the recording source (`accuracy/compiled/source.py`), which writes one row per kernel through
the dumper's recorder. Extern kernels (mm, addmm, convolution...) are ATen calls the dumper's
dispatch mode already sees at run time (it ignores compile internals only while compiling).

What a hook line needs at run time (the kernel's description) is written into the generated
module itself, as one registration line per launch site at its top (`_register`), so a program
Inductor's FX-graph or AOTAutograd cache hands back describes itself exactly as a fresh one:
the caches stay on while the wrapper is installed. Hooked and plain programs must never be
served for each other, so while installed the wrapper adds a tag to torch's cache keys
(`torch.compiler.config.cache_key_tag`), one per version of the code that writes the lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import operator
import re
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from accuracy.compiled.irnodes import output_node
from accuracy.compiled.names import split_root
from accuracy.compiled.symbolic import layout_of, sizes_of
from accuracy.errors import RaisedForTheUser

log = logging.getLogger(__name__)

_lock = threading.Lock()
_users = 0
_saved: dict[str, Any] = {}
_ids = itertools.count(1)
KERNELS: dict[int, KernelInfo] = {}  # kernel id (in generated code) -> what it is
SINKS: list[Any] = []  # recording sources: `.kernel(info, tensors)`
# extern kernel call site id -> (graph, the FX node it computes, compile id); the one running
EXTERNS: dict[int, tuple[str, Origin, str]] = {}
_running_extern: list[int] = [0]
# kernel launch sites generated with no recording hook: (serial, kernel name, why); a dumper
# says those compiled while it ran (never silently blind)
UNHOOKED: list[tuple[int, str, str]] = []
_unhooked_ids = itertools.count(1)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


def _kernel_writes(call_args: Any, arg_types: Any) -> set[str] | None:
    """The buffers the kernel being launched writes: its `KernelArgs`' output and in-place
    buffers (under the names the call passes: a mutated graph input by its own name), found
    on the code generator's `call_kernel` frame; else the non-const pointers of a C++ call's
    `arg_types`. None when neither is there (then only fresh buffers count as written)."""
    try:
        from torch._inductor.codegen.common import KernelArgs, RemovedArg
    except Exception:  # noqa: BLE001 - torch moved it: fall back on the argument types
        KernelArgs = RemovedArg = None  # noqa: N806
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None or KernelArgs is None:
            break
        args = getattr(frame.f_locals.get("self"), "args", None)
        if isinstance(args, KernelArgs):
            out = {k for k, v in args.output_buffers.items() if not isinstance(v, RemovedArg)}
            for v in args.inplace_buffers.values():
                if not isinstance(v, RemovedArg) and v.other_names:
                    out.add(v.other_names[-1])
            return out
    if isinstance(arg_types, list | tuple) and len(arg_types) == len(call_args):
        return {a for a, t in zip(call_args, arg_types, strict=True) if isinstance(a, str)
                and isinstance(t, str) and t.endswith("*") and not t.startswith("const")}
    return None


def _launch_ops() -> set[str] | None:
    """The scheduler operations (`op17`...) the kernel being launched computes, found on the
    code generator's frames: a C++ kernel group's `scheduled_nodes` (one C++ function runs
    the loops of several scheduler nodes), a SIMD kernel's `node_schedule`. None when neither
    is there. A mutation among them (a scatter into the buffer a loop before it zero-fills:
    the lowering of `scatter_add` when Inductor does not fall back to ATen's, e.g. with one
    CPU thread) is finished by this very launch, not by a later one."""
    try:
        from torch._inductor.scheduler import BaseSchedulerNode
    except Exception:  # noqa: BLE001 - torch moved it: no launch is known to finish a buffer
        return None
    frame = sys._getframe(1)
    for _ in range(10):
        frame = frame.f_back
        if frame is None:
            break
        nodes = getattr(frame.f_locals.get("self"), "scheduled_nodes", None)
        if nodes is None:
            nodes = frame.f_locals.get("node_schedule")
        if isinstance(nodes, list | tuple):
            ops = {o for n in nodes if isinstance(n, BaseSchedulerNode)
                   for o in n.get_operation_names()}
            if ops:
                return ops
    return None


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


def _describe(kernel_name: str, call_args: Any, seen: set[str],
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
    info = KernelInfo(next(_ids), kernel_name, graph, names, outputs, origins, primary, held,
                      compile_id=_compile_id(), mutated=mutated)
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
    from accuracy.compiled.reference import fused_graph, reference_graph
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


def _compile_id() -> str:
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return "" if cid is None else str(cid)
    except Exception:  # noqa: BLE001 - torch moved it: every kernel shares one key
        return ""


def _layout(g: Any, name: str) -> tuple[tuple[int | str, ...], tuple[int | str, ...]] | None:
    """The size and stride of buffer or graph input `name` (expression text where symbolic,
    evaluated at run time from the output's shape), None when unknown."""
    got = layout_of(g, name)
    return None if got is None else (tuple(got[0]), tuple(got[1]))


def _notify(event: str, kid: int, tensors: list[Any]) -> None:
    """Hand kernel `kid`'s live buffers to each sink's `event` method; never raises into
    the user's step."""
    info = KERNELS.get(kid)
    if info is None or not SINKS:
        return
    for s in list(SINKS):
        try:
            getattr(s, event)(info, tensors)
        except RaisedForTheUser:  # overflow_raise=True, strict=True: what the user asked for
            raise
        except Exception:  # noqa: BLE001 - the user's step must never die because of us
            log.exception("%s of kernel %s failed", event, info.kernel)


def _extern(eid: int) -> None:
    """Called by generated code around an extern kernel call (`aten.mm.out`...): the ATen
    ops the dumper sees until `_extern(0)` are that call's."""
    _running_extern[0] = eid


def current_extern() -> tuple[str, Origin, str] | None:
    """(graph, origin node, compile id) of the extern kernel call running now, or None."""
    eid = _running_extern[0]
    return EXTERNS.get(eid) if eid else None


def _describe_extern(node: Any) -> tuple[str, Origin, str] | None:
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
    return graph, _origin(on), _compile_id()


def _pre(kid: int, tensors: list[Any]) -> None:
    """Called by generated code before kernel `kid` overwrites buffers in place."""
    _notify("before", kid, tensors)


def _hook(kid: int, tensors: list[Any]) -> None:
    """Called by generated code after kernel `kid` ran."""
    _notify("kernel", kid, tensors)


def _unhooked(kernel: str, why: str) -> None:
    UNHOOKED.append((next(_unhooked_ids), kernel, why))
    del UNHOOKED[:-256]  # bounded: a dumper reads those compiled while it ran


def unhooked_since(serial: int) -> list[tuple[str, str]]:
    """(kernel, why) of the launch sites generated without a hook after `serial`."""
    return [(k, w) for n, k, w in UNHOOKED if n > serial]


def unhooked_serial() -> int:
    """The serial of the latest unhooked launch site (0 if none)."""
    return UNHOOKED[-1][0] if UNHOOKED else 0


def install() -> None:
    """Wrap the wrapper code generator (refcounted) and turn the compile caches off."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        try:
            from torch._functorch import config as fconfig
            from torch._inductor import config
            from torch._inductor.codegen.wrapper import PythonWrapperCodegen
        except Exception as e:  # noqa: BLE001 - no Inductor here: nothing to wrap
            log.info("Inductor not available (%s): its kernels cannot be recorded", e)
            return
        orig = PythonWrapperCodegen.generate_kernel_call

        def generate_kernel_call(self: Any, kernel_name: str, call_args: Any,
                                 *args: Any, **kwargs: Any) -> Any:
            var = ""
            try:
                seen = self.__dict__.setdefault("_accuracy_seen", set())
                info = _describe(kernel_name, call_args, seen, getattr(self, "reuses", {}),
                                 _kernel_writes(call_args, kwargs.get("arg_types")),
                                 _launch_ops())
                if info is None:
                    _unhooked_line(self, kernel_name, "it writes no buffer Inductor names as "
                                   "its output or as mutated")
                else:
                    var = f"_acc_k{info.kid}"
                    _module_line(self, f"{var} = _acc_register({kernel_text(info)!r})")
                    if info.before:
                        self.writeline(f"_acc_pre({var}, [{', '.join(info.before)}])")
            except Exception as e:  # noqa: BLE001 - codegen goes on without our line
                log.exception("cannot hook kernel %s", kernel_name)
                _unhooked_line(self, kernel_name,
                               f"describing it failed ({type(e).__name__}: {e})")
                var = ""
            out = orig(self, kernel_name, call_args, *args, **kwargs)
            if var:
                self.writeline(f"_acc_hook({var}, [{', '.join(info.buffers)}])")
            return out

        def wrap_extern(name: str) -> None:
            """Mark the lines of extern kernel calls with the FX node they compute: their
            rows take its module and source line, as fused kernels' do."""
            orig_ext = getattr(PythonWrapperCodegen, name, None)
            if orig_ext is None:
                return

            def generate(self: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
                var = ""
                try:
                    site = _describe_extern(node)
                    if site is not None:
                        var = f"_acc_e{next(_ids)}"
                        _module_line(self, f"{var} = _acc_register_extern("
                                           f"{extern_text(site)!r})")
                        self.writeline(f"_acc_extern({var})")
                except Exception:  # noqa: BLE001 - codegen goes on without our line
                    log.debug("cannot mark extern kernel", exc_info=True)
                    var = ""
                out = orig_ext(self, node, *args, **kwargs)
                if var:
                    self.writeline("_acc_extern(0)")
                return out

            _saved["ext_" + name] = orig_ext
            setattr(PythonWrapperCodegen, name, generate)

        for name in ("generate_extern_kernel_out", "generate_extern_kernel_alloc",
                     "generate_fallback_kernel"):
            wrap_extern(name)
        _saved["gkc"] = (PythonWrapperCodegen, orig)
        PythonWrapperCodegen.generate_kernel_call = generate_kernel_call
        _tag_cache_keys(config, fconfig)
        _saved["random"] = config.fallback_random
        config.fallback_random = random_mode() == EAGER_RANDOM
        from accuracy.compiled import reference
        reference.install()


def uninstall() -> None:
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users or "gkc" not in _saved:
            return
        cls, orig = _saved.pop("gkc")
        cls.generate_kernel_call = orig
        for key in [k for k in _saved if k.startswith("ext_")]:
            setattr(cls, key[4:], _saved.pop(key))
        _running_extern[0] = 0
        from accuracy.compiled import reference
        reference.uninstall()
        _untag_cache_keys()
        if "random" in _saved:
            from torch._inductor import config

            config.fallback_random = _saved.pop("random")


EAGER_RANDOM, INDUCTOR_RANDOM = "eager", "inductor"
RANDOM_ENV = "ACCURACY_COMPILED_RANDOM"


def random_mode() -> str:
    """Whose generator programs compiled while a dumper records draw random numbers with.
    "eager" (the default): Inductor's `fallback_random`, so a compiled dropout draws the masks
    an eager run with the same seed draws, and compiled against eager compares like with like
    (Inductor's own generator gives other masks: every value after a dropout differs, and the
    compare blamed an honest matmul). "inductor" (`ACCURACY_COMPILED_RANDOM=inductor`): the
    program's own generator, as it runs outside the dumper."""
    import os

    mode = os.environ.get(RANDOM_ENV, EAGER_RANDOM).strip().lower()
    return mode if mode in (EAGER_RANDOM, INDUCTOR_RANDOM) else EAGER_RANDOM


def hooks_tag() -> str:
    """The cache-key tag of hooked programs: a digest of the code that writes the hook lines
    and the descriptions they register, so a program cached by another version of it is
    never served (its descriptions could be read wrongly)."""
    if "tag" not in _TAG:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        for f in sorted([*here.glob("*.py"), here.parent / "dumpfile" / "argcodec.py"]):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        _TAG["tag"] = f"accuracy-kernel-hooks-{h.hexdigest()[:16]}"
    return _TAG["tag"]


_TAG: dict[str, str] = {}


def _tag_cache_keys(config: Any, fconfig: Any) -> None:
    """Tag torch's compile cache keys while programs are generated with hook lines (the
    user's own tag kept in front); a torch without the tag turns the two caches off instead,
    as a cached plain program has no hook lines."""
    try:
        from torch.compiler import config as cconfig

        old = cconfig.cache_key_tag
        cconfig.cache_key_tag = f"{old}|{hooks_tag()}" if old else hooks_tag()
        _saved["tag"] = (cconfig, old)
    except Exception as e:  # noqa: BLE001 - torch moved it: no cache is safe then
        log.info("cannot tag torch's compile cache keys (%s): FX-graph and AOTAutograd "
                 "caches off while recording", e)
        _saved["caches"] = (config, fconfig, config.fx_graph_cache,
                            fconfig.enable_autograd_cache)
        config.fx_graph_cache = False
        fconfig.enable_autograd_cache = False


def _untag_cache_keys() -> None:
    if "tag" in _saved:
        cconfig, old = _saved.pop("tag")
        cconfig.cache_key_tag = old
    if "caches" in _saved:
        config, fconfig, fx, aot = _saved.pop("caches")
        config.fx_graph_cache, fconfig.enable_autograd_cache = fx, aot


_IMPORT = ("from accuracy.compiled.inductor import _register as _acc_register, "
           "_register_extern as _acc_register_extern, _unhooked as _acc_unhooked, "
           "_hook as _acc_hook, _pre as _acc_pre, _extern as _acc_extern")


def _module_line(wrapper: Any, line: str) -> None:
    """Write `line` at the top level of the generated module: into the root wrapper's header
    (a subgraph's wrapper emits none of its own), after our import, written once."""
    root = wrapper.get_root_graph() if hasattr(wrapper, "get_root_graph") else wrapper
    if not root.__dict__.get("_accuracy_import"):
        root.imports.writeline(_IMPORT)
        root._accuracy_import = True
    root.header.writeline(line)


def _unhooked_line(wrapper: Any, kernel: str, why: str) -> None:
    """Have the generated module report a launch site without a hook each time it is loaded
    (a cached program too); reported now when the line cannot be written."""
    try:
        _module_line(wrapper, f"_acc_unhooked({kernel!r}, {why!r})")
    except Exception:  # noqa: BLE001 - never silently blind: say it now
        log.debug("cannot write the unhooked line", exc_info=True)
        _unhooked(kernel, why)


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


def _register(text: str) -> int:
    """Called at the top of a generated module as it is loaded (just generated, or handed
    back by Inductor's caches): file one launch site's description under a fresh id, which
    its hook lines pass. The compile running now is the site's (a cached program's own
    compile ran in another process). Never raises: a description that cannot be read makes
    the site an unhooked one, said as such."""
    try:
        info = kernel_from_text(text)
    except Exception as e:  # noqa: BLE001 - the user's compile must go on
        _unhooked("?", f"its recorded description could not be read ({type(e).__name__})")
        return 0
    info.kid = next(_ids)
    info.compile_id = _compile_id() or info.compile_id
    KERNELS[info.kid] = info
    return info.kid


def _register_extern(text: str) -> int:
    """`_register` for an extern kernel call site (its FX node)."""
    try:
        graph, origin, cid = json.loads(text)
        site = (graph, Origin(**origin), _compile_id() or cid)
    except Exception:  # noqa: BLE001 - the call runs unmarked: its ATen rows stand
        log.debug("cannot read an extern call site's description", exc_info=True)
        return 0
    eid = next(_ids)
    EXTERNS[eid] = site
    return eid
