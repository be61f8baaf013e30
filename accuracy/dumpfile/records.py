"""What a dump holds, as records: one `OpRecord` per op call, one `TensorRecord` per tensor
use, and `TensorRef`, a tensor's place in the file that any process can read by.

The reader (`reader.Dump`) builds them from the index tables; a record reads its bytes back
through the dump it came from, which it names only by what it needs of it (`TensorSource`):
the reader imports this module, so this module does not import the reader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from accuracy.dumpfile import dtypes, layout, schema
from accuracy.dumpfile.checksum import NO_HASH, Checksum, ContentHash, running_check

if TYPE_CHECKING:  # torch is imported only by the calls that return tensors
    import torch


class TensorSource(Protocol):
    """What a tensor record needs of the dump holding its bytes (`reader.Dump`): where it
    is, and its checked reads."""

    path: Path

    def read_tensor(self, t: TensorRecord) -> torch.Tensor: ...

    def read_bytes(self, offset: int, nbytes: int, what: str) -> np.ndarray: ...

    def check_checksum(self, what: str, computed: int, stored: float | int) -> None: ...


@dataclass(eq=False)
class TensorRecord:
    """One tensor use: an input or output of one op, with its statistics."""

    dump: TensorSource = field(repr=False)  # the Dump holding its bytes
    row: int
    op: str
    seq: int
    io: int
    idx: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    offset: int
    nbytes: int
    first: int
    stats: dict[str, float]
    content_hash: int = NO_HASH  # XXH3-64 of the elements in order (schema 3), else NO_HASH
    # schema 6: (shape, strides) the elements are read through from `offset` (each storage
    # version stored once, docs/dump-format.md); None: row-major at [offset, offset + nbytes)
    layout: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    @property
    def address(self) -> str:
        return schema.address(self.op, self.seq, self.io, self.idx)

    @property
    def has_data(self) -> bool:
        return self.offset >= 0

    @property
    def is_link(self) -> bool:
        """True when the bytes were written for an earlier use of the same tensor."""
        return self.has_data and self.first != self.row

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1  # plain ints: 10x cheaper than np.prod

    @property
    def strided(self) -> bool:
        """Whether the row reads its elements through a layout (schema 6)."""
        return self.layout is not None

    @property
    def byte_layout(self) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(shape, strides) through which the stored bytes are read (its elements in that
        shape's row-major order are the tensor's), or None: row-major bytes."""
        if self.layout is not None and not layout.row_major(*self.layout):
            return self.layout
        return None

    @property
    def bytes_key(self) -> tuple:
        """Where and how this row's values are read: equal keys, equal values (a view of
        stored bytes reads them through its strides, so its layout is part of the key)."""
        return (self.offset, self.nbytes, self.dtype, self.byte_layout)

    @property
    def values_key(self) -> tuple:
        """Which values this tensor holds, to match uses of one tensor across ops: the row
        that first held its bytes (tensor dumps), else its dtype and statistics (statistics
        dumps record no bytes; a view's shape differs, its values do not). A strided row is
        the first row of its own values (its bytes lie in another's)."""
        if self.first >= 0:
            return ("row", self.first)
        return ("stats", self.dtype, tuple(sorted(self.stats.items())))

    def load(self) -> torch.Tensor:
        """The tensor with its original dtype and shape (contiguous, on CPU)."""
        return self.dump.read_tensor(self)

    def ref(self) -> TensorRef:
        """Where this tensor's bytes live, as a picklable descriptor (see `Dump.read_range`)."""
        return TensorRef.of(self)


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes live and what they must sum to: enough for any process (a
    worker, a cluster node) to open the dump and read them with `Dump.read_range`."""

    path: str
    offset: int
    nbytes: int
    dtype: str
    numel: int
    stats: tuple[tuple[str, float], ...]
    address: str = ""
    content_hash: int = NO_HASH
    layout: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # strided rows: shape, strides

    @classmethod
    def of(cls, t: TensorRecord) -> TensorRef:
        return cls(str(t.dump.path), t.offset, t.nbytes, t.dtype, t.numel,
                   tuple(sorted(t.stats.items())), t.address, t.content_hash, t.byte_layout)

    @property
    def what(self) -> str:
        return self.address or f"tensor at offset {self.offset}"

    @property
    def checksum(self) -> int | None:
        """The stored checksum, or None when the dump recorded no statistics for it."""
        s = dict(self.stats)
        if s.get("nan_count", -1) < 0 or "checksum" not in s:
            return None
        return int(s["checksum"])

    def new_checksum(self) -> Checksum | ContentHash | None:
        """A running check of this tensor's bytes as they are read, in order (the content
        hash where the dump has one); compare its value with `stored_check`."""
        c = running_check(dict(self.stats), self.dtype, dtypes.itemsize(self.dtype),
                          self.content_hash)
        return c[0] if c else None

    @property
    def stored_check(self) -> int | None:
        """The value `new_checksum()` must reach (content hash, else the sum), or None."""
        c = running_check(dict(self.stats), self.dtype, dtypes.itemsize(self.dtype),
                          self.content_hash)
        return c[1] if c else None

    @property
    def value_dtype(self) -> str:
        """Complex tensors are compared as their real view (real, imag interleaved)."""
        return dtypes.value_dtype(self.dtype)

    @property
    def n_values(self) -> int:
        return self.numel * (2 if self.dtype in dtypes.COMPLEX_PART else 1)

    @property
    def finite(self) -> bool:
        s = dict(self.stats)
        return not (s.get("nan_count", 0) or s.get("inf_count", 0))

    def minmax(self) -> tuple[float, float]:
        s = dict(self.stats)
        return s.get("min", math.nan), s.get("max", math.nan)


@dataclass(eq=False)
class OpRecord:
    """One recorded ATen op call."""

    seq: int
    op: str
    phase: str
    module: str
    source: str
    stack: str
    args_json: str
    step: int
    extra: dict[str, Any]
    inputs: list[TensorRecord]
    outputs: list[TensorRecord]
    epoch: int = schema.UNKNOWN_EPOCH  # collectives its rank issued before it; -1: unknown

    def call(self, tensors: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """Rebuild (args, kwargs) of the call with `tensors` in the input placeholders."""
        from accuracy.dumpfile.argcodec import decode_call  # imports torch

        return decode_call(self.args_json, tensors)

    @property
    def tensors(self) -> list[TensorRecord]:
        return self.inputs + self.outputs

