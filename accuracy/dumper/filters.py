"""Which ops and tensors the dumper records: op and module patterns, data_mode, step window."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from accuracy.patterns import module_matches, op_matches

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
    steps: frozenset[int] | None = None

    @classmethod
    def build(
        cls,
        ops: str | Iterable[str] | None = None,
        exclude_ops: str | Iterable[str] | None = None,
        modules: str | Iterable[str] | None = None,
        data_mode: str | Iterable[str] = "all",
        steps: int | Iterable[int] | None = None,
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
        if isinstance(steps, int):
            steps = [steps]
        return cls(
            ops=_as_tuple(ops),
            exclude_ops=_as_tuple(exclude_ops),
            modules=_as_tuple(modules),
            io=io,
            phases=phases,
            steps=frozenset(steps) if steps is not None else None,
        )

    def wants_step(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def wants_op(self, op: str) -> bool:
        if self.ops and not any(op_matches(p, op) for p in self.ops):
            return False
        return not any(op_matches(p, op) for p in self.exclude_ops)

    def wants_module(self, module: str) -> bool:
        return not self.modules or any(module_matches(p, module) for p in self.modules)
