"""What a monitor's file holds when the job dies: rows wait in memory and are written in
batches, so each way of dying is checked for what docs/monitor.md says it loses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import accuracy.monitor as am
from accuracy.monitor import shutdown

ROOT = Path(__file__).resolve().parents[2]

SETUP = """
import os, signal, sys, torch
import accuracy.monitor as am
from accuracy.examples import lm_batch, lm_step, tiny_lm
model = tiny_lm(layers=1, d_model=16, ff=32, vocab=32)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def train(x, y):
    opt.zero_grad(); loss = lm_step(model, (x, y)); opt.step(); return loss
def batch(i):
    return lm_batch(seed=i, batch=2, seq=8, vocab=32)
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    code = SETUP + textwrap.dedent(body).replace("PATH", repr(str(tmp_path / "k.monitor.h5")))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, timeout=120,
                          capture_output=True, text=True, start_new_session=True)


def _readable(tmp_path: Path) -> am.Series:
    s = am.read_series(tmp_path / "k.monitor.h5")
    assert not s.attrs["complete"]  # cut short, and said so
    return s


def test_sigterm_writes_the_rows_waiting_and_still_ends_the_process(tmp_path):
    proc = _run(tmp_path, """
        step = am.watch(train, model, opt, path=PATH, flush_every=50, flush_seconds=None,
                        snapshot_every=None)
        for i in range(20):
            step(*batch(i))
        os.kill(os.getpid(), signal.SIGTERM)
        print("still running")
    """)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "still running" not in proc.stdout
    s = _readable(tmp_path)
    assert list(s.step) == list(range(20)) and np.isfinite(s.loss).all()


def test_sigterm_goes_on_to_the_handler_the_job_had(tmp_path):
    proc = _run(tmp_path, """
        def mine(signum, frame):
            print("job's own handler"); sys.stdout.flush(); os._exit(3)
        signal.signal(signal.SIGTERM, mine)
        step = am.watch(train, model, opt, path=PATH, flush_every=50, flush_seconds=None,
                        snapshot_every=None)
        for i in range(7):
            step(*batch(i))
        os.kill(os.getpid(), signal.SIGTERM)
    """)
    assert proc.returncode == 3 and "job's own handler" in proc.stdout, proc.stderr
    assert list(_readable(tmp_path).step) == list(range(7))


def test_kill_9_keeps_every_row_up_to_a_flagged_step_and_its_event(tmp_path):
    """A flagged step's row and its trigger event are written when it fires: kill -9 right
    after loses only rows of later steps (fewer than flush_every), and the file reads."""
    proc = _run(tmp_path, """
        step = am.watch(train, model, opt, path=PATH, flush_every=50, flush_seconds=None,
                        snapshot_every=None, triggers=[am.Predicate(lambda s: s.step == 12)])
        for i in range(16):
            step(*batch(i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    s = _readable(tmp_path)
    assert list(s.step) == list(range(13))  # 13-15 waited in memory: lost, as docs say
    assert [(e["kind"], e["step"]) for e in s.events][:1] == [("trigger", 12)]


def test_an_exception_in_the_step_writes_the_rows_before_it(tmp_path):
    """The user's step raised (and the job caught it, or hangs in its own handling): the rows
    of the steps before are in the file even if the process is then killed."""
    proc = _run(tmp_path, """
        def failing(x, y, i):
            if i == 7:
                raise RuntimeError("data loader broke")
            return train(x, y)
        step = am.watch(failing, model, opt, path=PATH, flush_every=50, flush_seconds=None,
                        snapshot_every=None)
        try:
            for i in range(10):
                step(*batch(i), i)
        except RuntimeError:
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert list(_readable(tmp_path).step) == list(range(7))


def test_kill_9_at_the_defaults_loses_fewer_rows_than_a_batch(tmp_path):
    proc = _run(tmp_path, """
        step = am.watch(train, model, opt, path=PATH)
        for i in range(30):
            step(*batch(i))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    steps = list(_readable(tmp_path).step)
    assert steps == list(range(len(steps))) and 30 - len(steps) < 50 and steps[:1] == [0]


class _Writer:
    def __init__(self) -> None:
        self.writing, self.flushed = False, 0

    def flush(self) -> None:
        self.flushed += 1


def test_a_sigterm_during_a_write_waits_for_the_write_to_end(monkeypatch):
    """Handled mid-write, the rows of that write would be half in the file: the signal is
    handed on when the write ends, after the waiting rows are written."""
    handed: list[int] = []
    monkeypatch.setattr(shutdown, "_hand_on", lambda signum, frame: handed.append(signum))
    monkeypatch.setattr(shutdown, "_writers", __import__("weakref").WeakSet())
    w = _Writer()
    shutdown._writers.add(w)
    w.writing = True
    shutdown._on_term(signal.SIGTERM, None)
    assert handed == [] and w.flushed == 0
    w.writing = False
    shutdown.write_ended()
    assert handed == [signal.SIGTERM] and w.flushed == 1
    shutdown.write_ended()  # once only
    assert handed == [signal.SIGTERM]
