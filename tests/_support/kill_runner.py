"""Forks children that dump until SIGKILLed at random moments (run as its own process).

A fresh interpreter with no other threads is the only safe place to fork from: the pytest
process may hold locks in threads (servers, writers) that a forked child would inherit locked.

Usage: python _kill_runner.py OUT_DIR KILLS SEED MAX_SECONDS  -> prints one JSON line
"""

import json
import os
import random
import select
import signal
import sys
import time

import torch
import torch._dynamo  # noqa: F401 - a dumper imports it at its start: once here, not per child

from accuracy import dumper

BASE = torch.arange(64, dtype=torch.float32)


def child(path: str, ready_w: int) -> None:
    try:
        with dumper(dump_path=path, flush_ops=8, flush_seconds=0.01):
            os.write(ready_w, b"r")
            i = 0
            while True:
                torch.add(BASE, float(i))
                i += 1
    finally:
        os._exit(0)


def main() -> None:
    out, kills, seed, max_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    rng = random.Random(seed)
    done, not_ready, deadline = [], 0, time.monotonic() + max_s
    for k in range(kills):
        if time.monotonic() > deadline:
            break
        path = os.path.join(out, f"kill{k}.h5")
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(path, w)
        os.close(w)
        ready, _, _ = select.select([r], [], [], 30)
        os.close(r)
        if not ready:
            not_ready += 1
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        done.append(path)
    print(json.dumps({"dumps": done, "not_ready": not_ready}))


if __name__ == "__main__":
    main()
