"""Align two op streams so an inserted, removed or fused op does not shift everything after it.

Two levels: first the runs' module spans (contiguous ops with the same phase and module path)
are aligned as a sequence, which anchors the alignment on module boundaries; then the ops inside
each pair of matched spans (or inside a block of unmatched spans) are aligned by op name and
output shapes. Both levels use difflib's longest-matching-block algorithm without its
"popular element" heuristic, which would discard the many repeated ops of a transformer.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from pathlib import Path

from accuracy.dumpfile import OpRecord
from accuracy.errors import UsageError


@dataclass
class Mapping:
    """User pairing of differently named ops or modules (my name -> golden name)."""

    ops: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)

    def op(self, name: str) -> str:
        return self.ops.get(name, name)

    def module(self, path: str) -> str:
        """Rename the longest matching module prefix."""
        best = ""
        for src in self.modules:
            if (path == src or path.startswith(src + ".")) and len(src) > len(best):
                best = src
        return self.modules[best] + path[len(best):] if best else path


def load_mapping(source: str | os.PathLike[str] | dict | Mapping | None) -> Mapping:
    """A mapping from a .json / .toml file or a dict: {"ops": {...}, "modules": {...}}."""
    if source is None:
        return Mapping()
    if isinstance(source, Mapping):
        return source
    if isinstance(source, dict):
        data = source
    else:
        path = Path(source)
        try:
            text = path.read_text()
        except OSError as e:
            raise UsageError(f"mapping file {path}: {e.strerror or e}") from None
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"mapping file {path}: not valid {path.suffix or 'JSON'}: {e}") \
                from None
    unknown = set(data) - {"ops", "modules"}
    if unknown:
        raise UsageError(f"mapping: unknown sections {sorted(unknown)}; use 'ops' and 'modules'")
    return Mapping(ops={str(k): str(v) for k, v in data.get("ops", {}).items()},
                   modules={str(k): str(v) for k, v in data.get("modules", {}).items()})


@dataclass
class Pair:
    """One aligned position: both ops, or one side only with the reason."""

    my: OpRecord | None
    golden: OpRecord | None
    reason: str = ""


def _op_key(r: OpRecord, mapping: Mapping | None) -> tuple:
    name = mapping.op(r.op) if mapping else r.op
    return (name, tuple(t.shape for t in r.outputs))


def _spans(recs: list[OpRecord], mapping: Mapping | None) -> list[tuple[tuple[str, str], list]]:
    out: list[tuple[tuple[str, str], list]] = []
    for r in recs:
        key = (r.phase, mapping.module(r.module) if mapping else r.module)
        if out and out[-1][0] == key:
            out[-1][1].append(r)
        else:
            out.append((key, [r]))
    return out


def _align_ops(my: list[OpRecord], golden: list[OpRecord], mapping: Mapping) -> list[Pair]:
    a = [_op_key(r, mapping) for r in my]
    b = [_op_key(r, None) for r in golden]
    out: list[Pair] = []
    sm = SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.extend(Pair(my[i], golden[j]) for i, j in zip(range(i1, i2), range(j1, j2),
                                                              strict=True))
        elif tag == "replace":
            out.extend(_pair_replaced(my[i1:i2], golden[j1:j2], a[i1:i2], b[j1:j2]))
        elif tag == "delete":
            out.extend(Pair(r, None, "only in my run (inserted op, or fused/decomposed "
                            "differently)") for r in my[i1:i2])
        else:
            out.extend(Pair(None, r, "only in golden run (removed op, or fused/decomposed "
                            "differently)") for r in golden[j1:j2])
    return out


def _pair_replaced(my: list[OpRecord], golden: list[OpRecord], a: list, b: list) -> list[Pair]:
    """Inside a differing block, pair ops with the same name (shapes may differ: reported)."""
    sm = SequenceMatcher(None, [k[0] for k in a], [k[0] for k in b], autojunk=False)
    out: list[Pair] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.extend(Pair(my[i], golden[j]) for i, j in zip(range(i1, i2), range(j1, j2),
                                                              strict=True))
            continue
        out.extend(Pair(r, None, f"only in my run: no {r.op} at this point of the golden run "
                        "(inserted, or fused/decomposed differently)") for r in my[i1:i2])
        out.extend(Pair(None, r, f"only in golden run: no {r.op} at this point of my run "
                        "(removed, or fused/decomposed differently)") for r in golden[j1:j2])
    return out


def align(my: list[OpRecord], golden: list[OpRecord], mapping: Mapping | None = None
          ) -> list[Pair]:
    """Aligned pairs in execution order (my run's order; golden-only ops where they fall)."""
    mapping = mapping or Mapping()
    if [_op_key(r, mapping) for r in my] == [_op_key(r, None) for r in golden] and all(
            (a.phase, mapping.module(a.module)) == (b.phase, b.module)
            for a, b in zip(my, golden, strict=True)):
        return [Pair(a, b) for a, b in zip(my, golden, strict=True)]
    sa, sb = _spans(my, mapping), _spans(golden, None)
    sm = SequenceMatcher(None, [k for k, _ in sa], [k for k, _ in sb], autojunk=False)
    out: list[Pair] = []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for (_, ra), (_, rb) in zip(sa[i1:i2], sb[j1:j2], strict=True):
                out.extend(_align_ops(ra, rb, mapping))
        else:
            ra = [r for _, rs in sa[i1:i2] for r in rs]
            rb = [r for _, rs in sb[j1:j2] for r in rs]
            out.extend(_align_ops(ra, rb, mapping))
    return out


@dataclass
class ModuleEnd:
    """The last op of one execution of a module (its output is the module's output)."""

    module: str
    phase: str
    occurrence: int
    record: OpRecord


def module_ends(recs: list[OpRecord], mapping: Mapping | None = None
                ) -> dict[tuple[str, str, int], ModuleEnd]:
    """Every module execution (each prefix of each op's module path), keyed for pairing."""
    ends: dict[tuple[str, str, int], ModuleEnd] = {}
    counts: dict[tuple[str, str], int] = {}
    open_: dict[str, OpRecord] = {}  # module prefix -> last op seen inside it
    phase = None

    def close(prefixes: list[str]) -> None:
        # Inner modules end before the modules holding them; the order is the report's row
        # order, so it must not depend on string hashing (a set's order changes per process).
        for p in sorted(prefixes, key=lambda p: -p.count(".")):
            last = open_.pop(p)
            k = (p, last.phase)
            occ = counts.get(k, 0)
            counts[k] = occ + 1
            ends[(p, last.phase, occ)] = ModuleEnd(p, last.phase, occ, last)

    for r in recs:
        mod = mapping.module(r.module) if mapping else r.module
        parts = mod.split(".") if mod else []
        prefixes = [".".join(parts[: i + 1]) for i in range(len(parts))]  # outer to inner
        if r.phase != phase:
            close(list(open_))
            phase = r.phase
        else:
            close([p for p in open_ if p not in prefixes])
        for p in prefixes:
            open_[p] = r
    close(list(open_))
    return ends
