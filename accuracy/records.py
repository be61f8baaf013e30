"""The records every part shares: where a call ran (`CallSite`), and an overflow finding.

Torch-free and importing nothing of the package, so the dumper, the dump reader, compare,
replay, overflow and the server can all speak of one call with the same fields: a row of the
dump, a live call, a compiled kernel's launch, an overflow birth found online or offline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class CallSite:
    """Where one call ran: its number in the recorded block (`seq`), the op or kernel name,
    the phase (forward | backward | optimizer), the module (fully qualified, as eager rows
    name it), the user's source line (`file:line`, '' when unknown), the step and the rank."""

    seq: int
    op: str
    phase: str
    module: str
    source: str
    step: int = 0
    rank: int = 0


# the fields of CallSite that records written by the dumper carry per row (rank is a root
# attribute of the dump, one per file)
SITE_FIELDS = ("seq", "op", "phase", "module", "source", "step")


class SiteFields:
    """A record holding a `site` reads its call-site fields as its own (`rec.seq`,
    `rec.module`...), so records that carry a CallSite spell them one way."""

    __slots__ = ()
    site: CallSite

    @property
    def seq(self) -> int:
        return self.site.seq

    @property
    def phase(self) -> str:
        return self.site.phase

    @property
    def module(self) -> str:
        return self.site.module

    @property
    def source(self) -> str:
        return self.site.source

    @property
    def step(self) -> int:
        return self.site.step


@dataclass
class OverflowFinding(SiteFields):
    """One op where non-finite (or saturated) values were born, or an op the offline scan
    lists (inherited, GradScaler's own, intended masks, contained births).

    Written by the dumper's online check (`check_overflow=True`, as the dump's `overflow`
    root attribute) and built by the offline scan (`accuracy overflow`) from the dump's rows:
    one record, so both say the same fields. `kind`: "overflow" | "saturation"; `outputs`:
    per output {idx, dtype, shape, nan, inf, numel, ...}; `label`: why it is no culprit
    (handled by loss scaling, contained, from a collective...); `confirmation`: the offline
    re-run's verdict, when asked for."""

    site: CallSite
    outputs: list[dict[str, Any]] = field(default_factory=list)
    kind: str = "overflow"
    label: str = ""
    confirmation: dict[str, Any] | None = None

    @property
    def op(self) -> str:
        return self.site.op

    def message(self) -> str:
        """The sentence the online check says (its warning and, raised, its error)."""
        what = "produced inf/nan from finite inputs" if self.kind == "overflow" else (
            "produced values near the float16/bfloat16 limit from unsaturated inputs")
        outs = "; ".join(
            f"output {o['idx']} {o['dtype']}{o['shape']}: {o['nan']} nan, {o['inf']} inf"
            f" of {o['numel']}, max |finite| {o['max_abs_finite']:.4g}" for o in self.outputs)
        outs = outs.replace("max |finite| nan", "no finite value")
        s = self.site
        return (f"{self.kind} born at step {s.step}, op {s.seq} {s.op} ({s.phase}, "
                f"module {s.module or '-'}) at {s.source or 'unknown source'}: {what}. "
                f"{outs}" + (f" ({self.label})" if self.label else ""))

    def line(self) -> str:
        """One line of `accuracy overflow`'s table."""
        outs = ", ".join(f"out{o['idx']} {o['dtype']}{o['shape']} nan {o['nan']} inf {o['inf']}"
                         for o in self.outputs)
        s = self.site
        text = (f"{s.seq:6d}  {s.op}  [{s.phase}, step {s.step}] {s.module or '-'}  "
                f"{s.source or '?'}  {outs}")
        if self.label:
            text += f"  ({self.label})"
        return text

    def as_dict(self, *, kind: bool = True, confirmation: bool = True) -> dict[str, Any]:
        """The record as flat JSON-ready data: the site's per-row fields, then the finding's
        (`kind` and `confirmation` left out where a writer never had them)."""
        d: dict[str, Any] = {k: getattr(self.site, k) for k in SITE_FIELDS}
        if kind:
            d["kind"] = self.kind
        d["outputs"] = self.outputs
        d["label"] = self.label
        if confirmation:
            d["confirmation"] = self.confirmation
        return d
