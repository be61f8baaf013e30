"""`accuracy info` and `accuracy ls` as library calls: what a dump holds, as text or JSON.

Each call opens the dump, reads what it needs and closes it; the result's `format()` is the
text the command prints, so the CLI only parses arguments.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from accuracy.dumpfile.compiled import blind_lines, recompile_lines, seen_lines
from accuracy.dumpfile.reader import load_dump
from accuracy.errors import UsageError
from accuracy.termtext import shown


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


@dataclass
class DumpInfo:
    """A dump's summary (`Dump.summary()`): counts by op, phase, module and dtype, bytes."""

    summary: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(self.summary, indent=2, default=str)

    def format(self, top: int = 10) -> str:
        """The summary as lines of text, with the `top` most frequent op names."""
        s = self.summary
        a = s["attrs"]
        state = ("complete" if s["complete"]
                 else "INCOMPLETE (the dumped block raised or was killed)")
        lines = [f"{s['path']}: {state}"]
        # compiled code the dump did not see comes before anything else it holds
        lines += [f"  BLIND: {b}" for b in blind_lines(a)]
        lines += [f"  RECOMPILED: {b}" for b in recompile_lines(a)]
        lines += [f"  {b}" for b in seen_lines(a)]
        # the backend is written at close: a killed run's is read off its tensors
        backend = a.get("backend") or (f"{'/'.join(s['tensor_devices'])} (from its tensors)"
                                       if s.get("tensor_devices") else None)
        lines += [
            f"  mode {a.get('mode')}, backend {backend}"
            + (f" (profile {a['profile']})" if a.get("profile") else "")
            + f", torch {a.get('torch_version')}, rank {a.get('rank')}, steps {s['steps']}",
            f"  ops {s['ops']}  ({', '.join(f'{k} {v}' for k, v in s['by_phase'].items())})"
            f", modules {s['modules']}",
            f"  tensors {s['tensors']} ({s['tensors_with_data']} with data); dtypes "
            + ", ".join(f"{k} {v}" for k, v in s["by_dtype"].items()),
            f"  bytes written {human_bytes(s['bytes_written'])}, saved by links "
            f"{human_bytes(s['bytes_saved_by_links'])}, file {human_bytes(s['file_bytes'])}"
            + (f", in the replayed dump (equal to the device's) "
               f"{human_bytes(s['bytes_in_replayed_dump'])}"
               if s.get("bytes_in_replayed_dump") else ""),
            f"  stored bytes checked by {s.get('checksum_kind', 'bit-pattern sum')}",
        ]
        if a.get("load_file_path"):  # its ops ran on another run's inputs, not the device's
            lines.append(f"  load mode: {a.get('ops_loaded', 0)} ops computed on the golden "
                         f"inputs of {shown(str(a['load_file_path']))}")
        faults = a.get("faults_applied") or []
        if faults:
            lines.append(f"  faults injected: {len(faults)}")
            lines += [f"    {f}" for f in faults]
        lines.append("  top ops:")
        lines += [f"    {n:6d}  {shown(name)}" for name, n in list(s["by_op"].items())[:top]]
        return "\n".join(lines)


def describe(path: str | os.PathLike[str]) -> DumpInfo:
    """What the dump at `path` holds (raises DumpError for anything but a readable dump)."""
    with load_dump(path) as d:
        return DumpInfo(d.summary())


@dataclass
class OpListing:
    """Recorded ops matching a filter, one line each (and each tensor's statistics)."""

    lines: list[str] = field(default_factory=list)
    count: int = 0  # ops matched, also those past the limit
    loaded: int = 0  # of those, ops that computed on the golden run's inputs (load mode)
    load_file: str | None = None  # the load mode's golden file

    def counts(self) -> str:
        """'12 ops', or '12 ops (3 loaded from ./model_gpu.h5)' for a load-mode dump."""
        if not self.loaded:
            return f"{self.count} ops"
        return f"{self.count} ops ({self.loaded} loaded from {self.load_file or 'the load file'})"

    def format(self) -> str:
        return "\n".join(self.lines)


