"""`replay(...)`: replay every recorded op of a dump and write replay.h5 (same format).

The output is written to `<out>.partial` and renamed when complete, so an interrupted replay
leaves a readable partial dump; `resume=True` copies its finished ops instead of redoing them.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import accuracy
from accuracy.dumpfile import Dump, DumpError, OpRecord, TensorRecord, load_dump, schema
from accuracy.dumpfile.checksum import CONTENT_HASH_KIND, NO_HASH
from accuracy.dumpfile.stats import tensor_stats
from accuracy.dumpfile.writer import DumpWriter, OpEntry, TensorEntry
from accuracy.errors import AccuracyError, NoMatchError, OutputExistsError
from accuracy.outputs import writable_folder
from accuracy.patterns import no_op_message, op_matches, unmatched_ops
from accuracy.records import CallSite
from accuracy.replay.cache import TensorCache
from accuracy.replay.emulate import Emulation
from accuracy.replay.kernels import kernel_references, references
from accuracy.replay.ops import OK, OpOutcome, caching, refused_for_sure, replay_op
from accuracy.replay.rebuild import UPCASTS

log = logging.getLogger(__name__)
_BATCH = 16  # ops per task handed to a worker process


class ReplayError(AccuracyError, ValueError):
    """The dump cannot be replayed at all (statistics mode, bad options...)."""


@dataclass
class ReplayResult:
    """Counts per status, and where replay.h5 is."""

    path: Path
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    resumed: int = 0
    seconds: float = 0.0
    bytes_read: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    on: str = ""
    upcast: str = ""
    held: int = 0  # reference outputs whose bytes are named in the dump beside, not written
    dump: str = ""  # the replayed dump's file name

    @property
    def total(self) -> int:
        return self.ok + self.skipped + self.failed

    def format(self) -> str:
        """The terminal summary: counts, the reasons ops were skipped or failed, the file."""
        lines = [f"replayed {self.total} ops on {self.on} (upcast {self.upcast}) in "
                 f"{self.seconds:.2f}s: {self.ok} ok, {self.skipped} skipped, {self.failed} failed"
                 + (f", {self.resumed} carried over from the interrupted run"
                    if self.resumed else "")]
        lines += format_reasons(self.reasons)
        lines.append(f"wrote {self.path}")
        if self.held:
            lines.append(f"  {self.held} reference outputs equal the device's: they name its "
                         f"bytes in {self.dump} beside it (keep the two files together)")
        return "\n".join(lines)


def format_reasons(reasons: dict[str, int]) -> list[str]:
    """One line per reason, the most frequent first."""
    return [f"  {n:5d}  {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])]


def reference_device(on: str) -> torch.device:
    """Map a backend name (cpu, cuda, npu...) to the torch device replay runs on."""
    try:
        from accuracy.device_backend import get_backend
        return torch.device(get_backend(on).device_type)
    except (ImportError, LookupError, KeyError):
        return torch.device(on)


def require_backend(on: str) -> None:
    """Refuse, in one line, a reference backend this machine lacks (torch would fail in the
    first op with 'Torch not compiled with CUDA enabled'); an unknown name is a UsageError."""
    from accuracy.device_backend import get_backend

    backend = get_backend(on)
    if not backend.is_available():
        hint = f" (needs {backend.extension})" if backend.extension else ""
        raise ReplayError(f"backend {backend.name!r} is not available on this machine{hint}; "
                          "`accuracy backends` lists those that are (cpu always is)")


def _open(dump: Dump | str | os.PathLike[str]) -> Dump:
    d = dump if isinstance(dump, Dump) else load_dump(dump)
    try:
        _check_replayable(d)
    except ReplayError:
        if d is not dump:
            d.close()
        raise
    return d


def _check_replayable(d: Dump) -> None:
    src = d.attrs.get(schema.ROOT_REPLAYED_FROM)
    if src:  # its rows are the reference's figures of another dump's ops, not a run
        raise ReplayError(f"{d.path} is a replay of {src} (written by `accuracy replay`), not "
                          f"a dump of a run: replay the dump itself (`accuracy replay {src} "
                          "-o replay.h5`)")
    if d.attrs.get(schema.ROOT_MODE) == "statistics":
        raise ReplayError(
            f"{d.path} was dumped in statistics mode: replay needs the tensor values; dump "
            "again with dumper(..., mode=\"tensor\")")


def _select(d: Dump, ops: str | Iterable[str] | None) -> list[OpRecord]:
    if ops is None:
        return list(d.records)
    pats = [ops] if isinstance(ops, str) else list(ops)
    names = {r.op for r in d.records}
    for p in unmatched_ops(pats, names):  # a misspelt --op would replay nothing
        raise NoMatchError(no_op_message(p, names, str(d.path)))
    return [r for r in d.records if any(op_matches(p, r.op) for p in pats)]


# -- output ----------------------------------------------------------------------------------

def _stats_of(t: TensorRecord) -> Any:
    """The original row's statistics for replay.h5, or None (computed anew) where it has none
    or no bit-pattern sum (a tensor dump: replay.h5 keeps the sums)."""
    s = t.stats
    if s["nan_count"] < 0 or "checksum" not in s:
        return None
    return ([s["min"], s["max"], s["mean"], s["l2"], s["nan_count"], s["inf_count"]],
            int(s["checksum"]))


def _source_stats(t: TensorRecord) -> Any:
    """The device row's statistics for a reference output with its bits, or None (computed
    anew) where it has none; replay.h5 then keeps no sums (`SUMS_ATTR`), as tensor dumps."""
    s = t.stats
    if s["nan_count"] < 0:
        return None
    return [s["min"], s["max"], s["mean"], s["l2"], s["nan_count"], s["inf_count"]], 0


def _held_by(source: Dump | None, t: TensorRecord | None, ref: torch.Tensor) -> bool:
    """Whether reference output `ref`, proven to have the bits of device output `t`, can be
    a row whose bytes are `t`'s in the replayed dump `source` (`schema.IN_SOURCE`): `t` is
    stored there with a content hash, in `ref`'s dtype and size."""
    return (source is not None and t is not None and t.dump is source and t.has_data
            and t.content_hash != NO_HASH and t.dtype == schema.dtype_name(ref.dtype)
            and tuple(t.shape) == tuple(ref.shape)
            and t.nbytes == ref.numel() * ref.element_size())


