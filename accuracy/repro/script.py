"""`accuracy repro`: a standalone script for one recorded Inductor kernel.

What a compiler team accepts as a bug report: the FX subgraph Inductor fused into the kernel
(filed at code generation as data, `extra.fused_graph` of its launch site's first row:
compiled/reference.py), the kernel's recorded inputs and outputs, and, given the eager dump,
the eager values its outputs were matched with (compare/compiled_align.py). The script needs
only torch: it re-runs the subgraph eagerly and through `torch.compile` on the recorded inputs
and prints, per output, how far the recorded kernel output, the re-compiled output and the
graph's eager result are from each other and from the eager run's value; it exits 1 when the
recorded output diverges, 2 when the graph does not run.

The dump is untrusted and people run the script: its code is printed by repro/graphform.py
from the validated form (allow-listed ATen/prims ops, arguments as data); no text of the dump
becomes code. Dumps from before this form filed the subgraph as Python text (`graph_code`):
they are refused, with a line saying to record the step again.
"""

from __future__ import annotations

import base64
import io
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accuracy.dumpfile import schema
from accuracy.errors import InputNotFoundError, NoMatchError, OutputExistsError, UsageError
from accuracy.repro import graphform

KERNEL_PREFIX = "inductor."
MAX_BYTES = 64 << 20  # tensors embedded in one script

_TEMPLATE = '''"""Reproducer for Inductor kernel {kernel} (accuracy repro).

Recorded in {dump} at seq {seq} ({phase}, module {module}, {source}).
Fused ATen ops: {fused}.
Run: python {name}   (needs torch; exits 1 when the recorded output diverges)
"""
import base64, io, sys
import torch
try:  # the prims Inductor's graphs call (low-memory max pool...)
    import torch._inductor.inductor_prims  # noqa: F401
except ImportError:
    pass

DATA = torch.load(io.BytesIO(base64.b64decode(
    "{data}")), weights_only=True)

{code}

def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    inputs = DATA["inputs"]
    eager = forward(*inputs)
    compiled = torch.compile(forward)(*inputs)
    bad = False
    for i, rec in enumerate(DATA["recorded"]):
        if rec is None or not isinstance(eager[i], torch.Tensor):
            continue
        if DATA["multi"][i]:
            print(f"output {{i}} ({{DATA['names'][i]}}): one output of a multi-output node "
                  "(Inductor may keep another quantity there): not compared")
            continue
        line = (f"output {{i}} ({{DATA['names'][i]}}): recorded vs graph run eagerly "
                f"{{rel(rec, eager[i]):.3g}}, recompiled vs graph eagerly "
                f"{{rel(compiled[i], eager[i]):.3g}}")
        gold = DATA["golden"][i]
        if gold is not None and gold.numel() == rec.numel():
            err = rel(rec, gold.reshape(rec.shape))
            line += (f", recorded vs eager run's value {{err:.3g}}, graph eagerly vs eager "
                     f"run's value {{rel(eager[i], gold.reshape(rec.shape)):.3g}}")
            bad |= err > {tol}
        else:
            bad |= rel(rec, eager[i]) > {tol}
        print(line)
    print("DIVERGES" if bad else "no divergence above {tol}")
    return 1 if bad else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the graph did not run: no verdict (exit 2, not DIVERGES' 1)
        print(f"could not run the kernel's graph: {{type(e).__name__}}: {{e}}")
        sys.exit(2)
'''


def _safe(text: str) -> str:
    """Text from a dump, made inert inside the script's docstring."""
    return re.sub(r"[^\w.:/\- ,()\[\]]", "_", str(text))[:500]


@dataclass
class Repro:
    """What `write_repro` wrote."""

    path: Path
    kernel: str
    seq: int
    outputs: int
    golden: int

    def format(self) -> str:
        return (f"wrote {self.path}: kernel {self.kernel} (seq {self.seq}), {self.outputs} "
                f"output(s), {self.golden} matched with eager values; run: python {self.path}")


def _record(d: Any, kernel: str, seq: int | None) -> Any:
    name = kernel if kernel.startswith(KERNEL_PREFIX) else KERNEL_PREFIX + kernel
    recs = [r for r in d.records if r.op == name and (seq is None or r.seq == seq)]
    if not recs:
        known = sorted({r.op for r in d.records if r.op.startswith(KERNEL_PREFIX)})
        raise NoMatchError(f"no kernel {name}" + (f" at seq {seq}" if seq is not None else "")
                           + f" in {d.path}; its kernels: {', '.join(known) or 'none'}")
    return recs[0]


def _graph(d: Any, rec: Any) -> graphform.Graph:
    """The kernel's fused subgraph, validated (graphform.validate), from the first row of its
    launch site that files it."""
    kid = rec.extra.get(schema.EXTRA_KID)
    rows = [rec] + [r for r in d.records
                    if kid is not None and r.extra.get(schema.EXTRA_KID) == kid]
    form = next((r.extra[schema.EXTRA_FUSED_GRAPH] for r in rows
                 if schema.EXTRA_FUSED_GRAPH in r.extra), None)
    if form is None:
        if any(schema.EXTRA_GRAPH_CODE in r.extra for r in rows):
            raise UsageError(f"{rec.op}: this dump files the kernel's subgraph as Python text "
                             "(recorded by an older accuracy), and text from a dump is never "
                             "run: record the step again with this version to write a "
                             "reproducer")
        raise UsageError(f"{rec.op} at seq {rec.seq} has no recorded subgraph (its fused "
                         "nodes could not be isolated, or the dump predates reproducers)")
    graph = graphform.validate(form, len(rec.outputs), _bindings(form, rec))
    missing = [b for b in graph.inputs if b not in _inputs_by_name(rec)]
    if missing:
        raise UsageError(f"{rec.op} at seq {rec.seq}: its subgraph reads input buffer(s) "
                         f"{_safe(', '.join(missing[:3]))} that were not recorded")
    return graph


