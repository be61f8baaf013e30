"""The monitor's time series on disk: one HDF5 file per rank, appended a row per recorded step.

Layout (format ``accuracy-monitor``, version 1; every dataset's first axis is the row):

    /                      attrs: format, version, rank, world_size, freq, reduced, created,
                           model, complete (False until `close`)
    /step      (N,) int64  the step number of each row (fill -1: a row not yet written)
    /loss      (N,) f64    the loss the step returned (NaN when it returned none)
    /grad_norm (N,) f64    the global gradient norm (L2 over every parameter's gradient)
    /module/names (M,) str module names (forward hooks), fixed at the first row
    /module/<figure> (N, M) f64   act_norm, act_min, act_max, act_nan, act_inf
    /param/names  (P,) str parameter names
    /param/<figure>  (N, P) f64   norm, grad_norm, grad_min, grad_max, grad_nan, grad_inf,
                                  update_ratio (|w_after - w_before| / |w_after|), state_norm
    /state/<key>     (N, P) f64   norm of each optimizer state tensor (exp_avg, exp_avg_sq...)
    /events    (E,) str   one JSON object per event (trigger fired, capture written, refusal)

NaN means "not measured on that step" (a module that did not run, a parameter without a
gradient, no optimizer step). Rows are written `/step` last and the file is in SWMR mode, so a
killed job leaves a readable file that holds every row flushed before the kill (`flush_every`
steps, 1 by default): `read_series` keeps the rows whose step was written.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from accuracy.errors import AccuracyError, InputNotFoundError, OutputExistsError

log = logging.getLogger(__name__)

FORMAT = "accuracy-monitor"
VERSION = 1
_CHUNK = 64
_STR = h5py.string_dtype("utf-8")
MAX_COLUMNS = 1_000_000
MAX_ROWS = 100_000_000


class MonitorFileError(AccuracyError, ValueError):
    """A file that is not a monitor series this tool wrote (or is damaged)."""


class SeriesWriter:
    """Append rows of figures; datasets are made at the first row (names are known then)."""

    def __init__(self, path: str | os.PathLike[str], *, attrs: dict[str, Any] | None = None,
                 flush_every: int = 1, overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise OutputExistsError(f"{self.path} exists; pass overwrite=True or another path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_every = max(1, int(flush_every))
        self._attrs = dict(attrs or {})
        self._f: h5py.File | None = None
        self._rows: list[dict[str, Any]] = []
        self._events: list[str] = []
        self._n = 0
        self._ne = 0
        self._state_keys: list[str] = []
        self._module_figs: list[str] = []
        self._param_figs: list[str] = []

    def _create(self, row: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.creating")
        f = h5py.File(tmp, "w", libver="latest")
        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.attrs["created"] = time.time()
        f.attrs["complete"] = False
        for k, v in self._attrs.items():
            f.attrs[k] = v if isinstance(v, int | float | str | bool) else json.dumps(v)

        def series(name: str, width: int | None, dtype: Any = np.float64, fill: Any = np.nan
                   ) -> None:
            shape, maxshape, chunks = ((0,), (None,), (_CHUNK,)) if width is None else \
                ((0, width), (None, width), (_CHUNK, max(1, width)))
            f.create_dataset(name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype,
                             fillvalue=fill)

        series("step", None, np.int64, -1)
        series("loss", None)
        series("grad_norm", None)
        m, p = len(row["module_names"]), len(row["param_names"])
        f.create_dataset("module/names", data=np.array(row["module_names"], dtype=object),
                         dtype=_STR)
        f.create_dataset("param/names", data=np.array(row["param_names"], dtype=object),
                         dtype=_STR)
        self._module_figs = list(row["module"])
        self._param_figs = list(row["param"])
        self._state_keys = list(row["state"])
        for fig in self._module_figs:
            series(f"module/{fig}", m)
        for fig in self._param_figs:
            series(f"param/{fig}", p)
        for key in self._state_keys:
            series(f"state/{key}", p)
        f.create_dataset("events", shape=(0,), maxshape=(None,), chunks=(_CHUNK,), dtype=_STR)
        f.swmr_mode = True
        os.replace(tmp, self.path)
        self._f = f

    def append(self, row: dict[str, Any]) -> None:
        """row: step, loss, grad_norm, module_names, param_names, module{fig: [M]},
        param{fig: [P]}, state{key: [P]}."""
        if self._f is None:
            self._create(row)
        self._rows.append(row)
        if len(self._rows) >= self.flush_every:
            self.flush()

    def event(self, kind: str, step: int, **info: Any) -> None:
        """Record an event (trigger, capture, refusal); written with the next flush."""
        self._events.append(json.dumps({"kind": kind, "step": step, **info}, default=str))
        if self._f is not None and not self._rows:
            self.flush()

    def flush(self) -> None:
        f = self._f
        if f is None:
            return
        rows, self._rows = self._rows, []
        if rows:
            n0, n1 = self._n, self._n + len(rows)

            def put(name: str, values: Any) -> None:
                ds = f[name]
                ds.resize(n1, axis=0)
                ds[n0:n1] = values

            put("loss", [r["loss"] for r in rows])
            put("grad_norm", [r["grad_norm"] for r in rows])
            for fig in self._module_figs:
                put(f"module/{fig}", np.array([r["module"][fig] for r in rows], np.float64))
            for fig in self._param_figs:
                put(f"param/{fig}", np.array([r["param"][fig] for r in rows], np.float64))
            p = f["param/names"].shape[0]
            for key in self._state_keys:
                put(f"state/{key}", np.array([r["state"].get(key, [np.nan] * p) for r in rows],
                                             np.float64))
            put("step", [r["step"] for r in rows])  # last: a row counts once its step is in
            self._n = n1
        if self._events:
            ev, self._events = self._events, []
            ds = f["events"]
            ds.resize(self._ne + len(ev), axis=0)
            ds[self._ne:] = np.array(ev, dtype=object)
            self._ne += len(ev)
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

    def figure(self, kind: str, name: str) -> tuple[list[str], np.ndarray]:
        """(names, values[rows, names]) of one figure: kind 'module', 'param' or 'state'."""
        table = {"module": self.module, "param": self.param, "state": self.state}.get(kind)
        if table is None or name not in table:
            raise MonitorFileError(f"{self.path} has no {kind} figure {name!r}")
        names = self.module_names if kind == "module" else self.param_names
        return names, table[name]


def _names(f: h5py.File, name: str) -> list[str]:
    ds = f.get(name)
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.shape[0] > MAX_COLUMNS:
        raise MonitorFileError(f"{f.filename}: {name} is missing or malformed")
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in ds[()]]


def _table(f: h5py.File, group: str, rows: int, width: int) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    g = f.get(group)
    if not isinstance(g, h5py.Group):
        return out
    for key, ds in g.items():
        if key == "names" or not isinstance(ds, h5py.Dataset):
            continue
        if ds.ndim != 2 or ds.shape[1] != width or ds.dtype.kind != "f":
            raise MonitorFileError(f"{f.filename}: {group}/{key} has shape {ds.shape}, "
                                   f"expected (rows, {width}) floats")
        out[key] = np.asarray(ds[:rows], dtype=np.float64)
    return out


def read_series(path: str | os.PathLike[str]) -> Series:
    """Read a monitor file (also one from a killed job: the rows written before the kill)."""
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"{p} not found: give a monitor file (*.monitor.h5)")
    try:
        f = h5py.File(p, "r", swmr=True)
    except OSError as exc:
        raise MonitorFileError(f"{p} is not a readable HDF5 file ({exc})") from exc
    with f:
        if f.attrs.get("format") != FORMAT:
            raise MonitorFileError(f"{p} is not a monitor file (format "
                                   f"{f.attrs.get('format')!r}); give one written by "
                                   "accuracy.monitor")
        for name, obj in f.items():  # only what our writer makes: no links out of the file
            if f.get(name, getlink=True).__class__ is not h5py.HardLink:
                raise MonitorFileError(f"{p}: {name} is a link, not data this tool wrote")
            del obj
        step_ds = f.get("step")
        if not isinstance(step_ds, h5py.Dataset) or step_ds.ndim != 1 \
                or step_ds.shape[0] > MAX_ROWS:
            raise MonitorFileError(f"{p}: /step is missing or malformed")
        steps = np.asarray(step_ds[()], dtype=np.int64)
        written = np.flatnonzero(steps < 0)
        rows = int(written[0]) if written.size else steps.shape[0]
        mod_names, par_names = _names(f, "module/names"), _names(f, "param/names")
        ev = f.get("events")
        events = []
        if isinstance(ev, h5py.Dataset) and ev.ndim == 1:
            for raw in ev[: min(ev.shape[0], 100_000)]:
                try:
                    item = json.loads(raw.decode("utf-8", "replace")
                                      if isinstance(raw, bytes) else raw)
                except (ValueError, TypeError):
                    continue
                if isinstance(item, dict):
                    events.append(item)
        return Series(
            path=p, attrs={k: (v.item() if hasattr(v, "item") else v)
                           for k, v in f.attrs.items()},
            step=steps[:rows], loss=np.asarray(f["loss"][:rows], np.float64),
            grad_norm=np.asarray(f["grad_norm"][:rows], np.float64),
            module_names=mod_names, param_names=par_names,
            module=_table(f, "module", rows, len(mod_names)),
            param=_table(f, "param", rows, len(par_names)),
            state=_table(f, "state", rows, len(par_names)), events=events)
