"""`accuracy repro`: a standalone script for one recorded Inductor kernel.

What a compiler team accepts as a bug report: the FX subgraph Inductor fused into the kernel
(filed at code generation, `extra.graph_code` of its first row), the kernel's recorded inputs
and outputs, and, given the eager dump, the eager values its outputs were matched with
(compare/compiled_align.py). The script needs only torch: it re-runs the subgraph eagerly
and through `torch.compile` on the recorded inputs and prints, per output, how far the
recorded kernel output, the re-compiled output and the graph's eager result are from each
other and from the eager run's value; it exits 1 when the recorded output diverges.
"""

from __future__ import annotations

import ast
import base64
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accuracy.errors import InputNotFoundError, NoMatchError, OutputExistsError, UsageError

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
from torch import device  # noqa: F401 - the graph code may name devices
inf, nan = float("inf"), float("nan")

DATA = torch.load(io.BytesIO(base64.b64decode(
    "{data}")), weights_only=True)

{code}

def rel(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    inputs = DATA["inputs"]
    eager = forward(None, *inputs)
    compiled = torch.compile(forward)(None, *inputs)
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


def _chain(node: ast.AST) -> list[str]:
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def check_graph_code(code: str) -> None:
    """Accept only what FX writes for a graph of ATen calls: one `forward` of assignments,
    `del` and a `return`, calling `torch.ops.*` (and `device`); a dump is untrusted and the
    script will be run."""
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise UsageError(f"the recorded subgraph is not Python ({e.msg}): damaged dump") from None
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(tree.body) != 1 or len(fns) != 1 or fns[0].name != "forward":
        raise UsageError("the recorded subgraph is not one forward function: refused")
    for st in fns[0].body:
        if not isinstance(st, ast.Assign | ast.Return | ast.Delete | ast.Expr):
            raise UsageError(f"the recorded subgraph holds a {type(st).__name__}: refused")
        if isinstance(st, ast.Expr) and not isinstance(st.value, ast.Constant):
            raise UsageError("the recorded subgraph holds a bare expression: refused")
    for node in ast.walk(fns[0]):
        if isinstance(node, ast.Call):
            chain = _chain(node.func)
            if chain[:2] != ["torch", "ops"] and chain != ["device"]:
                raise UsageError(f"the recorded subgraph calls {'.'.join(chain) or '?'}: only "
                                 "torch.ops are accepted")
        elif isinstance(node, ast.Name) and node.id not in ("torch", "device", "inf", "nan",
                                                            "self", "None") and \
                not isinstance(node.ctx, ast.Store | ast.Del):
            if not any(a.arg == node.id for a in fns[0].args.args):
                local = {t.id for st in fns[0].body if isinstance(st, ast.Assign)
                         for t in st.targets if isinstance(t, ast.Name)}
                if node.id not in local:
                    raise UsageError(f"the recorded subgraph names {node.id}: refused")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            raise UsageError("the recorded subgraph reaches a dunder attribute: refused")


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
        kid = rec.extra.get("kid")
        code = next((r.extra.get("graph_code") for r in d.records
                     if r.extra.get("kid") == kid and r.extra.get("graph_code")), "")
        if not code:
            raise UsageError(f"{rec.op} at seq {rec.seq} has no recorded subgraph (its fused "
                             "nodes could not be isolated, or the dump predates reproducers)")
        check_graph_code(code)
        if not all(t.has_data for t in rec.inputs + rec.outputs):
            raise UsageError(f"{dump} holds no tensor data for {rec.op}: record the step with "
                             "mode='tensor' to write a reproducer")
        if sum(t.nbytes for t in rec.inputs + rec.outputs) > MAX_BYTES:
            raise UsageError(f"{rec.op}'s tensors exceed {MAX_BYTES >> 20} MB: too large to "
                             "embed in a script")
        from accuracy.replay.rebuild import restore_strides

        # each input as the kernel saw it: its values with its recorded strides (a view
        # of a graph's buffer is not contiguous; ops of the graph may depend on it)
        inputs = [restore_strides(d.read_tensor(t), t, torch.device("cpu"))
                  for t in rec.inputs]
        recorded = [d.read_tensor(t) for t in rec.outputs]
        gold: list[Any] = [None] * len(recorded)
        if golden is not None:
            with load_dump(golden) as g:
                for tp in compiled_pairs(d.records, g.records):
                    if tp.my_op is not None and tp.my_op.seq == rec.seq and tp.io == "output" \
                            and tp.golden is not None:
                        gold[tp.idx] = g.read_tensor(tp.golden)
        outs = rec.extra.get("outputs", [])
        names = [_safe(o.get("buffer", "")) for o in outs]
        multi = [bool(o.get("multi")) for o in outs]
        buf = io.BytesIO()
        torch.save({"inputs": inputs, "recorded": recorded, "golden": gold, "names": names,
                    "multi": multi},
                   buf)
        data = base64.b64encode(buf.getvalue()).decode()
        out.write_text(_TEMPLATE.format(
            kernel=_safe(rec.extra.get("kernel", rec.op)), dump=_safe(Path(dump).name),
            seq=int(rec.seq), phase=_safe(rec.phase), module=_safe(rec.module or "-"),
            source=_safe(rec.source or "?"),
            fused=_safe(", ".join(map(str, rec.extra.get("fused_ops", [])))),
            name=_safe(out.name), data=data,
            code=code.strip(), tol=float(tol)))
        return Repro(out, rec.op, rec.seq, len(recorded), sum(g is not None for g in gold))
