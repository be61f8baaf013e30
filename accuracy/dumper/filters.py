"""Which ops and tensors the dumper records: op and module patterns, data_mode, step window."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from accuracy.dumpfile.schema import SELECTION_FORMAT
from accuracy.patterns import module_matches, op_matches
from accuracy.steps import IdRanges, Schedule, parse_ids

log = logging.getLogger(__name__)

MAX_SELECTED = 1_000_000
_IO_WORDS = {"input", "output"}
_PHASE_WORDS = {"forward", "backward", "optimizer"}


def _as_tuple(x: str | Iterable[str] | None) -> tuple[str, ...]:
    if x is None:
        return ()
    if isinstance(x, str):
        return (x,)
    return tuple(x)


@dataclass(frozen=True)
class Filter:
    """What to record. Empty include lists mean "everything"."""

    ops: tuple[str, ...] = ()
    exclude_ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    io: frozenset[str] = frozenset(_IO_WORDS)
    phases: frozenset[str] = frozenset(_PHASE_WORDS)
    steps: IdRanges | Schedule | None = None

    @classmethod
    def build(
        cls,
        ops: str | Iterable[str] | None = None,
        exclude_ops: str | Iterable[str] | None = None,
        modules: str | Iterable[str] | None = None,
        data_mode: str | Iterable[str] = "all",
        steps: int | Iterable[int | str] | Schedule | None = None,
    ) -> Filter:
        words = set(_as_tuple(data_mode)) - {"all"}
        unknown = words - _IO_WORDS - _PHASE_WORDS
        if unknown:
            raise ValueError(
                f"unknown data_mode {sorted(unknown)}; use 'all' or any of "
                f"{sorted(_IO_WORDS | _PHASE_WORDS)}"
            )
        io = frozenset(words & _IO_WORDS) or frozenset(_IO_WORDS)
        phases = frozenset(words & _PHASE_WORDS) or frozenset(_PHASE_WORDS)
        if steps is not None and not isinstance(steps, Schedule):
            # msprobe's lists ("4-6" kept a range, never expanded); an empty list: no step
            steps = parse_ids(steps, "steps") or IdRanges(())
        return cls(
            ops=_as_tuple(ops),
            exclude_ops=_as_tuple(exclude_ops),
            modules=_as_tuple(modules),
            io=io,
            phases=phases,
            steps=steps,
        )

    def wants_step(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def wants_op(self, op: str) -> bool:
        if self.ops and not any(op_matches(p, op) for p in self.ops):
            return False
        return not any(op_matches(p, op) for p in self.exclude_ops)

    def wants_module(self, module: str) -> bool:
        return not self.modules or any(module_matches(p, module) for p in self.modules)


class SuspectSelection:
    """The ops a two-tier second run records: seq -> op names, from `accuracy suspects`.

    Seq numbers count every op the dumper sees, recorded or not, so the same script records
    its suspects under their first-run seqs and the second comparison lines up with the first.
    An op that is not the one named at its seq means the run took another path: it is not
    recorded, and a warning says so once.
    """

    def __init__(self, ops: dict[int, frozenset[str]], source: str = "") -> None:
        self.ops = ops
        self.source = source
        self._warned = False

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SuspectSelection:
        """Read a selection file written by `accuracy suspects` (JSON)."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as e:
            raise FileNotFoundError(f"select file {p}: {e.strerror or e}; write one with "
                                    "`accuracy suspects REPORT -o suspects.json`") from None
        except ValueError as e:
            raise ValueError(f"select file {p}: not JSON ({e})") from None
        if not isinstance(data, dict) or data.get("format") != SELECTION_FORMAT:
            raise ValueError(f"select file {p}: not a selection written by `accuracy suspects`")
        ops: dict[int, set[str]] = {}
        try:
            for side in ("my", "golden"):
                for item in data.get(side, []):
                    ops.setdefault(int(item["seq"]), set()).add(str(item["op"]))
        except (TypeError, KeyError, ValueError) as e:
            raise ValueError(f"select file {p}: malformed op entry ({e!r})") from None
        if len(ops) > MAX_SELECTED:
            raise ValueError(f"select file {p}: {len(ops)} ops, more than {MAX_SELECTED}")
        return cls({s: frozenset(v) for s, v in ops.items()}, str(p))

    def wants(self, seq: int, op: str) -> bool:
        names = self.ops.get(seq)
        if names is None:
            return False
        if op in names:
            return True
        if not self._warned:
            self._warned = True
            log.warning("select %s: seq %d is %s in this run, not %s: the run differs from "
                        "the one the suspects came from, so its selection may not line up",
                        self.source, seq, op, "/".join(sorted(names)))
        return False
