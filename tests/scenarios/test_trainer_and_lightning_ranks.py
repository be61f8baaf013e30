"""The Trainer and Lightning callbacks drive PrecisionDebugger in the real libraries, on 2 gloo
CPU ranks: one dump per selected step and rank, none for the others, nothing installed on
idle steps. Each run is its own process group on 127.0.0.1, bounded in time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from accuracy import load_dump

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("lightning")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argvs: list[list[str]], envs: list[dict[str, str]], timeout: int = 240) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    procs = []
    try:
        for argv, extra in zip(argvs, envs, strict=True):
            procs.append(subprocess.Popen([sys.executable, "-m",
                                           "tests._support.integration_worker", *argv],
                                          env={**env, **extra}, cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        for p in procs:
            text = p.communicate(timeout=timeout)[0].decode(errors="replace")
            assert p.returncode == 0, text[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)


def _tree(root: Path) -> dict[tuple[int, int], set[int]]:
    """(step folder, rank folder) -> the steps recorded inside, for every dump under root."""
    out = {}
    for p in root.glob("step*/rank*/dump.h5"):
        with load_dump(p) as d:
            assert d.attrs["complete"]
            out[(int(p.parts[-3][4:]), int(p.parts[-2][4:]))] = {r.step for r in d.records}
    return out


def test_trainer_callback_on_two_gloo_ranks(tmp_path):
    port = str(_free_port())
    envs = [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in range(2)]
    _run([["hf", str(tmp_path), "[1, 3]"]] * 2, envs)
    assert _tree(tmp_path / "dump") == {(1, 0): {1}, (3, 0): {3}, (1, 1): {1}, (3, 1): {3}}
    for rank in range(2):
        r = json.loads((tmp_path / f"result_hf_{rank}.json").read_text())
        assert r["world"] == 2 and r["global_step"] == 4
        # the second probe, started after the debugger: a mode only on recorded steps
        assert r["seen"] == [False, True, False, True]
    with load_dump(tmp_path / "dump/step1/rank1/dump.h5") as d:
        assert d.attrs["world_size"] == 2
        assert any("transformer.h.0" in r.module for r in d.records)
        assert {"forward", "backward", "optimizer"} <= {r.phase for r in d.records}


def test_lightning_callback_on_two_gloo_ranks(tmp_path):
    _run([["pl", str(tmp_path), '[0, "2-3"]', "2"]],
         [{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}])
    tree = _tree(tmp_path / "dump")
    assert tree == {(s, r): {s} for s in (0, 2, 3) for r in (0, 1)}
    with load_dump(tmp_path / "dump/step2/rank0/dump.h5") as d:
        assert any("body" in r.module for r in d.records)
        assert "optimizer" in {r.phase for r in d.records}


def test_callbacks_refuse_what_is_not_a_probe():
    from accuracy.errors import UsageError
    from accuracy.integrations import AccuracyLightningCallback, AccuracyTrainerCallback

    for cls in (AccuracyTrainerCallback, AccuracyLightningCallback):
        with pytest.raises(UsageError, match="at least one probe"):
            cls()
        with pytest.raises(UsageError, match="not a probe"):
            cls(object())


def test_importing_integrations_imports_neither_library():
    code = ("import sys, accuracy.integrations as i; i.Probes; "
            "print(sorted(m for m in ('transformers', 'lightning', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_trainer_callback_drives_a_debugger_and_a_monitor_callback_in_order():
    """`AccuracyTrainerCallback(debugger, MonitorCallback(...))`: one callback, both driven; the
    monitor's step sits inside the debugger's start/stop, its loss/figures after the region."""
    transformers = pytest.importorskip("transformers")
    from accuracy.integrations import AccuracyTrainerCallback

    calls: list[str] = []

    class Debugger:
        def start(self, model=None): calls.append("start")  # noqa: E704
        def stop(self): calls.append("stop")  # noqa: E704
        def step(self): calls.append("step")  # noqa: E704

    class Mon(transformers.TrainerCallback):
        def on_train_begin(self, *a, **k): calls.append("mon_train_begin")  # noqa: E704
        def on_step_begin(self, *a, **k): calls.append("mon_begin")  # noqa: E704
        def on_step_end(self, *a, **k): calls.append("mon_end")  # noqa: E704
        def on_train_end(self, *a, **k): calls.append("mon_train_end")  # noqa: E704

    cb = AccuracyTrainerCallback(Debugger(), Mon())
    state = transformers.TrainerState()
    cb.on_train_begin(None, state, None)
    cb.on_step_begin(None, state, None, model=None)
    cb.on_step_end(None, state, None)
    cb.on_train_end(None, state, None)
    assert calls == ["mon_train_begin", "start", "mon_begin", "mon_end", "stop", "step",
                     "mon_train_end"]
    AccuracyTrainerCallback(Mon())  # a monitor alone is enough
