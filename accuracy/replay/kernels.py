"""Replay of an Inductor kernel row: its local error, like an eager op's.

A kernel row (`inductor.<kernel>`, accuracy/dumper/compiled/source.py) holds the buffers the kernel
read and the buffers it materialised. Its reference (accuracy/dumper/compiled/reference.py, in
`extra.reference` of the launch site's first row) lists the ATen ops the kernel stands for,
taken from the graph Inductor was given. Replay runs those ops on the recorded inputs, once in
the kernel's dtype and once upcast (fp64), and measures each output exactly as an eager op's
(`ops.rerun`): the kernel's error against fp64 over the same-dtype ATen ops' error. A kernel
that computes something else than its ops (a miscompile, a wrong graph pass) has a large
ratio; an honest fused kernel stays near 1. A kernel that cannot be re-run says why.

The reference is JSON read from an untrusted dump: each op name must be on the allow-list of
compute ops and its arguments of the closed kinds `accuracy/safeops.py` accepts (checked
before anything runs; nothing is executed as code), arguments decoded by the dump's own
argument codec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from accuracy import safeops
from accuracy.dumpfile import OpRecord, schema, symsizes
from accuracy.dumpfile.argcodec import decode_call
from accuracy.replay.cache import TensorCache
from accuracy.replay.rebuild import Unreplayable, _map, check_inputs, upcast_dtype
from accuracy.replay.refcall import Reference, ReferenceCall

MAX_NODES = 5000
SYM = "sym"  # a reference node holding a symbolic size (its `expr`), not an op
_active: dict[int, dict[str, Any]] | None = None


def references(records: Any) -> dict[int, dict[str, Any]]:
    """Kernel launch site id -> its reference, from the rows that carry one."""
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        ref = r.extra.get(schema.EXTRA_REFERENCE) if r.extra.get(schema.EXTRA_COMPILED) else None
        kid = r.extra.get(schema.EXTRA_KID)
        if isinstance(ref, dict) and isinstance(kid, int) and kid not in out:
            out[kid] = ref
    return out


@contextmanager
def kernel_references(refs: dict[int, dict[str, Any]]) -> Iterator[None]:
    """Within the block, kernel rows find their launch site's reference in `refs`."""
    global _active
    prev, _active = _active, refs
    try:
        yield
    finally:
        _active = prev


def _reference(rec: OpRecord) -> dict[str, Any]:
    ref = rec.extra.get(schema.EXTRA_REFERENCE)
    if not isinstance(ref, dict) and _active is not None:
        ref = _active.get(rec.extra.get(schema.EXTRA_KID))  # type: ignore[arg-type]
    if not isinstance(ref, dict):
        raise Unreplayable("compiled kernel without a reference: the dump holds no ATen ops "
                           "for it (dumped before kernel replay existed, or its launch "
                           "site's first row was not recorded); `accuracy repro --kernel` "
                           "re-runs its graph")
    return ref


def _check(ref: dict[str, Any], n_outputs: int) -> tuple[list[Any], list[dict[str, Any]],
                                                        list[Any], list[Any]]:
    """The reference's parts, checked: it comes from a file (or a launch site's
    description, for the live check)."""
    inputs, nodes = ref.get("inputs"), ref.get("nodes")
    outputs, how = ref.get("outputs"), ref.get("graph")
    if not (isinstance(inputs, list) and isinstance(nodes, list) and isinstance(outputs, list)
            and isinstance(how, list) and len(how) == len(outputs)
            and all(isinstance(n, dict) for n in nodes)):
        raise Unreplayable("compiled kernel whose reference is malformed (damaged dump)")
    if len(nodes) > MAX_NODES:
        raise Unreplayable(f"compiled kernel whose reference has over {MAX_NODES} ops")
    if len(outputs) != n_outputs:
        raise Unreplayable(f"compiled kernel whose reference has {len(outputs)} outputs, the "
                           f"row {n_outputs}")
    n_values = len(inputs) + len(nodes)
    for o in outputs:
        if o is not None and (not isinstance(o, int) or isinstance(o, bool)
                              or not 0 <= o < n_values):
            raise Unreplayable("compiled kernel whose reference is malformed (damaged dump)")
    return inputs, nodes, outputs, how


