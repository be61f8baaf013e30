"""Which steps record: step lists with msprobe's ranges, and torch.profiler's schedule.

Both answer `step in x` for a 0-based step number, so the dumper's step window and the
debugger take either. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from accuracy.errors import UsageError

NONE, WAIT, WARMUP, ACTIVE = "none", "wait", "warmup", "active"


def parse_ids(values: Iterable[int | str] | None, what: str = "step") -> frozenset[int] | None:
    """msprobe's `[0, 2, "4-6"]` -> {0, 2, 4, 5, 6}; an empty or missing list -> None (all).

    Refused, with the entry named: a negative number, an empty or reversed range ("6-4"),
    anything that is not an int or "A-B", and entries that overlap (a number given twice, or
    inside a range given too), which in a hand-written list is usually a typo.
    """
    if values is None:
        return None
    if isinstance(values, (str, int)):
        values = [values]
    out: set[int] = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise UsageError(f"{what} entry {v!r}: use a number >= 0 or a range like \"4-6\"")
        if isinstance(v, int):
            lo = hi = v
        else:
            if v.strip().startswith("-"):
                raise UsageError(f"{what} entry {v!r} is negative: {what}s count from 0")
            a, sep, b = v.strip().partition("-")
            if not (a.strip().isdigit() and (not sep or b.strip().isdigit())):
                raise UsageError(f"{what} entry {v!r}: use a number >= 0 or a range like "
                                 "\"4-6\"")
            lo = int(a)
            hi = int(b) if sep else lo
        if lo < 0:
            raise UsageError(f"{what} entry {v!r} is negative: {what}s count from 0")
        if hi < lo:
            raise UsageError(f"{what} range {v!r} is empty: write the lower end first "
                             f"(\"{hi}-{lo}\")")
        new = set(range(lo, hi + 1))
        if new & out:
            raise UsageError(f"{what} entry {v!r} overlaps another entry "
                             f"({sorted(new & out)[:5]}): give each {what} once")
        out |= new
    return frozenset(out) if out else None


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