def list_ops(path: str | os.PathLike[str], *, op: str | None = None,
             module: str | None = None, phase: str | None = None, limit: int = 0,
             tensors: bool = False, source: bool = False) -> OpListing:
    """The ops of a dump matching `op`/`module` globs and `phase`, the first `limit` (0: all)
    listed; with `tensors`, each tensor's statistics under its op. An op that load mode fed
    with the golden run's inputs is marked `[loaded]` (its inputs: `golden input`)."""
    if limit < 0:
        raise UsageError(f"limit must be 0 (all) or more, not {limit}")
    listing = OpListing()
    with load_dump(path) as d:
        d.require_op(op)
        rows = list(d.select(op=op, module=module, phase=phase))
        listing.count = len(rows)
        listing.loaded = sum(1 for r in rows if r.extra.get("loaded"))
        lf = d.attrs.get("load_file_path")
        listing.load_file = lf if isinstance(lf, str) else None
        for r in rows[:limit] if limit else rows:
            loaded = bool(r.extra.get("loaded"))
            outs = "; ".join(f"{t.dtype}{list(t.shape)}" for t in r.outputs)
            listing.lines.append(
                f"{r.seq:6d}  {shown(r.op):40s} {shown(r.phase):9s} "
                f"{shown(r.module) or '-':45s} -> {outs}"
                + ("  [loaded]" if loaded else "")
                + (f"  [{shown(r.source)}]" if source and r.source else ""))
            if tensors:
                golden_in = {id(t) for t in r.inputs} if loaded else set()
                for t in r.tensors:
                    st = t.stats
                    listing.lines.append(
                        f"          {t.address}  {t.dtype}{list(t.shape)} min {st['min']:.4g} "
                        f"max {st['max']:.4g} mean {st['mean']:.4g} l2 {st['l2']:.4g}"
                        + (" (link)" if t.is_link else "")
                        + (" (golden input)" if id(t) in golden_in else ""))
    return listing


@dataclass
class Verification:
    """What `accuracy verify` found in one dump: problems (empty when whole), the counts, and
    `incomplete`, a sentence when the run stopped before the dumper closed it (killed,
    crashed, disk full): every byte kept may be sound while ops are missing."""

    path: str
    problems: list[str]
    n_ops: int = 0
    n_stored: int = 0
    bytes_checked: int = 0
    incomplete: str | None = None
    allow_incomplete: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems and (self.incomplete is None or self.allow_incomplete)

    def format(self) -> str:
        if self.problems:
            return "\n".join(self.problems)
        counts = (f"{self.n_ops} ops, {self.n_stored} stored tensors, {self.bytes_checked} "
                  "bytes checked")
        if self.incomplete is None:
            return f"{self.path}: ok ({counts})"
        if self.allow_incomplete:
            return f"{self.path}: ok but INCOMPLETE ({counts}): {self.incomplete}"
        return (f"{self.path}: INCOMPLETE ({counts}): {self.incomplete}; pass "
                "--allow-incomplete to accept what it kept")


def _incomplete(d: Any) -> str | None:
    """Why a dump is not whole, and what it lacks (ops seen against ops kept, the last op
    kept), or None for a dump its dumper closed as complete."""
    if bool(d.attrs.get("complete")) and d.closed_cleanly:
        return None
    recs = d.records
    last = (f"the last op kept is {recs[-1].seq} ({shown(recs[-1].op)})" if recs
            else "it kept no op")
    seen = d.attrs.get("ops_seen")
    if not d.closed_cleanly:
        return (f"the dumper never closed it (the process was killed or crashed, or the disk "
                f"was too full for the close): it kept {len(recs)} ops, {last}; how many ops "
                "the run saw after those is not recorded")
    if isinstance(seen, int) and not isinstance(seen, bool):
        lacks = f"{seen - len(recs)} of the {seen} ops seen are not in it" if seen > len(recs) \
            else f"it kept all {seen} ops seen"
        return (f"the dumper stopped recording (a full disk, a write error or an exception in "
                f"the recorded block): {lacks}; {last}")
    return f"the dumper closed it as incomplete: it kept {len(recs)} ops, {last}"


def verify_file(path: str | os.PathLike[str], *,
                allow_incomplete: bool = False) -> Verification:
    """Check a dump's layout, index and every stored byte range once; a dump refused at open
    (layout, links, index, damaged metadata) is one problem, not an exception. A dump the run
    did not finish is not `ok` unless `allow_incomplete`."""
    from accuracy.dumpfile.errors import DumpError

    try:
        with load_dump(path) as d:
            n_ops = len(d.records)  # parses every op row (JSON included)
            problems = d.verify()
            stored = [t for t in d.tensors if t.has_data and not t.is_link]
            incomplete = _incomplete(d)
    except DumpError as e:
        return Verification(str(path), [str(e)])
    return Verification(str(path), list(problems), n_ops, len(stored),
                        sum(t.nbytes for t in stored), incomplete, allow_incomplete)
