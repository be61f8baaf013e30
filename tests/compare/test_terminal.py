"""`accuracy compare`'s last figure is a rate a reader can use (#50: `14.3 MB of tensor data in
3.09 s (0.00 GB/s)`): below 0.1 GB/s it is given in MB/s."""

from __future__ import annotations

import pytest

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
