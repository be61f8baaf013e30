"""`serve()`: the policy for starting the report service, so the CLI only parses arguments.

What may listen where (anything but loopback needs an API token, and reads are then protected
too), which Host names are answered, which paths may be indexed at startup: refused here, with
a one-line `UsageError`, before the data directory is locked or anything listens. FastAPI and
uvicorn are imported only once the request is sound, so `import accuracy.server` stays light.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accuracy.errors import InputNotFoundError, UsageError

log = logging.getLogger(__name__)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Serving:
    """A built app, ready to `run()`; `format()` is what was indexed and where to browse."""

    app: Any
    host: str
    port: int
    indexed: list[str] = field(default_factory=list)
    log_level: str = "warning"
    sock: socket.socket | None = None  # bound by serve(), so a busy port is refused up front
    temporary_data: str | None = None  # no --data given: this folder goes when run() ends

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def format(self) -> str:
        return "\n".join([*self.indexed, f"accuracy serve: {self.url}  (API docs at /docs)"])

    def run(self) -> None:
        """Serve until interrupted (uvicorn handles Ctrl-C)."""
        import uvicorn

        from accuracy.server.guard import http_protocol

        try:
            if self.sock is None:
                uvicorn.run(self.app, host=self.host, port=self.port, log_level=self.log_level,
                            http=http_protocol())
                return
            config = uvicorn.Config(self.app, host=self.host, port=self.port,
                                    log_level=self.log_level, http=http_protocol())
            try:
                uvicorn.Server(config).run(sockets=[self.sock])
            finally:
                self.sock.close()
        finally:
            self.close()

    def close(self) -> None:
        """Remove the temporary data directory (when serve() made one); idempotent."""
        if self.temporary_data is not None:
            shutil.rmtree(self.temporary_data, ignore_errors=True)
            self.temporary_data = None


def bind(host: str, port: int) -> socket.socket:
    """The listening address, bound now: a port in use is one line (UsageError), not the URL
    followed by uvicorn's `[Errno 98]` and exit 3."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"port {port} on {host} is already in use (another `accuracy "
                             "serve`?); stop it or choose another with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _check_paths(data: str | os.PathLike[str] | None, runs: Sequence[str],
                 reports: Sequence[str]) -> None:
    """The operator's own paths: name each one that cannot be used (no placeholder)."""
    if data is not None and Path(data).exists() and not Path(data).is_dir():
        raise UsageError(f"--data {data}: is a file; give the server's data directory (it is "
                         "created if missing)")
    for path in runs:
        if not os.path.isfile(path):
            problem = ("is a directory, not a dump file" if os.path.isdir(path)
                       else "no such file")
            raise InputNotFoundError(f"--run {path}: {problem}")
    for path in reports:
        if not (Path(path) / "summary.json").is_file():
            raise InputNotFoundError(f"--report {path}: no report here (a folder written by "
                                     "`accuracy compare -o`)")


def serve(
    data: str | os.PathLike[str] | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    db_url: str | None = None,
    allow_roots: Sequence[str] = (),
    allowed_hosts: Sequence[str] = (),
    max_upload_mb: int = 4096,
    max_json_kb: int = 1024,
    read_timeout_s: float = 60.0,
    view_memory_mb: int = 256,
    runs: Sequence[str] = (),
    reports: Sequence[str] = (),
    verbose: bool = False,
    cluster: str | None = None,
    max_queued_jobs: int = 8,
) -> Serving:
    """Check the request against the serve policy, build the app and index `runs`/`reports`.

    `token` defaults to $ACCURACY_TOKEN; `cluster` (local:N or a scheduler's tcp:// address)
    runs compare and replay jobs on Dask. `data` None (no --data) keeps the index in a
    temporary folder that `Serving.run()` removes when the server stops: browsing a report
    needs no data directory of its own. Raises UsageError (or InputNotFoundError) for a bind
    address without a token, unusable paths, or a data directory another server holds.
    """
    token = token or os.environ.get("ACCURACY_TOKEN") or None
    if not is_loopback(host) and not token:
        raise UsageError(f"refusing to listen on {host} without an API token (--token or "
                         "ACCURACY_TOKEN); only loopback addresses may run without one")
    _check_paths(data, runs, reports)
    sock = bind(host, port)
    temporary = tempfile.mkdtemp(prefix="accuracy-serve-") if data is None else None
    try:
        serving = _build(sock, data if temporary is None else temporary, host=host, port=port,
                         token=token, db_url=db_url, allow_roots=allow_roots,
                         allowed_hosts=allowed_hosts, max_upload_mb=max_upload_mb,
                         max_json_kb=max_json_kb, read_timeout_s=read_timeout_s,
                         view_memory_mb=view_memory_mb, runs=runs, reports=reports,
                         verbose=verbose, cluster=cluster, max_queued_jobs=max_queued_jobs)
    except BaseException:
        sock.close()
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise
    if temporary is not None:
        serving.temporary_data = temporary
        serving.indexed.append(f"accuracy serve: no --data, so the index is kept in {temporary} "
                               "and deleted when the server stops (--data DIR keeps uploads "
                               "and jobs)")
    return serving


def _build(sock: socket.socket, data: str | os.PathLike[str], *, host: str, port: int,
           token: str | None, db_url: str | None, allow_roots: Sequence[str],
           allowed_hosts: Sequence[str], max_upload_mb: int, max_json_kb: int,
           read_timeout_s: float, view_memory_mb: int, runs: Sequence[str],
           reports: Sequence[str], verbose: bool, cluster: str | None,
           max_queued_jobs: int) -> Serving:
    from accuracy.server.app import create_app
    from accuracy.server.guard import WILDCARD_BINDS, allowed_hosts_for
    from accuracy.server.startup import import_paths

    hosts = allowed_hosts_for(host, allowed_hosts)
    if host.strip() in WILDCARD_BINDS and not allowed_hosts:
        log.warning("listening on %s but answering only to %s; add the names clients use "
                    "with --allowed-hosts", host, ", ".join(hosts))
    app = create_app(data, token=token, db_url=db_url,
                     max_upload_bytes=max_upload_mb * 1024 * 1024,
                     allowed_roots=list(allow_roots) or None,
                     protect_reads=not is_loopback(host), allowed_hosts=hosts,
                     max_json_bytes=max_json_kb * 1024, read_timeout_s=read_timeout_s,
                     view_memory_bytes=view_memory_mb * 1024 * 1024, cluster=cluster,
                     max_queued_jobs=max_queued_jobs)
    indexed = import_paths(app.state.services.storage, runs=runs, reports=reports)
    if app.state.job_cluster is not None:
        indexed.append(f"accuracy serve: {app.state.job_cluster.describe()}")
    return Serving(app, host, sock.getsockname()[1], indexed,
                   "info" if verbose else "warning", sock)
