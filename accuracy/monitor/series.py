"""The monitor's time series on disk: one HDF5 file per rank, appended a row per recorded step.

Layout (format ``accuracy-monitor``, version 2; rows are recorded steps):

    /                      attrs: format, version, rank, world_size, freq, reduced, created,
                           model, complete (False until `close`)
    /step      (N,) int64  the step number of each row (fill -1: a row not yet written)
    /values    (N, C) f64  every figure of a row, one column each (one write per step)
    /layout    str         JSON {"loss": [a, b], "grad_norm": [a, b], "module/act_norm":
                           [a, b], "param/grad_norm": [a, b], "state/exp_avg": [a, b], ...}:
                           the columns [a, b) of each figure
    /module/names (M,) str module names (forward hooks), fixed at the first row
    /param/names  (P,) str parameter names
    /events    (B,) uint8  one JSON object per line per event (trigger fired, capture
                           written, refusal); version 1 held (E,) str, read alike

Figures: loss, grad_norm (global L2), micro_steps (the micro-batches accumulated into the
step's one optimizer step) one column each; module/<f> for f in act_norm, act_min,
act_max, act_nan, act_inf (M columns each); param/<f> for f in norm, grad_norm, grad_min,
grad_max, grad_nan, grad_inf, update_ratio, state_norm (P columns each); state/<key> per
optimizer state key (P columns each). Datasets grow 64 rows at a time, so a step costs one
row write to /values and one to /step.

NaN means "not measured on that step" (a module that did not run, a parameter without a
gradient, no optimizer step, a figure taken every N steps on the others). Rows wait in memory
and are written in batches: the first row at once, then when `flush_every` rows wait or the
oldest has waited `flush_seconds`, and on `flush()` (a trigger), `close()`, exit and SIGTERM
(shutdown.py). Rows are written `/step` last and the file is in SWMR mode, so a killed job
leaves a readable file that holds every row written before the kill: `read_series` keeps the
rows whose step was written; kill -9 loses the rows waiting then. Nothing is stored
as HDF5 variable-length strings once the file is live: HDF5 grows its heap in place, which SWMR
does not order, so a kill while it grew could leave the heap unreadable (see
accuracy/dumpfile/optext.py); events are appended as bytes instead.

A resumed job (a monitor made with `start_step` > 0 while its file exists) never touches the
file of the run before it: it writes a segment beside it, `<stem>.seg<K>.h5`, whose attrs say
`segment`, `resumed_at` (its first step) and `base_created` (the first file's `created`).
`read_series(first file)` joins the segments of that run in order; the rows of an earlier part
from `resumed_at` on (steps run after the checkpoint, then run again) give way to the resumed
ones.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from accuracy.dumpfile import validate
from accuracy.errors import AccuracyError, InputNotFoundError, OutputExistsError
from accuracy.monitor import shutdown

log = logging.getLogger(__name__)

FORMAT = "accuracy-monitor"
VERSION = 2  # 2: /events is JSON lines in bytes (1: HDF5 strings)
_CHUNK = 64
_EVENT_CHUNK = 4096
_STR = h5py.string_dtype("utf-8")
MAX_COLUMNS = 1_000_000
MAX_ROWS = 100_000_000
MAX_EVENT_BYTES = 64 << 20
MAX_EVENTS = 100_000
MAX_JSON_DEPTH = 16  # the writer's layout is 2 deep, its events 3 or 4
MAX_SEGMENTS = 1000  # resumed parts of one run joined by read_series
_SCALARS = ("loss", "grad_norm", "micro_steps")  # one column each
_MAX_MEMBERS = 64  # objects in a group of ours: six at the top, one in module/ and param/


class MonitorFileError(AccuracyError, ValueError):
    """A file that is not a monitor series this tool wrote (or is damaged)."""


def _utf8(s: str) -> str:
    """`s` as UTF-8 can store it: a lone surrogate (a name decoded with surrogateescape) is
    kept as its escape, `\\udc80`, instead of failing the file's creation."""
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


