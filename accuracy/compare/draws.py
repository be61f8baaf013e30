"""Random ops whose draws differ between the two runs (dropout on another backend).

An op that draws random numbers (`nondeterministic_seeded`: bernoulli_, native_dropout,
rand...) gives other values on another generator whatever its kernel does. Judged by
amplification, a dropout mask drawn by a GPU and one drawn by a CPU from the same seed is a
"7e6x error": the bernoulli_ was named the culprit of a clean GPT-2 run. Such an op is not
judged; what comes after it differs by the draws, which the summary says first.
"""

from __future__ import annotations

from collections.abc import Iterable

from accuracy.compare.row import JUDGED, Row
from accuracy.compare.row import Verdict as V

DRAWS_DIFFER = "random draws differ"  # a BLIND line, and the row message's opening words


def _differs(r: Row) -> bool:
    """Any difference at all from golden: a metric, a non-finite count, a statistic."""
    if r.accumulated_verdict in (V.WARNING, V.ERROR) or r.nan_mismatch or r.inf_mismatch:
        return True
    if r.max_abs_err is not None:
        return r.max_abs_err != 0
    return any(v for v in (r.max_diff, r.min_diff, r.mean_diff, r.l2norm_diff))


def _discrete(r: Row) -> bool:
    """A mask or an index: its values come from the generator alone."""
    dtype = r.dtype_my or ""
    return "bool" in dtype or "int" in dtype


def judge_random_ops(groups: Iterable[tuple[list[Row], list[Row]]],
                     random_seqs: set[int] | frozenset[int]) -> list[Row]:
    """Unjudge the outputs of random ops whose draws differ; returns those rows.

    The draws differ when an output differs while every input matched golden exactly, or a
    mask (bool or integer output) differs at all. A random op whose inputs already differed
    is capped at a warning: its amplification mixes its inputs' deviation with its draws.
    Outputs judged by a replay (native_dropout against its own recorded mask) keep that.
    """
    marked: list[Row] = []
    for ins, outs in groups:
        mine = [o for o in outs if o.seq_my in random_seqs and o.local_verdict is None
                and o.verdict in JUDGED]
        if not mine or not any(_differs(o) for o in mine):
            continue
        exact_inputs = not any(_differs(r) for r in ins)
        if exact_inputs or any(_discrete(o) and _differs(o) for o in mine):
            for o in mine:
                o.verdict = V.SKIPPED
                o.amplification = None
                o.message = "; ".join(
                    [f"{DRAWS_DIFFER}: the runs drew other random numbers here (another "
                     "generator or seed), not judged"] + [m for m in [o.message] if m])
                marked.append(o)
        else:
            for o in mine:
                if o.verdict == V.ERROR:
                    o.verdict = V.WARNING
                    o.message = "; ".join([m for m in [o.message] if m] + [
                        "a random op: its output follows its draws as well as its inputs, so "
                        "its amplification says nothing of its kernel (at most a warning)"])
    return marked


def unmatched_draws(rows: Iterable[Row], random_seqs: set[int] | frozenset[int]) -> list[Row]:
    """My run's random ops with no golden counterpart, marked as drawing other numbers;
    returns those rows.

    A device draws dropout's mask in one `native_dropout`, CPU in `bernoulli_` and a `mul`:
    the ops do not pair, so no output shows the masks differ, yet everything after them does.
    Unpaired, a random op's draws cannot be the same as golden's (a replay judges it: each op
    on its own recorded inputs, masks included).
    """
    marked = []
    for r in rows:
        if r.kind == "op" and r.io == "output" and r.verdict == V.UNMATCHED \
                and r.golden_address is None and r.seq_my in random_seqs \
                and r.local_verdict is None:
            r.message = "; ".join([f"{DRAWS_DIFFER}: a random op golden does not run here (its "
                                   "draws cannot be golden's)"] + [m for m in [r.message] if m])
            marked.append(r)
    return marked


def cap_consumers(groups: Iterable[tuple[list[Row], list[Row]]], marked: list[Row],
                  producers: dict[int, int | None]) -> None:
    """Ops computed from differently drawn values, without a replay: at most a warning.

    Amplification weighs an op's output deviation against its inputs' small rounding
    deviations. Given whole elements dropped differently it says how ill-conditioned the op
    is, not whether its kernel is wrong: BERT's classifier on two dropped pooled vectors
    "amplified" them and was named the culprit of two clean CPU runs; from statistics a mask
    hardly moves (its mean is 1/(1-p) either way) and `x * mask` "amplified 35.8x". The taint
    follows the data (groups in run order), forward and backward.
    """
    tainted = {r.index for r in marked}
    for ins, outs in groups:
        if not any(producers.get(r.index) in tainted for r in ins):
            continue
        tainted.update(o.index for o in outs)
        for o in outs:
            if o.verdict == V.ERROR and o.local_verdict is None:
                o.verdict = V.WARNING
                o.message = "; ".join([m for m in [o.message] if m] + [
                    "computed from random draws that differ from golden's, whose deviation "
                    "says how far apart the draws are, not how wrong a kernel is (at most a "
                    "warning; compare -r judges its own error)"])


def ops_drawn(marked: list[Row]) -> int:
    """How many random ops drew other numbers (each may have several outputs)."""
    return len({r.seq_my for r in marked})


def draws_line(marked: list[Row], rows: list[Row], replayed: bool) -> str | None:
    """The sentence said first: where the draws first differ and how much of the run follows.

    Without a replay the values after that op differ from golden by the draws, so a kernel
    error smaller than that difference cannot be seen; a replay judges each op on its own
    recorded inputs, masks included.
    """
    if not marked:
        return None
    first = min(marked, key=lambda r: r.seq_my if r.seq_my is not None else 0)
    ops = ops_drawn(marked)
    after = sum(1 for r in rows if r.kind == "op" and r.io == "output"
                and r.seq_my is not None and first.seq_my is not None
                and r.seq_my > first.seq_my and r.verdict in JUDGED and _differs(r))
    where = f"seq {first.seq_my} {first.op} in {first.module or 'the root'}"
    head = (f"{DRAWS_DIFFER}: the runs drew other random numbers at {ops} random op(s) "
            f"(first: {where}); {after} op outputs after it differ from golden")
    if replayed:
        return head + ", judged by their local error (replay)"
    return (head + " by the draws as well as by numerics, so a kernel error smaller than "
            "that cannot be seen: compare runs that draw the same numbers (model.eval() or "
            "dropout p=0), or replay the device dump and compare with -r (each op judged on "
            "its own recorded inputs, masks included)")

