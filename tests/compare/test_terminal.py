"""What `accuracy compare` prints (#50): the rate is one a reader can use (`14.3 MB of tensor
data in 3.09 s (0.00 GB/s)`: below 0.1 GB/s it is given in MB/s); a compiled run's eager values
fused into its kernels are counted apart from the unmatched rows."""

from __future__ import annotations

import json
import re

import pytest

from accuracy.compare import compare
from accuracy.compare.compiled_align import FUSED_AWAY
from accuracy.compare.terminal import format_summary


@pytest.mark.parametrize(("nbytes", "seconds", "shown"), [
    (14.3e6, 3.09, "14.3 MB of tensor data in 3.09 s (4.63 MB/s)"),
    (2e4, 1.0, "0.0 MB of tensor data in 1.00 s (0.02 MB/s)"),
    (3.0e9, 2.0, "3000.0 MB of tensor data in 2.00 s (1.50 GB/s)"),
])
def test_throughput_is_never_shown_as_zero(nbytes, seconds, shown):
    s = {"my": "a.h5", "golden": "b.h5", "rows": 1, "counts": {"pass": 1}, "verdict": "pass",
         "bytes_compared": nbytes, "seconds": seconds, "gb_per_s": nbytes / seconds / 1e9}
    text = format_summary(s)
    assert shown in text, text
    assert "0.00 GB/s" not in text


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """(compiled.h5, eager.h5) of one small MLP step (tests/_support/compiled_mlp.py)."""
    from tests._support.compiled_mlp import compiled_and_eager

    return compiled_and_eager(tmp_path_factory.mktemp("compiled"))


@pytest.mark.compiled  # its fixture compiles the model in a helper module
def test_eager_values_fused_away_are_counted_apart_from_unmatched(compiled_runs, tmp_path):
    """`rows 961: pass 420, error 0, unmatched 541` worried a reader when most of the 541 were
    eager values Inductor fused into a kernel by design: those are 'fused away'."""
    comp, eager = compiled_runs
    rep = compare(comp, eager)
    s = rep.summary
    fused = sum(r.verdict == "unmatched" and r.message == FUSED_AWAY for r in rep.rows)
    left = s["counts"]["unmatched"] - fused
    assert fused > 0 and s["fused_away"] == fused
    line = next(ln for ln in rep.format().splitlines() if ln.lstrip().startswith("rows "))
    assert re.search(rf"\bunmatched {left}, fused away {fused}, skipped \d+  ->  PASS$", line), line
    paths = rep.write(tmp_path / "rep", ("json", "html"))
    assert json.loads(paths["json"].read_text())["fused_away"] == fused
    assert f"fused away {fused}</span>" in paths["html"].read_text()
    assert compare(eager, eager).summary["fused_away"] == 0
    assert "fused away" not in compare(eager, eager).format()