def _ops(nodes: list[dict[str, Any]], n_inputs: int) -> list[Any]:
    """Each node's op, on the allow-list of compute ops (accuracy/safeops.py) with arguments
    it accepts, checked before anything runs: a crafted reference naming `aten.from_file`, a
    collective or a walk out of `torch.ops` is refused, not run."""
    import operator

    fns = []
    for k, n in enumerate(nodes):
        name = n.get("op")
        if name == "getitem":
            fns.append(operator.getitem)
            continue
        if name == SYM:  # a symbolic size: evaluated from the launch's bindings
            fns.append(SYM)
            continue
        if isinstance(name, str) and name.startswith("prims.inductor_"):
            # Inductor draws its randomness with its own prims (inductor_random, _randint,
            # _lookup_seed, _seeds): a kernel's draws cannot be reproduced
            raise Unreplayable(f"compiled kernel with an rng op ({safeops.shown(name)}): its "
                               "random draws cannot be reproduced on the reference")
        try:
            fn = safeops.compute_op(name)
        except safeops.UnknownOp:
            raise Unreplayable(f"compiled kernel whose reference calls {safeops.shown(name)}, "
                               f"unknown to torch {torch.__version__}") from None
        except safeops.RefusedOp as e:
            raise Unreplayable(f"compiled kernel whose reference is refused: {e}") from None
        if not isinstance(n.get("args"), str):
            raise Unreplayable("compiled kernel whose reference is malformed (damaged dump)")
        try:
            safeops.check_call(fn, *decode_call(n["args"], [None] * (n_inputs + k)))
        except safeops.RefusedOp as e:
            raise Unreplayable(f"compiled kernel whose reference is refused: {e}") from None
        except ValueError as e:
            raise Unreplayable(f"compiled kernel whose reference is malformed: "
                               f"{str(e)[:200]}") from None
        if torch.Tag.nondeterministic_seeded in getattr(fn, "tags", ()):
            raise Unreplayable(f"compiled kernel with an rng op ({name}): its random draws "
                               "cannot be reproduced on the reference")
        fns.append(fn)
    return fns


def _graph_fn(nodes: list[dict[str, Any]], fns: list[Any], outputs: list[Any],
              device: torch.device, env: dict[str, int] | None = None) -> Any:
    """fn(*inputs, upcast=...) running the reference's ops; an output without a reference
    is an empty placeholder (not measured), so the others keep their positions. `sym` nodes
    take their value from `env`, the launch's symbolic sizes."""

    def run(*inputs: torch.Tensor, upcast: str = "none") -> list[torch.Tensor]:
        def dt(d: torch.dtype) -> torch.dtype:
            return upcast_dtype(d, upcast)

        values: list[Any] = list(inputs)
        for n, fn in zip(nodes, fns, strict=True):
            if fn is SYM:
                values.append(symsizes.evaluate(n.get("expr"), env or {}))
                continue
            args, kwargs = decode_call(n["args"], values)
            if upcast != "none":
                args, kwargs = _map(args, device, dt), _map(kwargs, device, dt)
            values.append(fn(*args, **kwargs))
        out = []
        for o in outputs:
            v = values[o] if o is not None else None
            out.append(v if isinstance(v, torch.Tensor) else torch.empty(0))
        return out

    return run


def size_bindings(ref: dict[str, Any], nodes: list[dict[str, Any]], inputs: list[Any],
              outputs: list[Any]) -> dict[str, int]:
    """The symbolic sizes of one launch of a `dynamic=True` kernel, bound from the shapes its
    input and output buffers were recorded with (`sizes` of its reference); {} for a static
    kernel. Unreplayable when a size its ops need is not bound, or the shapes contradict the
    reference."""
    exprs = [n.get("expr") for n in nodes if n.get("op") == SYM]
    sizes = ref.get("sizes")
    if not exprs and sizes is None:
        return {}
    if not isinstance(sizes, dict):
        raise Unreplayable("compiled kernel with symbolic sizes but no recorded buffer sizes "
                           "(damaged dump)")
    pairs: list[tuple[Any, int]] = []
    for key, recs in (("inputs", inputs), ("outputs", outputs)):
        dims = sizes.get(key)
        if not isinstance(dims, list) or len(dims) != len(recs):
            raise Unreplayable("compiled kernel whose recorded buffer sizes are malformed "
                               "(damaged dump)")
        for d, t in zip(dims, recs, strict=True):
            shape = list(getattr(t, "shape", None) or [])
            if isinstance(d, list) and len(d) == len(shape):
                pairs += list(zip(d, shape, strict=True))
    try:
        env = symsizes.bind(pairs)
        for e in exprs:
            symsizes.evaluate(e, env)
    except symsizes.Unbound as e:
        raise Unreplayable(f"compiled kernel ({e} by its buffers' recorded shapes)") from None
    except ValueError as e:
        raise Unreplayable(f"compiled kernel whose symbolic sizes do not fit its recorded "
                           f"shapes: {str(e)[:200]}") from None
    return env


