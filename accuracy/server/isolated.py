"""Read a client's file in a child process, with a time limit.

HDF5 can loop forever on some damaged metadata (found by fuzzing), and no Python timeout can
interrupt C code. Files clients send or name are therefore first summarised in a child forked
from a clean fork server (torch and h5py preloaded, so a child costs milliseconds, and no lock
held by a server thread is inherited); a child that overruns is killed and the file refused.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
from pathlib import Path
from typing import Any

from accuracy.dumpfile import DumpError, load_dump
from accuracy.dumpfile.reader import require_regular_file

READ_TIMEOUT_S = 60.0

_ctx = multiprocessing.get_context("forkserver")
_ctx.set_forkserver_preload(["accuracy.dumpfile.reader"])


def _summarise(path: str, conn: multiprocessing.connection.Connection) -> None:
    try:
        with load_dump(path) as d:
            conn.send(("ok", d.summary()))
    except DumpError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported to the parent as a refusal
        conn.send(("error", f"{path}: cannot be read ({type(e).__name__})"))
    finally:
        conn.close()


def dump_summary(path: str | os.PathLike[str], timeout: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """`load_dump(path).summary()`, computed in a child; DumpError if invalid or too slow."""
    require_regular_file(path)  # a FIFO or a device is refused here, before any child opens it
    recv, send = _ctx.Pipe(duplex=False)
    child = _ctx.Process(target=_summarise, args=(str(path), send), daemon=True)
    child.start()
    send.close()
    try:
        if not recv.poll(timeout):
            raise DumpError(f"{Path(path)}: reading it took over {timeout:g} s (damaged HDF5 "
                            "metadata?); refused")
        try:
            kind, value = recv.recv()
        except EOFError:
            raise DumpError(f"{Path(path)}: the reader crashed on this file; refused") from None
    finally:
        recv.close()
        if child.is_alive():
            child.kill()
        child.join()
    if kind != "ok":
        raise DumpError(value)
    return value
