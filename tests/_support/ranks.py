"""Start a command once per rank, as torchrun would, for the tests with two CPU ranks.

Each rank runs in its own session (killed as a group if it outlives the wait), binds to
127.0.0.1 on a port free at the start, and inherits no RANK/WORLD_SIZE/MASTER_* of ours.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv: Sequence[Sequence[str]], cwd: Path = ROOT, timeout: int = 240,
              env: dict[str, str] | None = None) -> list[str]:
    """Run `argv[rank]` for each rank (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set,
    the checkout first on PYTHONPATH, one torch thread each, `env` on top); assert each exits
    0 within `timeout` seconds; return each rank's output."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")])
    base.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(len(argv)), **(env or {}))
    procs: list[subprocess.Popen] = []
    texts = []
    try:
        for rank, cmd in enumerate(argv):
            procs.append(subprocess.Popen(
                list(cmd), env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}, cwd=cwd,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
        for p in procs:
            text = p.communicate(timeout=timeout)[0].decode(errors="replace")
            assert p.returncode == 0, text[-3000:]
            texts.append(text)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
    return texts