def _inputs_by_name(rec: Any) -> dict[str, Any]:
    """The row's input tensors by buffer name (`extra.inputs`)."""
    names = rec.extra.get(schema.EXTRA_INPUTS)
    if not isinstance(names, list) or len(names) != len(rec.inputs) \
            or not all(isinstance(n, str) for n in names):
        raise UsageError(f"{rec.op} at seq {rec.seq}: its input buffer names do not match "
                         "its recorded inputs (damaged or crafted dump)")
    return dict(zip(names, rec.inputs, strict=True))


def _bindings(form: Any, rec: Any) -> dict[str, int]:
    """The symbolic sizes of this launch (a `dynamic=True` kernel), bound from its buffers'
    recorded shapes as replay binds them; {} for a static one."""
    from accuracy.replay.kernels import size_bindings
    from accuracy.replay.rebuild import Unreplayable

    if not isinstance(form, dict) or not isinstance(form.get("nodes"), list) \
            or not all(isinstance(n, dict) for n in form["nodes"]) \
            or not isinstance(form.get("inputs"), list) \
            or not all(isinstance(b, str) for b in form["inputs"]):
        return {}  # validate says what is wrong with it
    by_name = _inputs_by_name(rec)
    try:
        return size_bindings(form, form["nodes"], [by_name.get(b) for b in form["inputs"]],
                             rec.outputs)
    except Unreplayable as e:
        raise UsageError(f"{rec.op} at seq {rec.seq}: {_safe(str(e))}") from None


def _write(out: Path, text: str) -> None:
    """`text` into `out`, whole or not at all (a temporary beside it, renamed)."""
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_repro(dump: str | os.PathLike[str], kernel: str, out: str | os.PathLike[str], *,
                golden: str | os.PathLike[str] | None = None, seq: int | None = None,
                overwrite: bool = False, tol: float = 1e-3) -> Repro:
    """Write a standalone reproducer script for `kernel` (its first call, or the one at
    `seq`) of a tensor-mode dump of a compiled run; `golden`: the eager run's dump."""
    import torch

    from accuracy.compare.compiled_align import compiled_pairs
    from accuracy.dumpfile.reader import load_dump

    out = Path(out)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} exists; pass --overwrite or choose another -o")
    if not Path(dump).exists():
        raise InputNotFoundError(f"{dump}: no such dump")
    with load_dump(dump) as d:
        rec = _record(d, kernel, seq)
        graph = _graph(d, rec)
        by_name = _inputs_by_name(rec)
        if not all(t.has_data for t in rec.inputs + rec.outputs):
            raise UsageError(f"{dump} holds no tensor data for {rec.op}: record the step with "
                             "mode='tensor' to write a reproducer")
        if sum(t.nbytes for t in rec.inputs + rec.outputs) > MAX_BYTES:
            raise UsageError(f"{rec.op}'s tensors exceed {MAX_BYTES >> 20} MB: too large to "
                             "embed in a script")
        from accuracy.replay.rebuild import restore_strides

        # each input as the kernel saw it: its values with its recorded strides (a view
        # of a graph's buffer is not contiguous; ops of the graph may depend on it)
        inputs = [restore_strides(d.read_tensor(by_name[b]), by_name[b], torch.device("cpu"))
                  for b in graph.inputs]
        recorded = [d.read_tensor(t) for t in rec.outputs]
        gold: list[Any] = [None] * len(recorded)
        if golden is not None:
            with load_dump(golden) as g:
                for tp in compiled_pairs(d.records, g.records):
                    if tp.my_op is not None and tp.my_op.seq == rec.seq and tp.io == "output" \
                            and tp.golden is not None:
                        gold[tp.idx] = g.read_tensor(tp.golden)
        outs = rec.extra.get(schema.EXTRA_OUTPUTS)
        outs = [o if isinstance(o, dict) else {} for o in outs] \
            if isinstance(outs, list) and len(outs) == len(recorded) else [{}] * len(recorded)
        names = [_safe(o.get("buffer", "")) for o in outs]
        multi = [o.get("multi") is True for o in outs]
        buf = io.BytesIO()
        torch.save({"inputs": inputs, "recorded": recorded, "golden": gold, "names": names,
                    "multi": multi},
                   buf)
        data = base64.b64encode(buf.getvalue()).decode()
        fused = rec.extra.get(schema.EXTRA_FUSED_OPS)
        _write(out, _TEMPLATE.format(
            kernel=_safe(rec.extra.get(schema.EXTRA_KERNEL, rec.op)), dump=_safe(Path(dump).name),
            seq=int(rec.seq), phase=_safe(rec.phase), module=_safe(rec.module or "-"),
            source=_safe(rec.source or "?"),
            fused=_safe(", ".join(map(str, fused if isinstance(fused, list) else []))),
            name=_safe(out.name), data=data,
            code=graphform.python(graph).strip(), tol=float(tol)))
        return Repro(out, rec.op, rec.seq, len(recorded), sum(g is not None for g in gold))
