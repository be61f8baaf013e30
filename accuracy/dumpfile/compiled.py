"""What a dump says about what it could not see: compiled regions (root attributes
`compiled_watch` and `compiled_regions`, written by accuracy/dumper/compiled/watch.py), tensor
subclasses it cannot see into (`tensor_subclasses`, dumper/subclass_watch.py), point-to-point
receives still pending at close (`receives_pending`, dumper/p2p.py) and ops the
dumper failed on (`ops_not_recorded`, dumper/core.py), as sentences
every reader shows first: `accuracy info`, compare's summary, the report files and the web UI."""

from __future__ import annotations

from typing import Any

from accuracy.dumpfile import schema

RECORDED = "recorded-compiled"
HOP_NOT_RECORDED = "higher-order op"  # a HOP run without its ops seen (accuracy/hops.py)
NOT_RECORDED = "ran but were not recorded"  # ops the dumper failed on (`ops_not_recorded`)


def regions(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The compiled regions a dump's block entered (empty for an eager job or an old dump)."""
    rs = attrs.get(schema.ROOT_COMPILED_REGIONS)
    return [r for r in rs if isinstance(r, dict)] if isinstance(rs, list) else []


def blind_lines(attrs: dict[str, Any], side: str = "") -> list[str]:
    """One sentence per compiled region the dump did not record as compiled, and one if the
    dumper could not watch for compiled regions at all; empty when nothing is unseen."""
    who = f"{side} dump: " if side else ""
    out = []
    watch = attrs.get(schema.ROOT_COMPILED_WATCH)
    if isinstance(watch, str) and watch != "on":
        out.append(f"{who}compiled regions were not watched ({watch}): a torch.compile'd "
                   "region in the block may have gone unseen")
    for r in regions(attrs):
        if r.get("status") == RECORDED:
            continue
        steps = r.get("steps") or []
        out.append(f"{who}compiled region {r.get('name')!s} [backend {r.get('backend')!s}, "
                   f"{r.get('calls')} call(s), step(s) {steps}] {r.get('status')}: "
                   f"{r.get('reason')}")
    unhooked = attrs.get(schema.ROOT_COMPILED_KERNELS_NOT_RECORDED)
    if isinstance(unhooked, dict):
        names = ", ".join(str(k) for k in unhooked.get("kernels") or [])
        out.append(f"{who}{unhooked.get('count')!s} compiled kernel launch site(s) were "
                   f"generated without a recording hook ({names}): {unhooked.get('why')!s}; "
                   "their writes are not in the dump")
    failed = attrs.get(schema.ROOT_OPS_NOT_RECORDED)
    if isinstance(failed, dict):
        out.append(f"{who}{failed.get('count')!s} op(s) {NOT_RECORDED}: the dumper "
                   f"failed on them (first: {failed.get('first')!s}); their values are not in "
                   "the dump")
    pending = attrs.get(schema.ROOT_RECEIVES_PENDING)
    if isinstance(pending, list) and pending:
        which = ", ".join(f"seq {p.get('seq')!s} from rank {p.get('peer')!s} tag "
                          f"{p.get('tag')!s}" for p in pending[:8] if isinstance(p, dict))
        out.append(f"{who}{len(pending)} point-to-point receive(s) had not arrived when the "
                   f"dump closed ({which}{', ...' if len(pending) > 8 else ''}): what they "
                   "received is not in the dump")
    out += [f"{who}{n!s} call(s) of {HOP_NOT_RECORDED} {name!s} ran without the ops inside "
            "them recorded (no eager implementation the dumper can run inside); their values "
            "are not in the dump" for name, n in _counts(attrs, "higher_order_ops_not_recorded")]
    out += [f"{who}{ops} op(s) took tensor subclass {name!s} (a __torch_dispatch__ wrapper): "
            "recorded as its raw inner data, without what the wrapper means (scales, layout); "
            "those values were not seen as what they are"
            for name, ops in _counts(attrs, "tensor_subclasses")]
    return out


def _counts(attrs: dict[str, Any], key: str) -> list[tuple[Any, Any]]:
    """(name, count) of a root attribute counting ops by name, sorted; [] when absent."""
    got = attrs.get(key)
    return sorted(got.items()) if isinstance(got, dict) else []


def seen_lines(attrs: dict[str, Any]) -> list[str]:
    """One line per compiled region the dump recorded as compiled (what `info` says beside
    the regions it did not see)."""
    kernels = attrs.get(schema.ROOT_COMPILED_KERNELS_RECORDED)
    out = [f"compiled region {r.get('name')!s} [backend {r.get('backend')!s}, "
           f"{r.get('calls')} call(s)] recorded as compiled"
           + (f" ({kernels} kernel launch(es) recorded in the dump)" if kernels else "")
           for r in regions(attrs) if r.get("status") == RECORDED]
    rng = attrs.get(schema.ROOT_COMPILED_RANDOM)
    if rng == "eager":
        out.append("compiled kernels drew random numbers with eager's generator (Inductor's "
                   "fallback_random): dropout masks are an eager run's with the same seed")
    elif rng == "inductor":
        out.append("compiled kernels drew random numbers with Inductor's own generator: "
                   "values after a dropout cannot match an eager run's")
    return out


def blind_count(attrs: dict[str, Any]) -> int:
    """Compiled regions not recorded as compiled (plus one if they were not watched)."""
    watch = attrs.get(schema.ROOT_COMPILED_WATCH)
    return (sum(1 for r in regions(attrs) if r.get("status") != RECORDED)
            + (1 if isinstance(watch, str) and watch != "on" else 0)
            + (1 if isinstance(attrs.get(schema.ROOT_OPS_NOT_RECORDED), dict) else 0)
            + (1 if isinstance(attrs.get(schema.ROOT_HOPS_NOT_RECORDED), dict) else 0)
            + (1 if isinstance(attrs.get(schema.ROOT_COMPILED_KERNELS_NOT_RECORDED), dict) else 0)
            + (1 if attrs.get(schema.ROOT_RECEIVES_PENDING) else 0))


def recompile_lines(attrs: dict[str, Any], side: str = "") -> list[str]:
    """One sentence per recompilation inside the recorded block: which region, which frame,
    at which step, and dynamo's guard-failure reason (the dump holds both programs' values)."""
    who = f"{side} dump: " if side else ""
    out = []
    for r in regions(attrs):
        recs = r.get("recompiles")
        for e in recs if isinstance(recs, list) else []:
            if isinstance(e, dict):
                out.append(f"{who}compiled region {r.get('name')!s} was recompiled at step "
                           f"{e.get('step')!s} (before seq {e.get('seq')!s}), frame "
                           f"{e.get('frame')!s}: {e.get('reason')!s}")
    return out
