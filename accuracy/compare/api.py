"""`compare()`: align two dumps, score every tensor pair, judge, and build the Report.

The steps live beside it: which pairs (`pairs`), measuring them in batches (`batches`),
one row per pair (`build_rows`), then the verdicts over all rows (`judge`, `quant`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from accuracy.compare import verdict as V
from accuracy.compare.align import Mapping, load_mapping
from accuracy.compare.batches import BatchRunner, run_metrics
from accuracy.compare.build_rows import apply_compiled, arguments_differ, build_row, moved_from
from accuracy.compare.checks import (
    check_not_replay,
    check_pairing,
    check_replay,
    check_same_model,
    check_swapped,
    incomplete,
    loss_scales_differ,
    own_random,
)
from accuracy.compare.compiled_align import is_kernel
from accuracy.compare.emulation import unemulated_note
from accuracy.compare.judge import judge
from accuracy.compare.metrics import resolve_algorithms
from accuracy.compare.pairs import needs_data, pair_specs, producers, tensor_key
from accuracy.compare.precision import ComputePrecision
from accuracy.compare.quant import judge_quant
from accuracy.compare.report import Report, analyse
from accuracy.dumpfile import Dump, load_dump
from accuracy.dumpfile.compiled import blind_lines, recompile_lines

log = logging.getLogger(__name__)

DumpLike = str | os.PathLike[str] | Dump


def _open(d: DumpLike | None, owned: list[Dump]) -> Dump | None:
    if d is None or isinstance(d, Dump):
        return d
    dump = load_dump(d)
    owned.append(dump)
    return dump


def _replay_index(replay: Dump | None) -> dict[int, dict[str, Any]]:
    if replay is None:
        return {}
    return {r.seq: r.extra["replay"] for r in replay.records
            if isinstance(r.extra.get("replay"), dict)}


def _first_reason(text: str) -> str:
    """A replay reason's first clause, without the prefixes every kernel's reason shares."""
    text = text.removeprefix("compiled kernel with no output to replay: ").split("; ")[0]
    text = re.sub(r"^output \d+ not replayed: ", "", text)
    return text[:100]


def _kernel_replay(my: Dump, replay: Dump | None,
                   rp: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """With a replay: how many compiled kernel launches of my run it judged (status ok: at
    least one output re-run and measured) and why the others were not, by reason. A kernel
    replay left unjudged gets no local verdict: the count is said, never a silent PASS."""
    if replay is None:
        return None
    kernels = [r for r in my.records if is_kernel(r)]
    if not kernels:
        return None
    why: dict[str, int] = {}
    judged = 0
    for r in kernels:
        got = rp.get(r.seq)
        if got is not None and got.get("status") == "ok":
            judged += 1
            continue
        reason = "not in the replay" if got is None else (
            f"{got.get('status')}: {_first_reason(str(got.get('reason') or ''))}")
        why[reason] = why.get(reason, 0) + 1
    return {"kernels": len(kernels), "judged": judged,
            "reasons": dict(sorted(why.items(), key=lambda kv: -kv[1])[:5])}


def compare(my: DumpLike, golden: DumpLike, replay: DumpLike | None = None, *,
            config: str | os.PathLike[str] | dict | None = None,
            algorithms: list[str] | tuple[str, ...] | str | None = None,
            mapping: str | os.PathLike[str] | dict | Mapping | None = None, jobs: int = 1,
            progress: bool = False, runner: BatchRunner | None = None) -> Report:
    """Align `my` with `golden`, compute metrics for every tensor pair, judge, find the culprit.

    my/golden/replay: dump paths or opened Dumps. Returns a Report (rows, summary).
    runner: where the pair batches run (default: here, or `jobs` processes); see BatchRunner.
    """
    t0 = time.perf_counter()
    cfg = V.load_config(config)
    algs = resolve_algorithms(algorithms)
    mp = load_mapping(mapping)
    owned: list[Dump] = []
    prepare = getattr(runner, "prepare", None)
    if prepare is not None:  # a cluster's workers open the dumps while this process aligns
        prepare([str(d.path if isinstance(d, Dump) else d) for d in (my, golden)])
    try:
        dm, dg = _open(my, owned), _open(golden, owned)
        dr = _open(replay, owned)
        assert dm is not None and dg is not None
        check_not_replay(dm, "-m")
        check_not_replay(dg, "-g")
        if dr is not None:
            check_replay(dm, dr)
        check_swapped(dm, dg)
        refusals = [m for m in (incomplete(dm, "my"), incomplete(dg, "golden"),
                                own_random(dm, "my"), own_random(dg, "golden"),
                                loss_scales_differ(dm, dg)) if m]
        for m in refusals:  # the report carries them (summary refusals, the terminal's
            log.info("%s", m)  # WARNING lines): at warning level the CLI printed them twice
        blind = blind_lines(dm.attrs, "my") + blind_lines(dg.attrs, "golden")
        for m in blind:  # the report carries them first (summary, terminal, html)
            log.info("%s", m)
        specs = pair_specs(dm, dg, mp)
        check_same_model(dm, dg, specs, mp.module)
        check_pairing(dm, dg, specs)
        dumps = {str(dm.path): dm, str(dg.path): dg}
        rp = _replay_index(dr)
        precision = ComputePrecision.from_sources(cfg, dm.attrs)
        results, nbytes = run_metrics(specs, dumps, algs, max(1, int(jobs)), progress,
                                      runner)
        # what needs no metrics is done while a runner's first tasks run
        made_by = producers(specs)
        quant = {r.seq: r for r in dm.records if r.extra.get("quant")}
        recompiles = recompile_lines(dm.attrs, "my") + recompile_lines(dg.attrs, "golden")
        kernel_replay = _kernel_replay(dm, dr, rp)
        notes = [n for n in (unemulated_note(dm.attrs, (r.op for r in dm.records)),) if n]
        rows = []
        computed: dict[tuple, str] = {}  # tensor -> the compute precision that made it
        try:
            for i, s in enumerate(specs):
                res = (results.get((tensor_key(s.my), tensor_key(s.golden)))
                       if needs_data(s) else None)
                rows.append(build_row(i, s, res, cfg, rp, precision, moved_from(s, computed)))
                apply_compiled(rows[-1], s)
                if rows[-1].compute_precision and s.io == "output" and s.my is not None:
                    computed[s.my.values_key] = rows[-1].compute_precision
            results.close()
        finally:
            results.abort()
        drawn = judge(rows, made_by, cfg, {r.seq for r in dm.records if r.extra.get("rng")})
        judge_quant(rows, quant, cfg)
        arguments_differ(rows, specs)
        seconds = time.perf_counter() - t0
        meta = {
            "my": str(dm.path), "golden": str(dg.path),
            "rank": dm.attrs.get("rank"), "world_size": dm.attrs.get("world_size"),
            "replay": str(dr.path) if dr is not None else None,
            "my_attrs": {k: dm.attrs.get(k) for k in ("backend", "profile", "mode",
                                                      "faults_applied", "complete")},
            "golden_attrs": {k: dg.attrs.get(k) for k in ("backend", "profile", "mode",
                                                          "complete")},
            "ops_my": len(dm.records), "ops_golden": len(dg.records),
            "algorithms": list(algs), "bytes_compared": nbytes, "seconds": seconds,
            "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else None, "jobs": jobs,
            "refusals": refusals,
            "blind": blind,
            "recompiles": recompiles,
            "kernel_replay": kernel_replay,
            "notes": notes,
            "random_draws": drawn,
        }
        log.info("compared %d rows, %.1f MB in %.2f s", len(rows), nbytes / 1e6, seconds)
        return Report(rows, analyse(rows, cfg, meta))
    finally:
        for d in owned:
            d.close()
