"""Output folders checked before the work: refused in one line, and a check creates nothing."""

from __future__ import annotations

import pytest

from accuracy.errors import OutputNotWritableError
from accuracy.outputs import folder_could_be_written, writable_folder


def test_a_check_before_the_work_creates_no_folder(tmp_path):
    out = tmp_path / "a" / "b" / "report"
    assert folder_could_be_written(out, "-o") == out
    assert not (tmp_path / "a").exists()
    assert list(tmp_path.iterdir()) == []  # no probe file left either
    assert writable_folder(out, "-o").is_dir()  # the writer makes it


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_file_in_the_way_is_refused_without_creating(tmp_path, below):
    (tmp_path / "notes").write_text("precious")
    target = tmp_path / "notes" / below if below else tmp_path / "notes"
    with pytest.raises(OutputNotWritableError, match="a file is in the way"):
        folder_could_be_written(target, "-o")
    assert (tmp_path / "notes").read_text() == "precious"


def test_a_place_nothing_can_be_written_is_refused():
    with pytest.raises(OutputNotWritableError, match="cannot write there"):
        folder_could_be_written("/proc/accuracy-report/x", "-o")
