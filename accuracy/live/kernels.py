"""The live check of a compiled kernel launch: its outputs against its own ATen ops, re-run.

Under `live_check` compiled regions run compiled, as under the dumper (its loop's mode steps
aside while dynamo compiles), and each Inductor kernel launch reaches the check as a
`KernelCall` from the dumper's compiled source (accuracy/dumper/compiled/source.py). It is
measured as `accuracy replay` measures a kernel row (`replay.kernels.rerun_kernel`): the
launch site's ATen ops, taken from the graph Inductor was given, re-run on the buffers the
launch read, in the kernel's dtype and upcast. An output whose ops come from the graph after
Inductor's passes is not judged: a pass that changed values would be re-run as honest (compare
judges such an output against the eager run, which the live check does not have).

A region any of whose launches was not judged is said (`RegionTally`: status `not-checked`,
`BLIND:` with the reasons, counted): never a PASS over kernels nobody checked.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from accuracy.dumpfile import schema
from accuracy.replay.ops import rerun
from accuracy.replay.rebuild import Unreplayable
from accuracy.replay.refcall import Reference

if TYPE_CHECKING:
    from accuracy.dumper.calls import KernelCall
    from accuracy.dumper.compiled.watch import CompileWatch
    from accuracy.replay.ops import OpOutcome

GIVEN = "given"  # an output re-run from the graph Inductor was given (compiled/reference.py)
NOT_GIVEN_REASON = ("re-run from the graph after Inductor's passes, which holds what a pass "
                    "changed: not judged live")


def kernel_outcome(call: KernelCall, outputs: list[torch.Tensor], reference: Reference,
                   want_upcast: bool) -> OpOutcome:
    """The launch's outputs measured against its ATen ops re-run on `reference` (an
    OpOutcome; Unreplayable with the reason when the kernel cannot be re-run)."""
    from accuracy.replay.kernels import KernelRun, rerun_kernel

    ref = call.kernel.reference if call.kernel is not None else None
    if not isinstance(ref, dict):
        raise Unreplayable("compiled kernel without a reference: its ATen ops were not "
                           "captured when it was compiled")
    run = KernelRun(call.site.seq, call.site.op, ref, call.extra.get(schema.EXTRA_INPUTS),
                    call.inputs, outputs)
    device = reference.device
    with torch._C._DisableTorchDispatch(), torch.no_grad():  # the reference runs below our mode
        return rerun_kernel(run, reference, want_upcast, rerun,
                            load_input=lambda t: t.detach().to(device),
                            load_output=lambda t: t.detach().to("cpu"))


def judged_live(measured: dict[str, Any]) -> bool:
    """Whether a kernel output's figures may be judged: re-run from the graph Inductor was
    given (not from the graph after its passes)."""
    return measured.get("reference") == GIVEN


class RegionTally:
    """Kernel launches per compiled region, judged or not with the reason; at the end, a
    region with launches not judged reads `not-checked` (said `BLIND:`), one whose launches
    were all judged says so. A launch is filed under the region entered latest (as the
    dumper files its rows: `CompileWatch.recorded`)."""

    def __init__(self, watch: CompileWatch) -> None:
        self.watch = watch
        self._by: dict[int, tuple[Any, Counter[str]]] = {}

    def add(self, reason: str | None) -> None:
        """One launch the check was shown: judged (`reason` None) or not, and why."""
        region = self.watch.latest_region()
        if region is None:
            return
        _, counts = self._by.setdefault(id(region), (region, Counter()))
        counts["judged" if reason is None else reason] += 1

    def settle(self) -> None:
        """Each tallied region's status and reason (before the watch writes them out)."""
        from accuracy.dumper.compiled.watch import NOT_CHECKED, RECORDED

        for region in self.watch.regions.values():
            if region.status == RECORDED and region.backend == "inductor" \
                    and id(region) not in self._by:
                region.reason = ("ran compiled; none of its kernel launches was selected for "
                                 "checking (ops, modules, phases or sample)")
        for region, counts in self._by.values():
            if region.status != RECORDED:  # distrusted: its reason says why already
                continue
            total = sum(counts.values())
            judged = counts.get("judged", 0)
            if judged == total:
                region.reason = f"all {total} kernel launch(es) judged live as they ran"
                continue
            why = "; ".join(f"{r} x{n}" for r, n in counts.most_common() if r != "judged")
            region.status = NOT_CHECKED
            region.reason = (f"{total - judged} of {total} kernel launch(es) not judged live "
                             f"({why[:600]}): only the others' outputs were checked")
