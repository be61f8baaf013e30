"""Real dumps and a real report for the server tests: a golden CPU step, the same step on the
`sim` accelerator with noise injected into one matmul, and `accuracy.compare` over the pair."""

from __future__ import annotations

from pathlib import Path

from accuracy import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm


def make_runs(root: Path) -> dict[str, Path]:
    """golden.h5, my.h5 (fault on the first aten.mm) and report/ written by compare."""
    from accuracy.compare import compare
    from accuracy.device_backend import sim

    root.mkdir(parents=True, exist_ok=True)
    golden, my, report = root / "golden.h5", root / "my.h5", root / "report"
    with dumper(dump_path=golden, overwrite=True):
        lm_step(tiny_lm(), lm_batch())
    with sim(profile="exact", faults=[sim.fault("aten.mm.default", kind="noise", value=0.1)]):
        with dumper(dump_path=my, overwrite=True):
            lm_step(tiny_lm(), lm_batch())
    compare(my, golden).write(report, formats=("json", "csv"))
    return {"golden": golden, "my": my, "report": report}