Links = dict[tuple[Any, int], int]  # `_row_key` or `_content_key`: the replay.h5 row


def _row_key(t: TensorRecord) -> tuple[str, int]:
    """A stored output's bytes by where they are: its file and `first` row (a resumed replay
    reads outputs from an interrupted replay.h5 and from the dump, whose row numbers mean
    different bytes)."""
    return str(t.dump.path), t.first


def _content_key(t: TensorRecord) -> tuple[int, int] | None:
    """What names a device output's bytes by content: its stored content hash and size (the
    proof replay already takes for bit identity, `StoredOutput.same_bits`), or None."""
    return None if t.content_hash == NO_HASH else (t.content_hash, t.nbytes)


def _write(writer: DumpWriter, rec: OpRecord, outcome: OpOutcome,
           links: Links | None = None, source: Dump | None = None,
           hashed: bool = False) -> int:
    """One record of replay.h5: the original's metadata, the reference outputs' bytes.

    A reference output with the device's bits has the bytes of the original's row `first`:
    with `source` (the replayed dump, when replay.h5 lies beside it), the row names them
    there and nothing is written (`schema.IN_SOURCE`); else `links` maps such rows to the
    replay.h5 row already holding them, so they are written once: by the dump's `first`,
    and by content (a `clone`, a weight's `t` again in the backward, a `squeeze`: the same
    bytes the dump stored twice). hashed: replay.h5 keeps
    no bit-pattern sums (its bytes carry content hashes): a bit-exact output takes the
    device row's statistics as they are, the others get theirs without the sum.
    Returns how many outputs name the dump's bytes.
    """
    held = 0
    links = {} if links is None else links
    entries = [TensorEntry(row=writer.new_row(), seq=rec.seq, io=schema.INPUT, idx=t.idx,
                           dtype=t.dtype, shape=t.shape, stride=t.stride, device=t.device,
                           stats=_stats_of(t)) for t in rec.inputs]
    n_out = max(len(rec.outputs), len(outcome.tensors))
    exact = {o["idx"] for o in outcome.outputs if o.get("bit_exact")}
    for i in range(n_out):
        row = writer.new_row()
        ref = outcome.tensors[i] if i < len(outcome.tensors) else None
        if ref is not None:
            # same bits as the device output: its recorded statistics hold, skip a pass
            src = rec.outputs[i] if i in exact and i < len(rec.outputs) else None
            if src is not None and (src.idx != i or src.dtype != schema.dtype_name(ref.dtype)):
                src = None  # compared after a cast, or another output: not these bytes
            if _held_by(source, src, ref):
                assert src is not None
                entries.append(TensorEntry(
                    row=row, seq=rec.seq, io=schema.OUTPUT, idx=i, dtype=src.dtype,
                    shape=src.shape, stride=tuple(ref.stride()), device=str(ref.device),
                    stats=_source_stats(src) or tensor_stats(ref, sums=False),
                    nbytes=src.nbytes, source_hash=src.content_hash))
                held += 1
                continue
            if hashed:
                stats = (_source_stats(src) if src is not None else None) or tensor_stats(
                    ref, sums=False)
            else:
                stats = (_stats_of(src) if src is not None else None) or tensor_stats(ref)
            key = _content_key(src) if src is not None and src.has_data else None
            linked = None
            if src is not None and src.has_data:
                linked = links.get(_row_key(src))
                if linked is None and key is not None:
                    linked = links.get(key)
            entries.append(TensorEntry(
                row=row, seq=rec.seq, io=schema.OUTPUT, idx=i, dtype=schema.dtype_name(ref.dtype),
                shape=tuple(ref.shape), stride=tuple(ref.stride()), device=str(ref.device),
                stats=stats, data=None if linked is not None else ref,
                first=row if linked is None else linked,
                nbytes=ref.numel() * ref.element_size()))
            if src is not None and src.has_data and linked is None:
                links[_row_key(src)] = row
                if key is not None:
                    links[key] = row
        else:
            t = rec.outputs[i]
            entries.append(TensorEntry(row=row, seq=rec.seq, io=schema.OUTPUT, idx=i,
                                       dtype=t.dtype, shape=t.shape, stride=t.stride,
                                       device=t.device, stats=_stats_of(t)))
    extra = dict(rec.extra)
    extra["replay"] = outcome.replay_extra()
    site = CallSite(rec.seq, rec.op, rec.phase, rec.module, rec.source, rec.step)
    writer.add_op(OpEntry(site, stack=rec.stack, args=rec.args_json, n_in=len(rec.inputs),
                          n_out=n_out, extra=extra, epoch=rec.epoch), entries)
    return held


