"""`accuracy serve`: run the report service (argument parsing and startup only)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

log = logging.getLogger(__name__)
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("ACCURACY_TOKEN") or None
    if not is_loopback(args.host) and not token:
        print(f"accuracy serve: refusing to listen on {args.host} without an API token "
              "(--token or ACCURACY_TOKEN); only loopback addresses may run without one",
              file=sys.stderr)
        return 2
    for path in args.run or []:  # the operator's own paths: name them, no placeholder
        if not os.path.isfile(path):
            print(f"accuracy serve: --run {path}: "
                  + ("is a directory, not a dump file" if os.path.isdir(path)
                     else "no such file"), file=sys.stderr)
            return 2
    import uvicorn

    from accuracy.cluster import ClusterError
    from accuracy.server.app import create_app
    from accuracy.server.datalock import DataDirBusy
    from accuracy.server.guard import WILDCARD_BINDS, allowed_hosts_for
    from accuracy.server.startup import import_paths

    hosts = allowed_hosts_for(args.host, args.allowed_hosts or ())
    if args.host.strip() in WILDCARD_BINDS and not args.allowed_hosts:
        print(f"accuracy serve: listening on {args.host} but answering only to "
              f"{', '.join(hosts)}; add the names clients use with --allowed-hosts",
              file=sys.stderr)
    try:
        app = create_app(args.data, token=token, db_url=args.db_url,
                         max_upload_bytes=args.max_upload_mb * 1024 * 1024,
                         allowed_roots=args.allow_root or None,
                         protect_reads=not is_loopback(args.host), allowed_hosts=hosts,
                         max_json_bytes=args.max_json_kb * 1024,
                         read_timeout_s=args.read_timeout,
                         view_memory_bytes=args.view_memory_mb * 1024 * 1024,
                         cluster=args.cluster)
    except (DataDirBusy, ClusterError) as e:
        print(f"accuracy serve: {e}", file=sys.stderr)
        return 2
    for line in import_paths(app.state.services.storage, runs=args.run or [],
                             reports=args.report or []):
        print(line)
    if app.state.job_cluster is not None:
        print(f"accuracy serve: {app.state.job_cluster.describe()}")
    print(f"accuracy serve: http://{args.host}:{args.port}/  (API docs at /docs)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose
                else "warning")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("serve", help="REST API and web UI to browse runs and reports")
    s.add_argument("--data", required=True, help="data directory (dumps, reports, index)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; anything but loopback needs --token")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--token", help="API token for write endpoints (or ACCURACY_TOKEN)")
    s.add_argument("--db-url", help="SQLAlchemy URL of the index (default: SQLite in --data)")
    s.add_argument("--allow-root", action="append", metavar="DIR",
                   help="directory under which paths may be registered (repeatable; "
                        "default: the data directory)")
    s.add_argument("--allowed-hosts", action="append", metavar="NAMES",
                   help="Host names clients may use, comma-separated, repeatable ('*.example.org'"
                        ", '*' for any); loopback names and a non-wildcard --host always work")
    s.add_argument("--max-upload-mb", type=int, default=4096)
    s.add_argument("--max-json-kb", type=int, default=1024,
                   help="size cap of every request body but uploads (default 1024 KiB)")
    s.add_argument("--read-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="drop a request whose body stops arriving for this long (default 60)")
    s.add_argument("--view-memory-mb", type=int, default=256,
                   help="memory one tensor view (histogram, values, heat map) may use; larger "
                        "tensors are streamed (default 256; 2 views run at once)")
    s.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="run compare and replay jobs on a Dask cluster: local:N starts N "
                        "workers on loopback with the server, or a scheduler's address "
                        "(needs the 'cluster' extra)")
    s.add_argument("--run", action="append", metavar="DUMP",
                   help="index this dump at startup (repeatable)")
    s.add_argument("--report", action="append", metavar="DIR",
                   help="index this report directory at startup (repeatable)")
    s.set_defaults(func=cmd_serve)
