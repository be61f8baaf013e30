"""Files clients send are read in a child process that is killed if it overruns."""

import time

import pytest
import torch

from accuracy import dumper
from accuracy.dumpfile import DumpError
from accuracy.server.isolated import dump_summary


def test_summary_in_child_matches_and_overrun_is_killed(tmp_path):
    path = tmp_path / "d.h5"
    x = torch.ones(3)
    with dumper(dump_path=path):
        x.exp()
    assert dump_summary(path)["ops"] == 1
    t0 = time.monotonic()
    with pytest.raises(DumpError, match="took over"):
        dump_summary(path, timeout=0.0)  # the child cannot answer in time: killed, refused
    assert time.monotonic() - t0 < 10
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5")
    with pytest.raises(DumpError, match="not an HDF5 file"):
        dump_summary(bad)