def _copy_finished(writer: DumpWriter, prev: Dump, wanted: set[int], result: ReplayResult,
                   links: Links) -> set[int]:
    """Carry finished ops over from an interrupted replay, reading their stored outputs."""
    done: set[int] = set()
    for rec in prev.records:
        info = rec.extra.get("replay")
        if rec.seq not in wanted or rec.seq in done or not isinstance(info, dict):
            continue
        try:
            tensors = [t.load() if t.has_data else None for t in rec.outputs]
        except DumpError:
            continue
        outcome = OpOutcome(rec.seq, info["status"], info.get("reason", ""),
                            info.get("outputs", []), tensors)
        extra = {k: v for k, v in rec.extra.items() if k != "replay"}
        shell = OpRecord(rec.seq, rec.op, rec.phase, rec.module, rec.source, rec.stack,
                         rec.args_json, rec.step, extra, rec.inputs, rec.outputs, rec.epoch)
        _write(writer, shell, outcome, links)
        _tally(result, outcome.status, outcome.reason)
        done.add(rec.seq)
    return done


# -- workers ---------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(path: str, on: str, upcast: str, threads: int) -> None:
    torch.set_num_threads(threads)
    d = load_dump(path)
    _WORKER.update(dump=d, device=reference_device(on), upcast=upcast,
                   cache=TensorCache(), emulation=Emulation.from_attrs(d.attrs),
                   kernels=references(d.records))


def _work(seqs: list[int]) -> list[OpOutcome]:
    d: Dump = _WORKER["dump"]
    with caching(_WORKER["cache"]), kernel_references(_WORKER["kernels"]):
        return [replay_op(d.record(s), _WORKER["device"], _WORKER["upcast"],
                          emulation=_WORKER["emulation"]) for s in seqs]


# Runs op batches somewhere else (a Dask cluster: accuracy.replay.cluster.DaskReplayRunner):
# gets the dump path, lists of seqs, on, upcast and metrics_only; yields each batch's outcomes
# in batch order.
ReplayRunner = Callable[[str, list[list[int]], str, str, bool], Iterable[list[OpOutcome]]]


