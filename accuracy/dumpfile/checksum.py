"""What stored bytes are checked against: a content hash (schema 3), or the older sum.

Schema 3 stores XXH3-64 of every stored tensor's bytes (`content_hash`, computed once, by the
writer): swapping two elements or flipping opposite bits changes it, where a sum cannot see it.
Dumps of schema 1-2 carry only the sum below, and are still checked with it.

The sum (also kept in schema 3 as a statistic: statistics mode tells bit-exact runs by it):

The dumper (accuracy/dumpfile/stats.py) sums the raw bit patterns of the elements: a 1-byte
element as uint8, 2/4/8-byte elements as int16/int32/int64, the parts of a complex number
separately; the sum wraps in int32 (int64 for 8-byte parts). Summation with wrap-around is
order-free, so the same value comes from any split of the bytes into pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

CONTENT_HASH_KIND = "xxh3-64"
SUM_KIND = "bit-pattern sum"
NO_HASH = 0  # a row without stored bytes (or of an older schema): no content hash

_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_WRAP = {4: np.uint32, 8: np.uint64}  # parts whose own width holds the checksum's modulus
_COMPLEX_PART = {"complex32": 2, "complex64": 4, "complex128": 8}


def part_size(dtype: str, itemsize: int) -> int:
    """Bytes per summed part: the element, or half of it for a complex dtype."""
    return _COMPLEX_PART.get(dtype, itemsize)


class Checksum:
    """A running checksum over consecutive pieces of one tensor's bytes."""

    def __init__(self, part: int) -> None:
        self._view = _BITS[part]
        self._wrap = _WRAP.get(part)
        self._bits = 64 if part == 8 else 32
        self._total = 0

    def update(self, raw: np.ndarray) -> None:
        """Add a piece of the bytes (its length must be a multiple of the part size)."""
        if not raw.size:
            return
        wrap = self._wrap
        if wrap is not None:
            # 4- and 8-byte parts: summed in their own width, wrapping (no widening pass);
            # the checksum is the sum modulo 2**32 or 2**64, so the wrapped sum is exact.
            self._total += int(raw.view(wrap).sum(dtype=wrap))
        else:
            # numpy wraps int64 sums mod 2**64, which 2**32 divides: exact for both widths
            self._total += int(raw.view(self._view).sum(dtype=np.int64))

    @property
    def value(self) -> int:
        """The checksum as stored: wrapped to a signed 32- or 64-bit integer."""
        mod = 1 << self._bits
        v = self._total % mod
        return v - mod if v >= mod >> 1 else v


def checksum(raw: np.ndarray, part: int) -> int:
    c = Checksum(part)
    c.update(raw)
    return c.value


def content_hash(raw: np.ndarray) -> int:
    """XXH3-64 of an array's bytes, as stored in a schema-3 tensor row (never 0). (xxhash's
    one-shot digest is faster on buffers in cache, but on a dump's tensors, read from memory,
    it measured slower than the running state: benchmarks/HISTORY.md.)"""
    h = ContentHash()
    h.update(raw)
    return h.value


class ContentHash:
    """XXH3-64 over consecutive pieces of one tensor's bytes, fed in order (a reader going
    through a tensor chunk by chunk; `content_hash` for a whole buffer)."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_64()

    def update(self, raw: np.ndarray) -> None:
        if raw.size:
            self._h.update(np.ascontiguousarray(raw).view(np.uint8).data)

    @property
    def value(self) -> int:
        return self._h.intdigest() or 1  # 0 means "no hash" in the row: never produced


def running_check(stats: dict[str, float], dtype: str, itemsize: int, stored_hash: int
                  ) -> tuple[ContentHash | Checksum, int] | None:
    """(running check, the value it must reach) for one tensor's bytes, or None when nothing
    was stored to check against: the content hash where the row has one, else the sum."""
    if stored_hash != NO_HASH:
        return ContentHash(), stored_hash
    if stats.get("nan_count", -1) < 0 or "checksum" not in stats:
        return None
    return Checksum(part_size(dtype, itemsize)), int(stats["checksum"])


def rows_hash(ops: np.ndarray, tensors: np.ndarray, texts: Sequence[bytes] = ()) -> int:
    """XXH3-64 of a batch of index rows (op rows and tensor rows, as numpy structured arrays):
    numeric columns by their little-endian bytes, text columns as UTF-8 with lengths, then the
    stored text of each op (schema 4, see optext.py). The writer hashes each flushed batch,
    the reader recomputes it from the rows it read."""
    h = xxhash.xxh3_64()
    for arr in (ops, tensors):
        h.update(len(arr).to_bytes(8, "little"))
        for name in arr.dtype.names or ():
            col = arr[name]
            if col.dtype.kind == "O":
                for v in col.tolist():
                    b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
                    h.update(len(b).to_bytes(8, "little"))
                    h.update(b)
            else:
                h.update(np.ascontiguousarray(col.astype(col.dtype.newbyteorder("<"))).data)
    for b in texts:
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.intdigest() or 1


def attrs_hash(attrs: dict[str, object]) -> int:
    """XXH3-64 over a dump's root attributes (name and text of each, sorted by name; the hash
    attribute itself left out), written at close and checked on open."""
    h = xxhash.xxh3_64()
    for k in sorted(attrs):
        if k == ATTRS_HASH:
            continue
        v = attrs[k]
        v = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        if isinstance(v, np.generic):
            v = v.item()
        for part in (k, f"{type(v).__name__}:{v!r}"):
            b = part.encode("utf-8", "replace")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.intdigest() or 1


ATTRS_HASH = "attrs_hash"
