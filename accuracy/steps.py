"""Which steps record: step lists with msprobe's ranges, and torch.profiler's schedule.

Both answer `step in x` for a 0-based step number, so the dumper's step window and the
debugger take either. Imports no torch.
"""

from __future__ import annotations

import bisect
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass

from accuracy.errors import UsageError

NONE, WAIT, WARMUP, ACTIVE = "none", "wait", "warmup", "active"

MAX_ID = 2**63 - 1  # a step or rank is an int64 in a dump: a larger number is none
MAX_ENTRIES = 10_000  # entries of a hand-written list; longer spans are written as ranges
_ENTRY = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")  # "4", "4-6" (ASCII digits)


@dataclass(frozen=True)
class IdRanges:
    """Step or rank numbers as sorted, disjoint, inclusive (first, last) ranges: "0-1000000000"
    stays one pair, never a billion numbers. `n in ids` is a binary search; nothing here
    lists the numbers one by one."""

    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_firsts", [a for a, _ in self.ranges])

    def __contains__(self, n: object) -> bool:
        try:
            n = operator.index(n)  # type: ignore[arg-type]
        except TypeError:
            return False
        i = bisect.bisect_right(self._firsts, n) - 1  # type: ignore[attr-defined]
        return i >= 0 and n <= self.ranges[i][1]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    @property
    def last(self) -> int | None:
        """The largest number, or None when empty."""
        return self.ranges[-1][1] if self.ranges else None

    def describe(self) -> list[int | str]:
        """msprobe's spelling: [0, 2, "4-6"]."""
        return [a if a == b else f"{a}-{b}" for a, b in self.ranges]


def parse_ids(values: Iterable[int | str] | int | str | None,
              what: str = "step") -> IdRanges | None:
    """msprobe's `[0, 2, "4-6"]` -> ranges (0, 0), (2, 2), (4, 6); an empty or missing list ->
    None (all). A `range` with step 1 is one range too.

    Refused, with the entry named: a negative number, an empty or reversed range ("6-4"),
    anything that is not an int or "A-B" in ASCII digits, a number past MAX_ID, more than
    MAX_ENTRIES entries, and entries that overlap (a number given twice, or inside a range
    given too), which in a hand-written list is usually a typo.
    """
    if values is None:
        return None
    if isinstance(values, IdRanges):
        return values or None
    if isinstance(values, (str, int)):
        values = [values]
    if isinstance(values, range) and values.step == 1:
        if not values:
            return None
        values = [f"{values.start}-{values.stop - 1}"]
    entries: list[tuple[int, int, object]] = []
    for v in values:
        if len(entries) >= MAX_ENTRIES:
            raise UsageError(f"{what} list of more than {MAX_ENTRIES} entries: write long "
                             "spans as ranges (\"0-99999\")")
        lo, hi = _entry(v, what)
        entries.append((lo, hi, v))
    if not entries:
        return None
    entries.sort(key=lambda e: (e[0], e[1]))
    merged: list[tuple[int, int]] = []
    prev: object = None
    for lo, hi, v in entries:
        if merged and lo <= merged[-1][1]:
            a, b = max(lo, merged[-1][0]), min(hi, merged[-1][1])
            both = str(a) if a == b else f"{a}-{b}"
            raise UsageError(f"{what} entry {v!r} overlaps another entry ({prev!r}, both "
                             f"hold {both}): give each {what} once")
        if merged and lo == merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
        prev = v
    return IdRanges(tuple(merged))


def _entry(v: object, what: str) -> tuple[int, int]:
    usage = f"{what} entry {v!r}: use a number >= 0 or a range like \"4-6\" (digits 0-9)"
    if isinstance(v, bool):
        raise UsageError(usage)
    if not isinstance(v, str):
        try:
            lo = hi = operator.index(v)  # an int, or numpy's (not a float)
        except TypeError:
            raise UsageError(usage) from None
    else:
        if v.strip().startswith("-"):
            raise UsageError(f"{what} entry {v!r} is negative: {what}s count from 0")
        m = _ENTRY.fullmatch(v)
        if m is None:
            raise UsageError(usage)
        if max(len(m.group(1)), len(m.group(2) or "")) > len(str(MAX_ID)):
            raise UsageError(f"{what} entry {v[:40]!r}...: past the largest {what} "
                             f"({MAX_ID})")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
    if lo < 0:
        raise UsageError(f"{what} entry {v!r} is negative: {what}s count from 0")
    if hi > MAX_ID:
        raise UsageError(f"{what} entry {v!r} is past the largest {what} ({MAX_ID})")
    if hi < lo:
        raise UsageError(f"{what} range {v!r} is empty: write the lower end first "
                         f"(\"{hi}-{lo}\")")
    return lo, hi


@dataclass(frozen=True)
class Schedule:
    """torch.profiler.schedule's cycle: skip `skip_first` steps, then `wait` idle, `warmup`
    idle (nothing to warm up here, kept so a profiler's numbers mean the same steps), `active`
    recorded; `repeat` cycles (0: forever). `step in schedule` is True on active steps."""

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "repeat", "skip_first"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise UsageError(f"schedule {name}={v!r}: use a whole number >= 0")
        if isinstance(self.active, bool) or not isinstance(self.active, int) or self.active < 1:
            raise UsageError(f"schedule active={self.active!r}: use a whole number >= 1 "
                             "(the steps recorded per cycle)")

    def phase(self, step: int) -> str:
        """NONE (skipped or past the last cycle), WAIT, WARMUP or ACTIVE, as the profiler."""
        if step < self.skip_first:
            return NONE
        s = step - self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and s // cycle >= self.repeat:
            return NONE
        m = s % cycle
        if m < self.wait:
            return WAIT
        if m < self.wait + self.warmup:
            return WARMUP
        return ACTIVE

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and step >= 0 and self.phase(step) == ACTIVE

    def last_step(self) -> int | None:
        """The last recorded step, or None when it cycles forever."""
        if self.repeat == 0:
            return None
        return self.skip_first + self.repeat * (self.wait + self.warmup + self.active) - 1

    def describe(self) -> str:
        return (f"schedule(skip_first={self.skip_first}, wait={self.wait}, "
                f"warmup={self.warmup}, active={self.active}, repeat={self.repeat})")


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0,
             skip_first: int = 0) -> Schedule:
    """`accuracy.schedule(wait=1, warmup=1, active=2, repeat=1)`, as torch.profiler.schedule."""
    return Schedule(wait, warmup, active, repeat, skip_first)