def _outcomes(d: Dump, recs: list[OpRecord], on: str, upcast: str, jobs: int,
              runner: ReplayRunner | None = None, metrics_only: bool = False
              ) -> Iterator[OpOutcome]:
    if runner is not None:
        batches = [[r.seq for r in recs[i:i + _BATCH]] for i in range(0, len(recs), _BATCH)]
        for batch in runner(str(d.path), batches, on, upcast, metrics_only):
            yield from batch
        return
    if jobs <= 1:
        device = reference_device(on)
        cache = TensorCache()
        emulation = Emulation.from_attrs(d.attrs)
        with caching(cache), kernel_references(references(d.records)):
            for rec in cache.read_ahead(recs, device, refused=refused_for_sure):
                yield replay_op(rec, device, upcast, keep=not metrics_only,
                                emulation=emulation)
        return
    import multiprocessing as mp

    threads = max(1, torch.get_num_threads() // jobs)
    batches = [[r.seq for r in recs[i:i + _BATCH]] for i in range(0, len(recs), _BATCH)]
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"),
                             initializer=_init_worker,
                             initargs=(str(d.path), on, upcast, threads)) as pool:
        for batch in pool.map(_work, batches):
            yield from batch


# -- entry point -----------------------------------------------------------------------------

def _source_beside(d: Dump, out: Path) -> Dump | None:
    """`d`, when replay.h5 at `out` can name its bytes instead of repeating them: `d` has
    content hashes and is the file a reader finds beside `out` under the name
    `replayed_from` gives (readers look nowhere else); else None (every byte is written)."""
    if d.checksum_kind != CONTENT_HASH_KIND:
        return None
    try:
        return d if os.path.samefile(out.parent / d.path.resolve().name, d.path) else None
    except OSError:
        return None


def _partial_paths(out: Path) -> tuple[Path, Path]:
    return out.with_name(out.name + ".partial"), out.with_name(out.name + ".partial.prev")


def _prepare(out: Path, resume: bool, overwrite: bool) -> list[Path]:
    """Check the output paths; on resume, set aside the interrupted output(s) to copy from."""
    partial, prev = _partial_paths(out)
    writable_folder(out.parent, f"-o {out}: folder")
    if out.exists() and not (overwrite or resume):
        raise OutputExistsError(f"{out} already exists; pass overwrite=True (CLI: --overwrite)")
    if not resume:
        if partial.exists() and not overwrite:
            raise OutputExistsError(
                f"{partial} holds an interrupted replay; pass resume=True (CLI: --resume) to "
                "continue it, or overwrite=True (CLI: --overwrite) to start over")
        for p in (partial, prev):
            p.unlink(missing_ok=True)
        return []
    sources = []
    if partial.exists():
        if prev.exists():  # two interruptions in a row: keep the older one's results too
            older = out.with_name(out.name + ".partial.prev2")
            os.replace(prev, older)
            sources.append(older)
        os.replace(partial, prev)
        sources.append(prev)
    elif prev.exists():
        sources.append(prev)
    if out.exists():
        sources.append(out)
    return sources


