"""Read a client's file in a child process, with a time limit.

HDF5 can loop forever on some damaged metadata (found by fuzzing dumps and monitor files), and
no Python timeout can interrupt C code. Files clients send or name are therefore first
summarised (a dump) or drawn (a monitor series) in a child forked from a clean fork server
(h5py and the readers preloaded, so a child costs milliseconds, and no lock held by a server
thread is inherited); a child that overruns is killed and the file refused.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
from pathlib import Path
from typing import Any

from accuracy.dumpfile import DumpError, load_dump, require_regular_file

READ_TIMEOUT_S = 60.0

_ctx = multiprocessing.get_context("forkserver")
_ctx.set_forkserver_preload(["accuracy.dumpfile.reader", "accuracy.monitor.plot"])


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


def _monitor_page(path: str, conn: multiprocessing.connection.Connection) -> None:
    from accuracy.errors import AccuracyError
    from accuracy.monitor.plot import render_html
    from accuracy.monitor.series import read_series

    try:
        conn.send(("ok", render_html(read_series(path))))
    except AccuracyError as e:
        conn.send(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported to the parent as a refusal
        conn.send(("error", f"{path}: cannot be read ({type(e).__name__})"))
    finally:
        conn.close()


def _in_child(target: Any, path: str | os.PathLike[str], timeout: float,
              error: type[Exception]) -> Any:
    """`target(path, conn)`'s answer, from a child killed after `timeout` s; `error(why)` for
    a refusal, an overrun or a crash."""
    require_regular_file(path)  # a FIFO or a device is refused here, before any child opens it
    recv, send = _ctx.Pipe(duplex=False)
    child = _ctx.Process(target=target, args=(str(path), send), daemon=True)
    child.start()
    send.close()
    try:
        if not recv.poll(timeout):
            raise error(f"{Path(path)}: reading it took over {timeout:g} s (damaged HDF5 "
                        "metadata?); refused")
        try:
            kind, value = recv.recv()
        except EOFError:
            raise error(f"{Path(path)}: the reader crashed on this file; refused") from None
    finally:
        recv.close()
        if child.is_alive():
            child.kill()
        child.join()
    if kind != "ok":
        raise error(value)
    return value


def dump_summary(path: str | os.PathLike[str], timeout: float = READ_TIMEOUT_S) -> dict[str, Any]:
    """`load_dump(path).summary()`, computed in a child; DumpError if invalid or too slow."""
    return _in_child(_summarise, path, timeout, DumpError)


def monitor_page(path: str | os.PathLike[str], timeout: float | None = None) -> str:
    """The monitor plot page of the series at `path` (monitor.plot.render_html), drawn in a
    child; MonitorFileError if invalid or too slow (READ_TIMEOUT_S by default)."""
    from accuracy.monitor.series import MonitorFileError

    return _in_child(_monitor_page, path, READ_TIMEOUT_S if timeout is None else timeout,
                     MonitorFileError)
