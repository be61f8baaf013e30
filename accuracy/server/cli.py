"""`accuracy serve`: argument parsing only; the policy and startup are `accuracy.server.serve`."""

from __future__ import annotations

import argparse

from accuracy.cliargs import at_least, port
from accuracy.server.serve import is_loopback

__all__ = ["cmd_serve", "is_loopback", "register"]


def cmd_serve(args: argparse.Namespace) -> int:
    from accuracy.server.serve import serve

    serving = serve(args.data, host=args.host, port=args.port, token=args.token,
                    db_url=args.db_url, allow_roots=args.allow_root or (),
                    allowed_hosts=args.allowed_hosts or (), max_upload_mb=args.max_upload_mb,
                    max_json_kb=args.max_json_kb, read_timeout_s=args.read_timeout,
                    view_memory_mb=args.view_memory_mb, runs=args.run or (),
                    reports=args.report or (), verbose=args.verbose, cluster=args.cluster,
                    max_queued_jobs=args.max_queued_jobs)
    print(serving.format(), flush=True)
    serving.run()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    s = subparsers.add_parser("serve", help="REST API and web UI to browse runs and reports")
    s.add_argument("--data", help="data directory (uploaded dumps, reports, index, jobs); "
                                   "without it the index is a temporary folder deleted when "
                                   "the server stops")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; anything but loopback needs --token")
    s.add_argument("--port", type=port, default=8000)
    s.add_argument("--token", help="API token for write endpoints (or ACCURACY_TOKEN)")
    s.add_argument("--db-url", "--db", dest="db_url",
                   help="SQLAlchemy URL of the index, e.g. postgresql://user@host/db "
                        "(default: SQLite in --data)")
    s.add_argument("--allow-root", action="append", metavar="DIR",
                   help="directory under which paths may be registered (repeatable; "
                        "default: the data directory)")
    s.add_argument("--allowed-hosts", action="append", metavar="NAMES",
                   help="Host names clients may use, comma-separated, repeatable ('*.example.org'"
                        ", '*' for any); loopback names and a non-wildcard --host always work")
    s.add_argument("--max-upload-mb", type=at_least(1), default=4096)
    s.add_argument("--max-json-kb", type=at_least(1), default=1024,
                   help="size cap of every request body but uploads (default 1024 KiB)")
    s.add_argument("--read-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="drop a request whose body stops arriving for this long (default 60)")
    s.add_argument("--view-memory-mb", type=at_least(1), default=256,
                   help="memory one tensor view (histogram, values, heat map) may use; larger "
                        "tensors are streamed (default 256; 2 views run at once)")
    s.add_argument("--cluster", metavar="local:N|tcp://HOST:PORT",
                   help="run compare and replay jobs on a Dask cluster: local:N starts N "
                        "workers on loopback with the server, or a scheduler's address "
                        "(needs the 'cluster' extra)")
    s.add_argument("--max-queued-jobs", type=at_least(1), default=8, metavar="N",
                   help="compare jobs that may wait for the one running; more are refused "
                        "with 429 and Retry-After (default 8)")
    s.add_argument("--run", action="append", metavar="DUMP",
                   help="index this dump at startup (repeatable)")
    s.add_argument("--report", action="append", metavar="DIR",
                   help="index this report directory at startup (repeatable)")
    s.set_defaults(func=cmd_serve)