def replay_kernel(rec: OpRecord, device: torch.device, upcast: str,
                  cache: TensorCache, rerun: Callable[..., Any]) -> Any:
    """Replay one kernel row (an OpOutcome); Unreplayable with the reason when it can't.
    `rerun` is `ops.rerun`, handed in by `ops._replay` (this module imports no `ops`)."""
    ref = _reference(rec)
    _check(ref, len(rec.outputs))
    try:
        check_inputs(rec, compiled_ok=True)
    except Unreplayable as e:
        raise Unreplayable(f"compiled kernel: {e}") from None
    return rerun_kernel(
        KernelRun(rec.seq, rec.op, ref, rec.extra.get(schema.EXTRA_INPUTS), rec.inputs,
                  rec.outputs),
        Reference(device, upcast), upcast != "none", rerun,
        load_input=lambda t: cache.input(t, device),
        load_output=lambda t: cache.load(t) if t.has_data else None)


@dataclass(frozen=True)
class KernelRun:
    """One launch of a kernel as a reference re-runs it: its seq and row name, its launch
    site's reference, the names of the buffers it read, and what it read and wrote (a dump's
    tensor records, or the live buffers: `rerun_kernel` reads them through its loaders)."""

    seq: int
    op: str
    reference: dict[str, Any]
    input_names: Any
    inputs: list[Any]
    outputs: list[Any]


def rerun_kernel(run: KernelRun, reference: Reference, want_upcast: bool,
                 rerun: Callable[..., Any], *, load_input: Callable[[Any], torch.Tensor],
                 load_output: Callable[[Any], torch.Tensor | None]) -> Any:
    """Re-run a kernel launch's ATen ops on the reference and measure its outputs against
    them (an OpOutcome): replay's kernel rows and the live check's launches alike.
    `load_input(t)` is an input's value on the reference device, `load_output(t)` an
    output's device value on the host (None: no data, not compared). Unreplayable with the
    reason when it can't."""
    ref = run.reference
    inputs, nodes, outputs, how = _check(ref, len(run.outputs))
    names = run.input_names
    if not isinstance(names, list) or len(names) != len(run.inputs):
        raise Unreplayable("compiled kernel whose recorded inputs do not match its buffer "
                           "names (a buffer that is not a tensor)")
    by_name = dict(zip(names, run.inputs, strict=True))
    missing = [b for b in inputs if b not in by_name]
    if missing:
        raise Unreplayable("compiled kernel whose input buffer(s) "
                           f"{', '.join(map(str, missing[:3]))} were not recorded")
    fns = _ops(nodes, len(inputs))
    env = size_bindings(ref, nodes, [by_name[b] for b in inputs], run.outputs)
    device = reference.device
    tensors = [load_input(by_name[b]) for b in inputs]
    notes = []
    device_outputs = []
    for i, (o, kind) in enumerate(zip(outputs, how, strict=True)):
        value = None if o is None else load_output(run.outputs[i])
        if o is None:
            notes.append(f"output {i} not replayed: {str(kind)[:200]}")
        elif value is None:
            notes.append(f"output {i} has no data in the dump: not compared")
        else:
            device_outputs.append((i, value))
            if kind != "given":
                notes.append(f"output {i} against the graph after Inductor's passes "
                             f"({str(kind)[:200]}): a pass that changed values is not seen")
    if not device_outputs:
        raise Unreplayable("compiled kernel with no output to replay: " + "; ".join(notes))
    fn = _graph_fn(nodes, fns, outputs, device, env)

    def build(up: str) -> tuple[list[Any], dict[str, Any]]:
        return ([t.to(upcast_dtype(t.dtype, up), copy=True) for t in tensors], {"upcast": up})

    note = "; ".join(["compiled kernel re-run as its ATen ops"] + notes)
    outcome = rerun(ReferenceCall(run.seq, run.op, fn, build, note), device_outputs,
                    reference, want_upcast)
    for m in outcome.outputs:  # which graph each ratio is against: compare judges by
        i = m.get("idx")       # "given" ones only (a passed graph holds the pass's fault)
        if isinstance(i, int) and 0 <= i < len(how):
            m["reference"] = str(how[i])[:300]
    return outcome
