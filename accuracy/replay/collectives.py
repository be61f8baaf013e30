"""Offline check of recorded collectives against all ranks' inputs, and multi-rank replay.

A collective cannot be re-run alone, but with every rank's dump its result is known: an
all-reduce output must be the reduction of the ranks' inputs, an all-gather output their
concatenation, a reduce-scatter output this rank's chunk of the reduction. Checking that
catches a broken communication library, a real class of porting bug. The outcome takes the
place of a replay for that op, so compare judges it like any other op. A point-to-point
receive is checked the same way against the send it pairs with on its peer.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from accuracy.dumpfile import Dump, DumpError, OpRecord, TensorRecord, load_dump
from accuracy.errors import AccuracyError
from accuracy.ranks import find_rank_files, output_path
from accuracy.replay.metrics import (
    bit_equal,
    compare,
    error_ratio,
    exact_metrics,
    unit_roundoff,
)
from accuracy.replay.ops import OK, SKIPPED, OpOutcome

log = logging.getLogger(__name__)

CHECKED_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
_REDUCE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "sum": lambda s: s.sum(0), "avg": lambda s: s.mean(0),
    "max": lambda s: s.amax(0), "min": lambda s: s.amin(0),
}


class Unchecked(AccuracyError, ValueError):
    """This collective's record does not allow the check (say why)."""


def _roles(rec: OpRecord, n: int) -> tuple[list[TensorRecord], list[TensorRecord]]:
    """(the data each rank contributed, the outputs the collective wrote), per op form."""
    base = rec.op.split(".")[1]
    ins, outs = rec.inputs, rec.outputs
    if base in ("allgather_", "allgather_coalesced_"):  # (outputs[k][n], inputs[k])
        k = len(outs) // n
        return ins[len(ins) - k:], outs
    if base in ("_allgather_base_", "_reduce_scatter_base_"):  # (output, input)
        return ins[1:2], outs[:1]
    if base == "reduce_scatter_":  # (outputs[k], inputs[k][n])
        k = len(outs)
        return ins[k:], outs
    if base in ("all_gather_into_tensor", "all_gather_into_tensor_out", "reduce_scatter_tensor",
                "reduce_scatter_tensor_out"):
        return ins[:1], outs[:1]
    return ins[:len(outs)], outs  # all-reduce forms: the inputs are reduced in place or copied


def _expected(kind: str, op: str, base: str, contributions: list[list[torch.Tensor]],
              pos: int, n: int, n_out: int) -> list[torch.Tensor]:
    """What each output of the rank at group position `pos` must hold (in float64 where a
    reduction is involved, exact otherwise). contributions[j] = group rank j's inputs."""
    if kind == "all_gather":
        if base in ("allgather_", "allgather_coalesced_"):
            k = n_out // n
            return [contributions[j][i] for i in range(k) for j in range(n)]
        return [torch.cat([c[0] for c in contributions], 0)]
    reduce = _REDUCE.get(op)
    if reduce is None:
        raise Unchecked(f"reduce op {op!r} is not checked")

    def red(ts: list[torch.Tensor]) -> torch.Tensor:
        return reduce(torch.stack([t.to(torch.float64) for t in ts]))

    if kind == "all_reduce":
        return [red([c[i] for c in contributions]) for i in range(n_out)]
    if base == "reduce_scatter_":  # rank pos gets input list item pos of every rank, reduced
        return [red([c[i * n + pos] for c in contributions]) for i in range(n_out)]
    return [red([c[0].chunk(n, 0)[pos] for c in contributions])]


def _metrics(idx: int, device: torch.Tensor, want: torch.Tensor, n: int) -> dict[str, Any]:
    if want.dtype != torch.float64 or not (device.is_floating_point() or device.is_complex()):
        return exact_metrics(idx, device, want.to(device.dtype))
    same = want.to(device.dtype)  # the honest result in the dtype: one rounding
    e_dev, mx, cos = compare(device, want)
    e_ref = compare(same, want)[0]
    # n contributions summed in any order: up to n - 1 roundings per element
    floor = max(n - 1, 1) * unit_roundoff(device.dtype)
    return {"idx": idx, "err_device": e_dev, "err_reference": e_ref,
            "error_ratio": error_ratio(e_dev, e_ref, floor), "max_abs": mx, "cosine": cos,
            "bit_exact": bit_equal(device, same)}  # bits: -0.0 and NaN payloads count


