"""Index dumps and report directories the operator names on the command line.

These paths come from whoever starts the server, not from clients, so they skip the
allowed-roots rule; clients use POST /api/runs/register for that.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from accuracy.server.errors import ApiError
from accuracy.server.reportindex import index_report
from accuracy.server.storage import Storage

log = logging.getLogger(__name__)


def import_paths(storage: Storage, *, runs: Iterable[str] = (), reports: Iterable[str] = ()
                 ) -> list[str]:
    """Index each path; returns one human line per path (with the URL to open)."""
    lines = []
    by_path: dict[Path, str] = {}
    for raw in runs:
        p = Path(raw).resolve()
        try:
            run = storage._index_run(p, p.name, "register", _id())
            by_path[p] = run.id
            lines.append(f"run {run.id}: {p.name} ({run.ops} ops)")
        except ApiError as e:
            lines.append(f"run {p.name}: skipped ({e.message.replace('<file>', str(p))})")
    for raw in reports:
        from accuracy.compare import load_report

        p = Path(raw).resolve()
        data = load_report(p)
        summary = data.get("summary", {})

        def run_of(key: str, summary: dict = summary) -> str | None:
            """Link the report to a run given on the same command line (for its tensors)."""
            name = summary.get(key)
            return by_path.get(Path(name).resolve()) if isinstance(name, str) else None

        rep = index_report(storage, summary, list(data.get("rows", [])), name=p.name,
                           report_dir=str(p), my_run_id=run_of("my"),
                           golden_run_id=run_of("golden"), replay_run_id=run_of("replay"))
        lines.append(f"report {rep.id}: {p.name} ({rep.n_rows} rows) -> /ui/reports/{rep.id}")
    return lines


def _id() -> str:
    from accuracy.server.storage import new_id

    return new_id()
