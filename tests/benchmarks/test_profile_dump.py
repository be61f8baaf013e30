"""profile_dump's sorting of py-spy samples: the op's own time, ours (by the innermost frame of
ours), the model's Python, the dump's open and close, and the writer's thread apart."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from profile_dump import read_profile, report  # noqa: E402

_STEP = ("<module> (benchmarks/profile_dump.py:120);bench_step (accuracy/examples.py:82);"
         "forward (torch/nn/modules/linear.py:134)")
_LOOP = (";_LoopMode.__torch_dispatch__ (accuracy/dumper/loop.py:88);"
         "Loop.on_op (accuracy/dumper/loop.py:196);Loop.emit (accuracy/dumper/loop.py:215)")
LINES = [
    _STEP + _LOOP + ";run_here (accuracy/dumper/loop.py:66);__call__ (torch/_ops.py:875) 50",
    _STEP + _LOOP + ";Loop._observe (accuracy/dumper/loop.py:234);"
    "Recorder.entry (accuracy/dumper/recorder.py:461);"
    "tensor_stats (accuracy/dumpfile/stats.py:195) 7",
    _STEP + _LOOP + ";Loop._observe (accuracy/dumper/loop.py:237);"
    "Recorder.after (accuracy/dumper/recorder.py:403);"
    "isinstance (<builtin>) 3",
    # an op run inside another op's implementation under the loop: ours again, not the op's
    _STEP + _LOOP + ";run_here (accuracy/dumper/loop.py:66);"
    "hops.run (accuracy/hops.py:40) 2",
    _STEP + " 10",  # the model's own Python (the bench model counts as the user's code)
    "<module> (benchmarks/profile_dump.py:120);dumper.__exit__ (accuracy/dumper/core.py:260);"
    "DumpWriter.close (accuracy/dumpfile/writer.py:262) 4",
    "<module> (benchmarks/profile_dump.py:118);sleep (<builtin>) 1",
    "Thread._bootstrap (threading.py:995);Thread._bootstrap_inner (threading.py:1038);"
    "DumpWriter._run (accuracy/dumpfile/writer.py:351) 6",
    "not a sample line",
]


def test_samples_are_sorted_by_part():
    prof = read_profile(LINES)
    assert prof.parts == {"the op itself": 50, "ours": 12, "the model's Python": 10,
                          "the dump's open and close": 4, "other": 1, "other threads": 6}
    assert prof.own == {"tensor_stats": 7, "Recorder.after": 3, "hops.run": 2}
    # inclusive: every function of ours on the stack, the op's runner left out
    assert prof.inclusive["Loop.emit"] == 12 and prof.inclusive["Recorder.entry"] == 7
    assert "run_here" not in prof.inclusive and "bench_step" not in prof.inclusive


def test_report_gives_milliseconds_per_step():
    text = report(read_profile(LINES), rate=100, steps=2, top=2)
    # 50 samples at 100 Hz over 2 steps: 250 ms a step; 12 of the step's 76 samples are ours
    assert "the op itself               250.0 ms  65.8%" in text
    assert "ours                         60.0 ms  15.8%" in text
    assert "other threads                30.0 ms" in text
    own = text.split("ours, by innermost function:\n")[1].splitlines()
    assert own[0].split() == ["tensor_stats", "35.00", "ms"] and len(own) >= 2


def test_a_py_spy_that_is_not_there_is_said_in_one_line(tmp_path):
    from profile_dump import find_py_spy

    with pytest.raises(SystemExit) as gone:
        find_py_spy(str(tmp_path / "py-spy"))
    assert str(gone.value).startswith("py-spy not found at ") and "--py-spy PATH" in str(gone.value)
    spy = tmp_path / "spy"
    spy.write_text("#!/bin/sh\nexit 0\n")
    spy.chmod(0o755)
    assert find_py_spy(str(spy)) == str(spy)


def test_a_py_spy_that_fails_is_said_with_its_own_words(tmp_path):
    from profile_dump import record

    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\necho 'Error: Permission Denied: Try running again with elevated "
                   "permissions' >&2\nexit 1\n")
    spy.chmod(0o755)
    with pytest.raises(SystemExit) as failed:
        record(str(spy), 1, 100, 1, tmp_path / "raw.txt")
    said = str(failed.value)
    assert said.startswith("py-spy failed (exit 1): Error: Permission Denied") and "\n" not in said