def _check_one(kind: str, recs: dict[int, OpRecord], group: list[int]
               ) -> dict[int, OpOutcome]:
    n = len(group)
    first = recs[group[0]]
    note = first.extra["collective"]
    base = first.op.split(".")[1]
    contributions = []
    for r in group:
        ins, _ = _roles(recs[r], n)
        if not all(t.has_data for t in ins):
            raise Unchecked(f"rank {r}'s inputs are not in its dump (statistics mode or filtered)")
        contributions.append([t.load() for t in ins])
    out: dict[int, OpOutcome] = {}
    for pos, r in enumerate(group):
        rec = recs[r]
        _, outs = _roles(rec, n)
        want = _expected(kind, note.get("reduce_op", "sum"), base, contributions, pos, n,
                         len(outs))
        metrics, tensors = [], []
        for t, w in zip(outs, want, strict=True):
            if not t.has_data:
                raise Unchecked(f"rank {r}'s output {t.idx} is not in its dump")
            dev = t.load()
            if dev.numel() != w.numel():
                raise Unchecked(f"rank {r}'s output {t.idx} has {dev.numel()} elements, the "
                                f"other ranks' inputs make {w.numel()}")
            w = w.reshape(dev.shape)
            metrics.append(_metrics(t.idx, dev, w, n))
            tensors.append(w.to(dev.dtype))
        # replay.h5 lists outputs by position: put each at its recorded index
        by_idx: list[torch.Tensor | None] = [None] * (max((t.idx for t in rec.outputs),
                                                          default=-1) + 1)
        for t, ref in zip(outs, tensors, strict=True):
            by_idx[t.idx] = ref
        reason = (f"collective: {kind} checked against the inputs of ranks {group} (no "
                  "re-run: it needs every rank)")
        out[r] = OpOutcome(rec.seq, OK, reason, metrics, by_idx)
    return out


def check_collectives(dumps: dict[int, Dump]) -> dict[int, dict[int, OpOutcome]]:
    """rank -> seq -> outcome, for each all-reduce / all-gather / reduce-scatter recorded by
    every rank of its group. Collectives lines up across ranks by (group, index in group)."""
    index: dict[tuple[str, int], dict[int, OpRecord]] = {}
    for rank, d in dumps.items():
        for rec in d.records:
            note = rec.extra.get("collective")
            if not isinstance(note, dict) or note.get("kind") not in CHECKED_KINDS:
                continue
            if note.get("group") is None or note.get("group_index") is None:
                continue
            index.setdefault((note["group"], int(note["group_index"])), {})[rank] = rec
    result: dict[int, dict[int, OpOutcome]] = {r: {} for r in dumps}
    for (group_name, i), recs in sorted(index.items()):
        any_rec = next(iter(recs.values()))
        note = any_rec.extra["collective"]
        group = [int(r) for r in note.get("group_ranks") or []]
        missing = [r for r in group if r not in recs]
        ops = {recs[r].op for r in recs}
        try:
            if not group or missing:
                raise Unchecked(f"ranks {missing or '?'} of group {group_name} not given or "
                                "not recorded")
            if len(ops) > 1:
                raise Unchecked(f"ranks disagree on collective #{i} of group {group_name}: "
                                f"{sorted(ops)}: do the dumps come from one run?")
            outcomes = _check_one(note["kind"], recs, group)
        except (Unchecked, DumpError, RuntimeError, ValueError, IndexError) as e:
            reason = f"collective: not checked ({e})"
            outcomes = {r: OpOutcome(rec.seq, SKIPPED, reason) for r, rec in recs.items()}
        for r, o in outcomes.items():
            result[r][o.seq] = o
    return result


P2P_KINDS = ("send", "recv")


def _p2p_key(note: dict[str, Any]) -> tuple[str, int, int, int, int]:
    return (str(note.get("group", "")), int(note["src"]), int(note["dst"]), int(note["tag"]),
            int(note["p2p_index"]))


def _check_pair(send: OpRecord, recv: OpRecord) -> OpOutcome:
    """What a receive holds against what its peer sent: bit for bit."""
    if len(send.inputs) != len(recv.outputs):
        raise Unchecked(f"the send has {len(send.inputs)} tensors, the receive "
                        f"{len(recv.outputs)}")
    metrics, refs = [], []
    for sent, got in zip(send.inputs, recv.outputs, strict=True):
        if not (sent.has_data and got.has_data):
            raise Unchecked("the sent or received data is not in the dump (statistics mode, "
                            "filtered, uninitialised, or still pending at close)")
        want, dev = sent.load(), got.load()
        if want.dtype != dev.dtype or want.numel() != dev.numel():
            raise Unchecked(f"sent {want.dtype} x {want.numel()}, received {dev.dtype} x "
                            f"{dev.numel()}")
        want = want.reshape(dev.shape)
        metrics.append(exact_metrics(got.idx, dev, want))
        refs.append(want)
    by_idx: list[torch.Tensor | None] = [None] * (max((t.idx for t in recv.outputs),
                                                      default=-1) + 1)
    for t, ref in zip(recv.outputs, refs, strict=True):
        by_idx[t.idx] = ref
    reason = (f"collective: receive checked against the send of rank "
              f"{recv.extra['collective'].get('src')} (no re-run: it needs the peer)")
    return OpOutcome(recv.seq, OK, reason, metrics, by_idx)


