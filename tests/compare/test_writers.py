"""The report files compare writes (accuracy/compare/writers.py) in the layout msprobe users
read: `-out`, and the CSV's msprobe columns."""

from __future__ import annotations

import csv

from accuracy.cli import main


def test_compare_accepts_out_and_writes_msprobe_columns(lm_runs, in_tmp):
    d, _ = lm_runs
    assert main(["compare", "-m", str(d / "dev.h5"), "-g", str(d / "gold.h5"), "-out", "rep",
                 "--formats", "csv,json"]) == 0
    with open("rep/rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and "Accuracy Reached or Not" in rows[0] and "NPU_Stack_Info" in rows[0]
    expect = {"pass": "Yes", "warning": "Yes", "error": "No"}
    for r in rows:
        assert r["Accuracy Reached or Not"] == expect.get(r["Result"], "")
    assert any(r["Accuracy Reached or Not"] == "No" for r in rows)
    assert all(r["NPU_Stack_Info"] == r["Source"] for r in rows)

