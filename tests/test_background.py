"""Asked (`ACCURACY_BACKGROUND_NICE`), our background threads (the dump's writer) run at a lower
CPU priority on Linux, so the training step's own threads keep the cores; the step's thread
keeps its own. Not asked, nothing changes."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

from accuracy import background, dumper

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice is Linux's")


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _writer_nice(d, want: int) -> int:
    tid = d._writer._thread.native_id
    deadline = time.monotonic() + 5
    while _nice(tid) != want and time.monotonic() < deadline:
        time.sleep(0.01)  # the thread lowers itself once it starts
    return _nice(tid)


def test_asked_the_dump_writer_yields_the_cores_and_the_step_keeps_its_priority(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("ACCURACY_BACKGROUND_NICE", "7")
    mine = _nice(threading.get_native_id())
    d = dumper(dump_path=tmp_path / "d.h5")
    with d:
        torch.ones(3).exp()
        assert _writer_nice(d, 7) == 7
    assert _nice(threading.get_native_id()) == mine


def test_not_asked_the_writer_keeps_the_steps_priority(tmp_path, monkeypatch):
    # a writer at nice 19 on a machine other busy processes share would get a sliver of a
    # core, and a tensor dump's step would wait for it: not the default
    monkeypatch.delenv("ACCURACY_BACKGROUND_NICE", raising=False)
    mine = _nice(threading.get_native_id())
    d = dumper(dump_path=tmp_path / "d.h5")
    with d:
        torch.ones(3).exp()
        time.sleep(0.05)
        assert _nice(d._writer._thread.native_id) == mine


def test_the_main_thread_is_never_lowered(monkeypatch):
    monkeypatch.setenv("ACCURACY_BACKGROUND_NICE", "19")
    mine = _nice(threading.get_native_id())
    assert threading.current_thread() is threading.main_thread()
    assert background.lower_this_thread() is False
    assert _nice(threading.get_native_id()) == mine


def test_a_thread_already_lower_is_never_raised(monkeypatch):
    monkeypatch.setenv("ACCURACY_BACKGROUND_NICE", "5")
    seen = []

    def run():
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, background.LOWEST)
        background.lower_this_thread()
        seen.append(_nice(tid))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [background.LOWEST]