def check_p2p(dumps: dict[int, Dump]) -> tuple[dict[int, dict[int, OpOutcome]], int]:
    """rank -> seq -> outcome for each point-to-point receive, checked against the send it
    pairs with (same group, source, destination, tag and `p2p_index`: gloo delivers a
    pair's messages of one tag in order); and how many recorded sends no receive took."""
    sends: dict[tuple, OpRecord] = {}
    recvs: dict[tuple, tuple[int, OpRecord]] = {}
    for rank, d in dumps.items():
        for rec in d.records:
            note = rec.extra.get("collective")
            if not isinstance(note, dict) or note.get("kind") not in P2P_KINDS:
                continue
            try:
                key = _p2p_key(note)
            except (KeyError, TypeError, ValueError):
                continue  # a note without its pairing: counted below as unpaired
            if note["kind"] == "send":
                sends[key] = rec
            else:
                recvs[key] = (rank, rec)
    result: dict[int, dict[int, OpOutcome]] = {r: {} for r in dumps}
    for key, (rank, rec) in sorted(recvs.items()):
        send = sends.pop(key, None)
        try:
            if send is None:
                raise Unchecked(f"no send #{key[4]} from rank {key[1]} with tag {key[3]} in "
                                "the dumps given")
            outcome = _check_pair(send, rec)
        except (Unchecked, DumpError, RuntimeError, ValueError, IndexError) as e:
            outcome = OpOutcome(rec.seq, SKIPPED, f"collective: not checked ({e})")
        result[rank][rec.seq] = outcome
    return result, len(sends)


def summarise(checked: dict[int, dict[int, OpOutcome]], threshold: float = 10.0
              ) -> dict[str, int]:
    """Counts for the CLI: collectives checked, skipped, and outputs beyond `threshold`."""
    counts = {"checked": 0, "unchecked": 0, "mismatched": 0}
    for per_rank in checked.values():
        for o in per_rank.values():
            if o.status != OK:
                counts["unchecked"] += 1
                continue
            counts["checked"] += 1
            if any(not (m.get("error_ratio", 0) <= threshold) or math.isnan(m["error_ratio"])
                   for m in o.outputs):
                counts["mismatched"] += 1
    return counts


class RanksReplay(NamedTuple):
    """Every rank's ReplayResult and the collective counts (unpacks as a pair)."""

    results: dict[int, Any]
    counts: dict[str, int]

    def format(self) -> str:
        from accuracy.replay.engine import format_reasons

        lines = []
        for rank, r in sorted(self.results.items()):
            lines.append(f"rank {rank}: replayed {r.total} ops in {r.seconds:.2f}s: {r.ok} ok, "
                         f"{r.skipped} skipped, {r.failed} failed -> {r.path}")
            lines += format_reasons(r.reasons)
        c = self.counts
        lines.append(f"collectives checked against all ranks' inputs: {c['checked']} "
                     f"({c['mismatched']} mismatched), not checkable: {c['unchecked']}")
        if c.get("p2p_checked") or c.get("p2p_unchecked") or c.get("p2p_unpaired_sends"):
            lines.append(f"point-to-point receives checked against their sends: "
                         f"{c['p2p_checked']} ({c['p2p_mismatched']} mismatched), not "
                         f"checkable: {c['p2p_unchecked']}, sends no receive took: "
                         f"{c['p2p_unpaired_sends']}")
        return "\n".join(lines)


def replay_ranks(spec: str | os.PathLike[str], out_spec: str | os.PathLike[str],
                 **kw: Any) -> RanksReplay:
    """Replay every rank's dump named by `spec` (a `{rank}` pattern or a folder) into
    `out_spec`, with the collectives checked across ranks. Returns (rank -> ReplayResult,
    collective counts)."""
    from accuracy.replay.engine import replay

    files = find_rank_files(spec)
    dumps = {r: load_dump(p) for r, p in files.files.items()}
    try:
        checked = check_collectives(dumps)
        pairs, unpaired = check_p2p(dumps)
        outcomes = {r: {**checked[r], **pairs[r]} for r in dumps}
        results = {r: replay(dumps[r], output_path(out_spec, r), checked=outcomes[r], **kw)
                   for r in files.ranks}
    finally:
        for d in dumps.values():
            d.close()
    counts = summarise(checked)
    counts.update({f"p2p_{k}": v for k, v in summarise(pairs).items()},
                  p2p_unpaired_sends=unpaired)
    return RanksReplay(results, counts)