def replay(
    dump: Dump | str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    *,
    on: str = "cpu",
    upcast: str = "fp64",
    jobs: int = 1,
    resume: bool = False,
    progress: bool = False,
    overwrite: bool = False,
    ops: str | Iterable[str] | None = None,
    checked: dict[int, OpOutcome] | None = None,
    metrics_only: bool = True,
    runner: ReplayRunner | None = None,
) -> ReplayResult:
    """Replay each recorded op on `on` with the device's own inputs; write `out_path`.

    Each op runs in its own dtype and, unless `upcast="none"`, upcast ("fp64" or "fp32");
    per output, the device's and the same-dtype reference's errors against the upcast one
    and their ratio go in `extra["replay"]` (see docs/replay.md). `checked`: outcomes that
    replace the replay of some ops (seq -> outcome: collectives checked across ranks).
    metrics_only: store only those figures (all that compare reads), the default; False also
    stores the same-dtype reference outputs (CLI: --tensors), writing about as many bytes as
    the dump holds. runner: where op batches run (a Dask cluster); see ReplayRunner.
    """
    import time

    if upcast not in UPCASTS:
        raise ReplayError(f"upcast must be one of {UPCASTS}, not {upcast!r}")
    if jobs < 1:
        raise ReplayError(f"jobs must be at least 1, not {jobs}")
    require_backend(on)
    t0 = time.perf_counter()
    out = Path(out_path)
    own = not isinstance(dump, Dump)
    d = _open(dump)
    try:
        if out.resolve() == d.path.resolve():
            raise ReplayError(f"the output {out} is the dump being replayed")
        recs = _select(d, ops)
        sources = _prepare(out, resume, overwrite)
        partial, _ = _partial_paths(out)
        # replay.h5 of a dump with content hashes keeps none of the sums (as tensor dumps):
        # its stored bytes have hashes, and outputs with the device's bits its statistics
        hashed = not metrics_only and d.checksum_kind == CONTENT_HASH_KIND
        source = _source_beside(d, out) if hashed else None
        attrs = {
            schema.ROOT_MODE: "metrics" if metrics_only else "tensor",
            schema.ROOT_REPLAYED_FROM: str(d.path.resolve()),
            schema.ROOT_REFERENCE: str(reference_device(on)), schema.ROOT_UPCAST: upcast,
            schema.ROOT_TORCH_VERSION: torch.__version__,
            schema.ROOT_ACCURACY_VERSION: accuracy.__version__,
            schema.ROOT_CREATED: _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            schema.ROOT_RANK: d.attrs.get(schema.ROOT_RANK, 0),
            schema.ROOT_WORLD_SIZE: d.attrs.get(schema.ROOT_WORLD_SIZE, 1),
            schema.ROOT_SOURCE_BACKEND: d.attrs.get(schema.ROOT_BACKEND, ""),
            schema.ROOT_SOURCE_PROFILE: d.attrs.get(schema.ROOT_PROFILE, ""),
            schema.ROOT_BACKEND: on,
        }
        if hashed:
            attrs[schema.SUMS_ATTR] = schema.SUMS_OMITTED
        if source is not None:  # rows may be held by the dump: a reader that knows them
            attrs[schema.ROOT_SCHEMA_VERSION] = schema.SOURCE_ROWS_SCHEMA
        writer = DumpWriter(partial, attrs, overwrite=True)
        result = ReplayResult(path=out, on=on, upcast=upcast, dump=d.path.name)
        complete = False
        try:
            done: set[int] = set()
            links: Links = {}
            wanted = {r.seq for r in recs}
            for src in sources:
                try:
                    with load_dump(src) as prev:
                        done |= _copy_finished(writer, prev, wanted - done, result, links)
                except DumpError as e:
                    log.warning("cannot resume from %s: %s", src, e)
            result.resumed = len(done)
            todo = [r for r in recs if r.seq not in done]
            by_seq = {r.seq: r for r in todo}
            bar = tqdm(total=len(recs), initial=len(done), disable=not progress, unit="op",
                       desc="replay")
            with bar:
                for outcome in _outcomes(d, todo, on, upcast, jobs, runner, metrics_only):
                    outcome = (checked or {}).get(outcome.seq, outcome)
                    rec = by_seq[outcome.seq]
                    if metrics_only:
                        outcome.tensors = []  # figures only: no reference tensor is written
                    result.held += _write(writer, rec, outcome, links, source, hashed)
                    _tally(result, outcome.status, outcome.reason)
                    result.bytes_read += sum(t.nbytes for t in rec.inputs + rec.outputs
                                             if t.has_data)
                    bar.update(1)
            complete = True
        finally:
            writer.close({schema.ROOT_OPS_RECORDED: len(recs), schema.ROOT_OPS_OK: result.ok,
                          schema.ROOT_OPS_SKIPPED: result.skipped,
                          schema.ROOT_OPS_FAILED: result.failed},
                         complete=complete)
        os.replace(partial, out)
        for p in sources:
            if p != out:
                p.unlink(missing_ok=True)
    finally:
        if own:
            d.close()
    result.seconds = time.perf_counter() - t0
    log.info("replayed %d ops to %s: %d ok, %d skipped, %d failed (%d resumed) in %.2fs",
             result.total, out, result.ok, result.skipped, result.failed, result.resumed,
             result.seconds)
    return result


def _tally(result: ReplayResult, status: str, reason: str) -> None:
    setattr(result, status, getattr(result, status) + 1)
    if status != OK and reason:
        key = reason.split(":")[0]
        result.reasons[key] = result.reasons.get(key, 0) + 1