class SeriesWriter:
    """Append rows of figures; datasets are made at the first row (names are known then)."""

    def __init__(self, path: str | os.PathLike[str], *, attrs: dict[str, Any] | None = None,
                 flush_every: int = 1, flush_seconds: float | None = None,
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise OutputExistsError(f"{self.path} exists; pass overwrite=True or another path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_every = max(1, int(flush_every))
        self.flush_seconds = flush_seconds
        self.writing = False  # in the middle of a write (a SIGTERM waits for its end)
        self._since = 0.0     # when the oldest waiting row came (time.monotonic)
        self._attrs = dict(attrs or {})
        self._f: h5py.File | None = None
        self._rows: list[dict[str, Any]] = []
        self._events: list[str] = []
        self._n = 0
        self._ne = 0
        self._layout: dict[str, list[int]] = {}
        self._width = 0
        self._cap = 0

    def _create(self, row: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.creating")
        f = h5py.File(tmp, "w", libver="latest")
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.attrs["created"] = time.time()
        f.attrs["complete"] = False
        for k, v in self._attrs.items():
            f.attrs[k] = (_utf8(v) if isinstance(v, str) else v
                          if isinstance(v, int | float | bool) else json.dumps(v))
        m, p = len(row["module_names"]), len(row["param_names"])
        layout: dict[str, list[int]] = {}
        at = 0
        for name, width in ([("loss", 1), ("grad_norm", 1), ("micro_steps", 1)]
                            + [(f"module/{k}", m) for k in row["module"]]
                            + [(f"param/{k}", p) for k in row["param"]]
                            + [(f"state/{k}", p) for k in row["state"]]):
            layout[name] = [at, at + width]
            at += width
        self._layout, self._width = layout, at
        f.create_dataset("step", shape=(0,), maxshape=(None,), chunks=(_CHUNK,),
                         dtype=np.int64, fillvalue=-1)
        f.create_dataset("values", shape=(0, at), maxshape=(None, at),
                         chunks=(_CHUNK, max(1, at)), dtype=np.float64, fillvalue=np.nan)
        f.create_dataset("layout", data=json.dumps(layout), dtype=_STR)
        for kind in ("module", "param"):
            names = [_utf8(n) for n in row[f"{kind}_names"]]
            f.create_dataset(f"{kind}/names", data=np.array(names, dtype=object), dtype=_STR)
        f.create_dataset("events", shape=(0,), maxshape=(None,), chunks=(_EVENT_CHUNK,),
                         dtype=np.uint8)
        f.swmr_mode = True
        os.replace(tmp, self.path)
        self._f = f
        self._ds = (f["values"], f["step"], f["events"])  # looked up once, not per row
        self._cap = 0

    def _row(self, r: dict[str, Any]) -> np.ndarray:
        out = np.full(self._width, np.nan)
        for name, (a, b) in self._layout.items():
            if name in _SCALARS:
                out[a] = r.get(name, 1 if name == "micro_steps" else np.nan)
                continue
            kind, _, fig = name.partition("/")
            vals = r[kind].get(fig)
            if vals is not None and len(vals) == b - a:
                out[a:b] = vals
        return out

    def append(self, row: dict[str, Any]) -> None:
        """row: step, loss, grad_norm, micro_steps (1 if absent), module_names,
        param_names, module{fig: [M]}, param{fig: [P]}, state{key: [P]} (a state key unknown
        at the first row is dropped)."""
        if self._f is None:
            self._create(row)
            shutdown.register(self)
        rows = self._rows
        rows.append(row)
        if len(rows) == 1:
            self._since = time.monotonic()
        # the first row at once (the file shows the run has begun), then in batches
        if len(rows) >= self.flush_every or self._n == 0 or (
                self.flush_seconds is not None
                and time.monotonic() - self._since >= self.flush_seconds):
            self.flush()

    def event(self, kind: str, step: int, **info: Any) -> None:
        """Record an event (trigger, capture, refusal); written with the next flush."""
        self._events.append(json.dumps({"kind": kind, "step": step, **info}, default=str))
        if self._f is not None and not self._rows:
            self.flush()

    def flush(self) -> None:
        """Write the waiting rows and events."""
        f = self._f
        if f is None or self.writing or not (self._rows or self._events):
            return
        self.writing = True
        try:
            self._write(f)
        finally:
            self.writing = False
            shutdown.write_ended()

    def _write(self, f: h5py.File) -> None:
        rows, self._rows = self._rows, []
        values, steps, events = self._ds
        if rows:
            n0, n1 = self._n, self._n + len(rows)
            if n1 > self._cap:  # grow a chunk at a time: most steps write without resizing
                self._cap = (n1 + _CHUNK - 1) // _CHUNK * _CHUNK
                values.resize(self._cap, axis=0)
                steps.resize(self._cap, axis=0)
            _write_rows(values, n0, np.stack([self._row(r) for r in rows]))
            # last: a row counts once its step is in
            _write_rows(steps, n0, np.array([r["step"] for r in rows], dtype=np.int64))
            self._n = n1
        if self._events:
            ev, self._events = self._events, []
            raw = np.frombuffer("".join(e + "\n" for e in ev).encode(), np.uint8)
            ds = events
            ds.resize(self._ne + raw.size, axis=0)
            ds[self._ne:] = raw
            self._ne += raw.size
        f.flush()

    def close(self) -> None:
        if self._f is None:
            return
        try:
            self.flush()
            self._f.attrs["complete"] = True
        finally:
            self._f.close()
            self._f = None


def segment_path(base: str | os.PathLike[str], k: int) -> Path:
    """The path of the k-th resumed part of the run whose first file is `base`."""
    b = Path(base)
    stem = b.name[:-3] if b.name.endswith(".h5") else b.name
    return b.with_name(f"{stem}.seg{k}.h5")


def segments(base: str | os.PathLike[str]) -> list[Path]:
    """The resumed parts written beside `base`, in order (regular files only: a link named as
    a segment is not followed out of the folder)."""
    b = Path(base)
    stem = b.name[:-3] if b.name.endswith(".h5") else b.name
    pat = re.compile(re.escape(stem) + r"\.seg([1-9][0-9]{0,5})\.h5")
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(b.parent if str(b.parent) else ".")
    except OSError:
        return []
    for name in names:
        m = pat.fullmatch(name)
        if m is None:
            continue
        p = b.with_name(name)
        try:
            if stat.S_ISREG(os.lstat(p).st_mode):
                found.append((int(m.group(1)), p))
        except OSError:
            continue
    return [p for _, p in sorted(found)[:MAX_SEGMENTS]]


def _write_rows(ds: h5py.Dataset, at: int, arr: np.ndarray) -> None:
    """`ds[at:at + len(arr)] = arr` through the low-level call (a step's row write costs a
    few microseconds instead of h5py's selection machinery)."""
    arr = np.ascontiguousarray(arr, dtype=ds.dtype)
    fs = ds.id.get_space()
    fs.select_hyperslab((at,) + (0,) * (arr.ndim - 1), arr.shape)
    ds.id.write(h5py.h5s.create_simple(arr.shape), fs, arr)


@dataclass
class Series:
    """A monitor file read into memory (numpy arrays; rows of unwritten steps dropped)."""

    path: Path
    attrs: dict[str, Any]
    step: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    module_names: list[str]
    param_names: list[str]
    module: dict[str, np.ndarray] = field(default_factory=dict)
    param: dict[str, np.ndarray] = field(default_factory=dict)
    state: dict[str, np.ndarray] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    micro_steps: np.ndarray | None = None  # micro-batches per row (None: a file before them)
    segments: list[Path] = field(default_factory=list)  # resumed parts joined after `path`

    def figure(self, kind: str, name: str) -> tuple[list[str], np.ndarray]:
        """(names, values[rows, names]) of one figure: kind 'module', 'param' or 'state'."""
        table = {"module": self.module, "param": self.param, "state": self.state}.get(kind)
        if table is None or name not in table:
            raise MonitorFileError(f"{self.path} has no {kind} figure {name!r}")
        names = self.module_names if kind == "module" else self.param_names
        return names, table[name]


def _check_links(f: h5py.File) -> None:
    """Every object of the file, down to the groups our writer makes, is reached by a hard
    link: checked from the links themselves before any is followed (an external link would
    open another file on the first access), with the dump reader's rules."""
    for name in list(f.keys())[:_MAX_MEMBERS + 1]:
        validate.check_link(f, name, f"/{name}")
    if len(f) > _MAX_MEMBERS:
        raise MonitorFileError(f"{f.filename}: more than {_MAX_MEMBERS} objects at the top")
    for kind in ("module", "param"):
        g = f.get(kind)
        if isinstance(g, h5py.Group):
            for name in list(g.keys())[:_MAX_MEMBERS]:
                validate.check_link(g, name, f"/{kind}/{name}")


def _dataset(f: h5py.File, name: str, rows: int | None = None) -> h5py.Dataset:
    """The dataset `name`, whose bytes are in this file, unfiltered (validate.check_storage);
    with `rows`, the first `rows` rows must be stored: a few KB of file cannot claim GBs of
    never-written rows that reading would allocate."""
    ds = f.get(name)
    if not isinstance(ds, h5py.Dataset):
        raise MonitorFileError(f"{f.filename}: /{name} is missing or malformed")
    validate.check_storage(ds, f"/{name}")
    if rows is not None:  # a kill may leave the last chunk unwritten: one chunk of slack
        slack = min(ds.chunks[0], _CHUNK) if ds.chunks else 0
        need = (max(0, rows - slack) * int(np.prod(ds.shape[1:], dtype=np.int64))
                * ds.dtype.itemsize)
        if ds.id.get_storage_size() < need:
            raise MonitorFileError(f"{f.filename}: /{name} claims {rows} rows it does not "
                                   "store")
    return ds


def _json(text: Any, what: str) -> Any:
    """JSON from the file, nested no deeper than our writer ever writes it (the dump
    reader's parser and limits)."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return validate.parse_json(text, what, MAX_JSON_DEPTH)
    except UnicodeDecodeError:
        raise MonitorFileError(f"{what} is not UTF-8 text") from None
    except validate.LayoutError as e:
        raise MonitorFileError(str(e)) from None


def _names(f: h5py.File, name: str) -> list[str]:
    ds = _dataset(f, name)
    if ds.ndim != 1 or ds.shape[0] > MAX_COLUMNS or ds.dtype.kind not in "OSU":
        raise MonitorFileError(f"{f.filename}: {name} is missing or malformed")
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in ds[()]]


def _layout(f: h5py.File, width: int) -> dict[str, tuple[int, int]]:
    ds = _dataset(f, "layout")
    if ds.shape != () or ds.dtype.kind not in "OSU":
        raise MonitorFileError(f"{f.filename}: /layout is missing or malformed")
    lay = _json(ds[()], f"{f.filename}: /layout")
    if not isinstance(lay, dict):
        raise MonitorFileError(f"{f.filename}: /layout is not a mapping")
    out = {}
    for k, v in lay.items():
        if not (isinstance(k, str) and isinstance(v, list) and len(v) == 2
                and all(isinstance(x, int) for x in v) and 0 <= v[0] <= v[1] <= width):
            raise MonitorFileError(f"{f.filename}: /layout entry {k!r} is out of range")
        out[k] = (v[0], v[1])
    return out


def _events(f: h5py.File) -> list[dict[str, Any]]:
    """The events of a file (JSON lines in bytes; version 1: strings). A line cut by a kill,
    or a version-1 heap a kill left unreadable, loses those events, not the file."""
    ev = f.get("events")
    if not isinstance(ev, h5py.Dataset) or ev.ndim != 1:
        return []
    validate.check_storage(ev, "/events")
    try:
        if ev.dtype == np.uint8:
            lines = ev[: min(ev.shape[0], MAX_EVENT_BYTES)].tobytes().split(b"\n")
        else:
            lines = list(ev[: min(ev.shape[0], 100_000)])
    except OSError as e:
        log.warning("%s: its events are unreadable (%s); the figures are read without them",
                    f.filename, e)
        return []
    events: list[dict[str, Any]] = []
    for i, raw in enumerate(lines):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not isinstance(text, str) or not text.strip():
            continue
        try:
            item = validate.parse_json(text, f"{f.filename}: event {i}", MAX_JSON_DEPTH)
        except validate.NestingError as e:  # no writer of ours nests so deep: altered
            raise MonitorFileError(str(e)) from None
        except ValueError:  # a line cut by a kill: that event is lost, not the file
            continue
        if isinstance(item, dict):
            if len(events) >= MAX_EVENTS:
                log.warning("%s: more than %d events; the later ones are not read",
                            f.filename, MAX_EVENTS)
                break
            events.append(item)
    return events


def _open(p: Path) -> h5py.File:
    """Open read-only; through SWMR only a file its writer still holds (or a killed job left
    marked open): SWMR retries a metadata read whose checksum fails, so a damaged closed file
    read that way took minutes to refuse, where a plain open refuses it at once."""
    try:
        return h5py.File(p, "r", locking="best-effort")
    except OSError as exc:
        if "already open for write" not in str(exc) and "consistency flags" not in str(exc):
            raise MonitorFileError(f"{p} is not a readable HDF5 file ({exc})") from None
    try:
        return h5py.File(p, "r", swmr=True, locking="best-effort")
    except OSError as exc:
        raise MonitorFileError(f"{p} is not a readable HDF5 file ({exc})") from None


def read_series(path: str | os.PathLike[str], join: bool = True) -> Series:
    """Read a monitor file (also one from a killed job: the rows written before the kill).
    With `join`, the segments a resumed job wrote beside it are joined after it."""
    p = Path(path)
    s = _read_one(p)
    if not join or s.attrs.get("segment"):
        return s
    for seg in segments(p):
        try:
            part = _read_one(seg)
        except MonitorFileError as e:
            log.warning("%s: resumed part not joined: %s", seg, e)
            continue
        if part.attrs.get("base_created") != s.attrs.get("created"):
            continue  # a part of another run that used the same name
        if part.module_names != s.module_names or part.param_names != s.param_names:
            log.warning("%s: resumed part not joined: its modules or parameters differ from "
                        "%s's", seg, p.name)
            continue
        s = _join(s, part)
    return s


def _join(a: Series, b: Series) -> Series:
    """`a` followed by the resumed part `b`: a's rows from b's first step on give way."""
    at = b.attrs.get("resumed_at")
    first = int(at) if isinstance(at, int | float) and not isinstance(at, bool) else (
        int(b.step[0]) if b.step.size else None)
    keep = a.step < first if first is not None else np.ones(a.step.shape, bool)
    rows_b = b.step.shape[0]

    def cat(x: np.ndarray | None, y: np.ndarray | None, width: int | None) -> np.ndarray:
        if x is None:
            x = np.full((a.step.shape[0],) + ((width,) if width else ()), np.nan)
        if y is None:
            y = np.full((rows_b,) + ((width,) if width else ()), np.nan)
        return np.concatenate([x[keep], y])

    tables = {}
    for kind, width in (("module", len(a.module_names)), ("param", len(a.param_names)),
                        ("state", len(a.param_names))):
        ta, tb = getattr(a, kind), getattr(b, kind)
        tables[kind] = {k: cat(ta.get(k), tb.get(k), width) for k in {**ta, **tb}}
    micro = None if a.micro_steps is None and b.micro_steps is None else cat(
        a.micro_steps if a.micro_steps is not None else np.ones(a.step.shape),
        b.micro_steps if b.micro_steps is not None else np.ones(b.step.shape), None)
    ev = [e for e in a.events if not (first is not None and isinstance(e.get("step"), int)
                                      and e["step"] >= first)] + b.events
    return Series(path=a.path, attrs=a.attrs, step=cat(a.step, b.step, None),
                  loss=cat(a.loss, b.loss, None), grad_norm=cat(a.grad_norm, b.grad_norm, None),
                  module_names=a.module_names, param_names=a.param_names,
                  module=tables["module"], param=tables["param"], state=tables["state"],
                  events=ev[:MAX_EVENTS], micro_steps=micro,
                  segments=[*a.segments, b.path])


def _read_one(p: Path) -> Series:
    if not p.is_file():
        raise InputNotFoundError(f"{p} not found: give a monitor file (*.monitor.h5)")
    f = _open(p)
    with f:
        try:
            return _read(f, p)
        except validate.LayoutError as e:
            raise MonitorFileError(f"{p}: refused: {e}") from None
        except MonitorFileError:
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise MonitorFileError(f"{p}: damaged monitor file ({type(e).__name__}: {e})"
                                   ) from None


def _read(f: h5py.File, p: Path) -> Series:
    validate.check_attrs(f, "/")
    if f.attrs.get("format") != FORMAT:
        raise MonitorFileError(f"{p} is not a monitor file (format "
                               f"{f.attrs.get('format')!r}); give one written by "
                               "accuracy.monitor")
    _check_links(f)  # only what our writer makes: no links out of the file or around it
    step_ds = _dataset(f, "step")
    if step_ds.ndim != 1 or step_ds.dtype.kind not in "iu" or step_ds.shape[0] > MAX_ROWS:
        raise MonitorFileError(f"{p}: /step is missing or malformed")
    steps = np.asarray(_dataset(f, "step", step_ds.shape[0])[()], dtype=np.int64)
    written = np.flatnonzero(steps < 0)
    rows = int(written[0]) if written.size else steps.shape[0]
    mod_names, par_names = _names(f, "module/names"), _names(f, "param/names")
    vds = _dataset(f, "values")
    if vds.ndim != 2 or vds.dtype.kind != "f" or vds.shape[0] < rows \
            or vds.shape[1] > MAX_COLUMNS:
        raise MonitorFileError(f"{p}: /values is missing or malformed")
    values = np.asarray(_dataset(f, "values", rows)[:rows], dtype=np.float64)
    tables: dict[str, dict[str, np.ndarray]] = {"module": {}, "param": {}, "state": {}}
    width = {"module": len(mod_names), "param": len(par_names), "state": len(par_names)}
    scalars: dict[str, np.ndarray] = {}
    for name, (a, b) in _layout(f, vds.shape[1]).items():
        if name in _SCALARS and b - a == 1:
            scalars[name] = values[:, a]
            continue
        kind, _, fig = name.partition("/")
        if kind not in tables or b - a != width[kind]:
            raise MonitorFileError(f"{p}: /layout entry {name!r} does not fit its names")
        tables[kind][fig] = values[:, a:b]
    events = _events(f)
    return Series(
        path=p, attrs={k: (v.item() if hasattr(v, "item") else v)
                       for k, v in f.attrs.items()},
        step=steps[:rows], loss=scalars.get("loss", np.full(rows, np.nan)),
        grad_norm=scalars.get("grad_norm", np.full(rows, np.nan)),
        module_names=mod_names, param_names=par_names, module=tables["module"],
        param=tables["param"], state=tables["state"], events=events,
        micro_steps=scalars.get("micro_steps"))
