"""Random corruptions of a real dump that no sum can see, and of its metadata: every one is
detected by `verify` or refused on open (behind ACCURACY_SLOW; ACCURACY_FUZZ_CASES sets the
count). Kinds: two elements of a stored tensor swapped, opposite bits flipped in a pair, a byte
of an op row's text (source, module, phase) changed, a statistic of a tensor row changed, a
root attribute changed."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from accuracy import dumper
from accuracy.dumpfile import DumpError, load_dump, schema
from accuracy.examples import lm_batch, lm_step, tiny_lm

CASES = int(os.environ.get("ACCURACY_FUZZ_CASES", "60"))


def _swap(f: h5py.File, rows: np.ndarray, rng: random.Random) -> str:
    r = rng.choice([r for r in rows if r["offset"] >= 0 and r["first"] >= 0 and r["nbytes"] >= 8])
    item = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8}.get(r["dtype"].decode(), 1)
    n = int(r["nbytes"]) // item
    b = f[schema.BLOB]
    for _ in range(50):
        i, j = sorted(rng.sample(range(n), 2))
        a = b[r["offset"] + i * item: r["offset"] + (i + 1) * item].copy()
        c = b[r["offset"] + j * item: r["offset"] + (j + 1) * item].copy()
        if a.tobytes() != c.tobytes():
            b[r["offset"] + i * item: r["offset"] + (i + 1) * item] = c
            b[r["offset"] + j * item: r["offset"] + (j + 1) * item] = a
            return "swap"
    return ""


def _pair_flip(f: h5py.File, rows: np.ndarray, rng: random.Random) -> str:
    r = rng.choice([r for r in rows if r["offset"] >= 0 and r["nbytes"] >= 8
                    and r["dtype"].decode() == "float32"])
    b = f[schema.BLOB]
    k = rng.randrange(int(r["nbytes"]) // 4 - 1)
    v = b[r["offset"] + 4 * k: r["offset"] + 4 * k + 8].copy().view(np.uint32)
    for bit in rng.sample(range(32), 32):
        if not v[0] >> bit & 1 and v[1] >> bit & 1:
            v[0] += np.uint32(1 << bit)
            v[1] -= np.uint32(1 << bit)
            b[r["offset"] + 4 * k: r["offset"] + 4 * k + 8] = v.view(np.uint8)
            return "pair-flip"
    return ""


def _text(f: h5py.File, _rows: np.ndarray, rng: random.Random) -> str:
    """A flipped bit in an op's stored text (name, module, source... : schema 4 keeps it in
    the blob)."""
    op = rng.choice(f[schema.OPS][:].tolist())
    at = schema.OP_ROW.names.index("text")
    pos = op[at] + rng.randrange(op[at + 1])
    b = f[schema.BLOB]
    b[pos] ^= np.uint8(1 << rng.randrange(7))
    return "text"


def _stat(f: h5py.File, rows: np.ndarray, rng: random.Random) -> str:
    i, col = rng.randrange(len(rows)), rng.choice(["min", "max", "mean", "l2"])
    v = np.array([rows[i][col]], np.float64).view(np.uint64)
    v ^= np.uint64(1 << rng.randrange(64))
    rows[i][col] = v.view(np.float64)[0]
    f[schema.TENSORS][:] = rows
    return f"stat:{col}"


def _attr(f: h5py.File, _rows: np.ndarray, rng: random.Random) -> str:
    k = rng.choice([k for k in f.attrs if k not in ("attrs_hash", "format", "schema_version")])
    v = f.attrs[k]
    f.attrs[k] = (not v) if isinstance(v, bool | np.bool_) else (
        v + 1 if isinstance(v, int | np.integer | float | np.floating) else str(v) + "!")
    return f"attr:{k}"


KINDS = (_swap, _pair_flip, _text, _stat, _attr)


def _detected(path: Path) -> bool:
    try:
        with load_dump(path) as d:
            return bool(d.verify())
    except DumpError:
        return True


@pytest.mark.slow
def test_every_corruption_is_detected(tmp_path):
    good = tmp_path / "good.h5"
    with dumper(dump_path=good):
        lm_step(tiny_lm(), lm_batch())
    assert not _detected(good)
    rng = random.Random(24)
    missed, counts = [], {}
    for case in range(CASES):
        p = tmp_path / f"c{case}.h5"
        shutil.copyfile(good, p)
        kind = KINDS[case % len(KINDS)]
        with h5py.File(p, "r+") as f:
            what = kind(f, f[schema.TENSORS][:], rng)
        if not what:
            continue
        counts[what.split(":")[0]] = counts.get(what.split(":")[0], 0) + 1
        if not _detected(p):
            missed.append((case, what))
        p.unlink()
    print(f"corruptions by kind: {counts}; missed: {missed}")
    assert sum(counts.values()) >= CASES * 0.9 and missed == []
