"""Load mode (accuracy/dumper/golden_feed.py): the load file is untrusted like any dump."""

from __future__ import annotations

import h5py
import pytest

from accuracy import dumper
from accuracy.cli import main


def test_load_file_with_soft_link_is_refused(lm_runs, in_tmp):
    d, batch = lm_runs
    assert main(["extract", str(d / "gold.h5"), "--seq", "3", "-o", "one.h5"]) == 0
    with h5py.File("one.h5", "r+") as f:
        op = next(iter(f))
        f[f"{op}/3/input/9"] = h5py.SoftLink("/etc/passwd")
    from accuracy.dumpfile import DumpError

    with pytest.raises(DumpError, match="SoftLink"):
        with dumper(dump_path="x.h5", load_file_path="one.h5"):
            pass

