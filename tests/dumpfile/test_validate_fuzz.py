"""Random corruptions of a real dump that no sum can see, and of its metadata: every one is
detected by `verify` or refused on open (behind ACCURACY_SLOW; ACCURACY_FUZZ_CASES sets the
count). Kinds: two elements of a stored tensor swapped, opposite bits flipped in a pair, a byte
of an op row's text (source, module, phase) changed, a statistic of a tensor row changed, a
root attribute changed. `test_compiled_graph_fields_never_run_code`: crafted mutations of a
real compiled dump's kernel graphs (`fused_graph`, `reference`; issue 44), for `repro` and
replay."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

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


# -- schema 6: crafted layouts of strided rows, the hashes resealed ---------------------------

def _mutate_layout(r: np.void, rng: random.Random) -> str:
    nd = int(r["ndim"])
    j = rng.randrange(max(nd, 1))
    kind = rng.choice(["zero", "negative", "huge", "small", "swap", "offset", "flag"])
    if kind == "zero":
        r["stride"][j] = 0
    elif kind == "negative":
        r["stride"][j] = -rng.randrange(1, 1 << 20)
    elif kind == "huge":
        r["stride"][j] = rng.choice([1 << 40, (1 << 62) + 1, (1 << 63) - 1])
    elif kind == "small":
        r["stride"][j] = rng.randrange(1, 64)
    elif kind == "swap" and nd >= 2:
        a, b = rng.sample(range(nd), 2)
        r["stride"][a], r["stride"][b] = int(r["stride"][b]), int(r["stride"][a])
    elif kind == "offset":
        r["offset"] = int(r["offset"]) + rng.choice([-1, 1]) * rng.randrange(1, 1 << 16)
    else:
        r["strided"] = rng.choice([0, 2, -1, 127])
    return kind


@pytest.mark.slow
def test_crafted_layouts_are_refused_or_read_the_values_they_hold(tmp_path):
    """Strides, offsets and the flag of real strided rows mutated, the hashes resealed (an
    attacker recomputes them): every read is refused in one DumpError or gives the row's
    recorded values (a mutation that changes nothing read), never another exception, a
    crash, or bytes from outside the data."""
    from tests._support.crafted import reseal

    good = tmp_path / "good.h5"
    with dumper(dump_path=good, mode="tensor"):
        lm_step(tiny_lm(), lm_batch())
    with load_dump(good) as d:
        strided = [t.row for t in d.tensors if t.strided]
        values = {i: d.tensors[i].load() for i in strided}
    assert strided
    rng = random.Random(51)
    kinds: dict[str, int] = {}
    for case in range(CASES):
        p = tmp_path / f"l{case}.h5"
        shutil.copyfile(good, p)
        i = rng.choice(strided)
        with h5py.File(p, "r+") as f:
            rows = f[schema.TENSORS][:]
            kind = _mutate_layout(rows[i], rng)
            f[schema.TENSORS][:] = rows
            reseal(f)
        kinds[kind] = kinds.get(kind, 0) + 1
        try:
            with load_dump(p) as d:
                try:
                    got = d.tensors[i].load()
                except DumpError:
                    continue
                assert torch.equal(got, values[i]), (case, kind)
                ref = d.tensors[i].ref()
                n = ref.n_values
                try:
                    raw = np.concatenate([d.read_range(ref, a, a + 97) for a in range(0, n, 97)])
                except DumpError:
                    continue
                assert raw.tobytes() == values[i].contiguous().view(torch.uint8).numpy().tobytes()
        except DumpError:
            pass
        p.unlink()
    print(f"layout mutations by kind: {kinds}")
    assert len(kinds) >= 6


# -- compiled dumps: the graph fields replay and `accuracy repro` read (issue 44) -------------
# Kept apart from the corruption kinds above: these are crafted values (the hashes resealed),
# not damage. Each case mutates a real kernel row's `fused_graph` or `reference` and asks
# `repro` and replay for it: `repro` writes a script whose `forward` is only what graphform
# prints, or refuses in one AccuracyError; replay returns an outcome; nothing else escapes,
# and nothing the dump names runs (no marker file, no file read).

_HOSTILE_OPS = ["load_library.__call__.__call__", "import_module.__call__.__call__",
                "aten.from_file.default", "c10d.allreduce_.default",
                "_c10d_functional.all_reduce.default", "profiler._record_function_enter.default",
                "aten._print.default", "aten.save.default", "aten.manual_seed.default",
                "os.system.default", "aten.mm.default\nimport os", "aten.mm.default.__call__",
                "__class__.__init__.__globals__", "accuracy_fuzz.touch.default", 5, None,
                ["aten.mm.default"], "sym", "getitem"]
_HOSTILE_VALUES = ["__import__('os').system('touch PWNED')", "sum", "floor", "/etc/passwd",
                   {"__repr__": "os.system('touch PWNED')"}, {"__dtype__": "_dynamo"},
                   {"__dtype__": "float32"}, {"__device__": "cpu') or print('x"},
                   {"__tensor__": 10 ** 6}, {"__tensor__": -1}, {"__tensor__": "0"},
                   {"__memory_format__": "os"}, {"__layout__": []}, {"__complex__": "x"},
                   {"__float__": "nan"}, {"__generator__": None}, {"a": 1}, 2 ** 70, 1e308,
                   [[[[[1]]]]], list(range(5000)), True, None, -1, "x" * 5000]
_HOSTILE_EXPRS = ["__import__('os').system('touch PWNED')", "s0.__class__", "(" * 60,
                  "Abs(1, 2)", "9**64**64", "s99", "lambda: 1", 7, None]


def _graph_mutation(g: dict, rng: random.Random) -> str:
    import json as _json

    if not isinstance(g, dict):  # an earlier mutation made the whole field something else
        return ""
    nodes = [n for n in g["nodes"] if isinstance(n, dict)] \
        if isinstance(g.get("nodes"), list) else []
    kind = rng.choice(["op", "arg", "kwarg", "type", "index", "sym", "drop", "grow", "text"])
    if kind == "op" and nodes:
        rng.choice(nodes)["op"] = rng.choice(_HOSTILE_OPS)
    elif kind in ("arg", "kwarg") and nodes:
        n = rng.choice(nodes)
        try:
            call = _json.loads(n["args"])
        except (KeyError, TypeError, ValueError):
            call = {"args": [], "kwargs": {}}
        if kind == "arg" and call.get("args"):
            call["args"][rng.randrange(len(call["args"]))] = rng.choice(_HOSTILE_VALUES)
        else:
            key = rng.choice(["rounding_mode", "dtype", "x=__import__('os'),y", "out",
                              "generator", "approximate", "device"])
            call.setdefault("kwargs", {})[key] = rng.choice(_HOSTILE_VALUES)
        n["args"] = _json.dumps(call)
    elif kind == "type":
        g[rng.choice(["inputs", "nodes", "outputs", "graph", "sizes"])] = rng.choice(
            [5, "x", {"a": 1}, [None], [[1]], None, list(range(3000))])
    elif kind == "index":
        outs = g.get("outputs")
        if isinstance(outs, list) and outs:
            outs[rng.randrange(len(outs))] = rng.choice([-1, 10 ** 6, 1.5, "0", True, [0]])
    elif kind == "sym" and isinstance(g.get("nodes"), list):
        g["nodes"].insert(rng.randrange(len(g["nodes"]) + 1),
                          {"op": "sym", "expr": rng.choice(_HOSTILE_EXPRS)})
    elif kind == "drop" and nodes:
        n = rng.choice(nodes)
        n.pop(rng.choice(["op", "args"]), None)
    elif kind == "grow" and nodes:
        g["nodes"] = nodes * (2100 // len(nodes) + 1)
    elif kind == "text" and nodes:
        rng.choice(nodes)["args"] = rng.choice(["[" * 10_000 + "]" * 10_000, "{", "null",
                                                '{"args": 5, "kwargs": {}}', "x" * 100])
    else:
        return ""
    return kind


@pytest.mark.slow
def test_compiled_graph_fields_never_run_code(tmp_path, monkeypatch):
    import json as _json

    from accuracy.errors import AccuracyError
    from accuracy.replay.cache import TensorCache
    from accuracy.replay.ops import replay_op
    from accuracy.repro.script import write_repro
    from tests._support import crafted as C
    from tests._support.miscompile import inductor_cache
    from tests.dumper.compiled.test_source import _dumps
    from tests.scenarios.test_hostile_dumps_never_run import forward_is_ours

    @torch.library.custom_op("accuracy_fuzz::touch", mutates_args=())
    def touch(x: torch.Tensor) -> torch.Tensor:
        (tmp_path / "PWNED").touch()
        return x.clone()

    monkeypatch.chdir(tmp_path)
    with inductor_cache(tmp_path / "inductor"):
        (tmp_path / "run").mkdir()
        _, comp = _dumps(tmp_path / "run", False)
    with load_dump(comp) as d:
        rows = [(i, r.seq, r.op) for i, r in enumerate(d.records)
                if "fused_graph" in r.extra and "reference" in r.extra]
    assert rows
    rng = random.Random(44)
    counts: dict[str, int] = {}
    crashes: list[tuple[int, str, str]] = []
    written = 0
    for case in range(CASES):
        row, seq, op = rng.choice(rows)
        field = rng.choice(["fused_graph", "reference"])
        kinds: list[str] = []

        def edit(f: h5py.File, row: int = row, field: str = field, kinds: list = kinds) -> None:
            def change(ops: list[dict[str, str]]) -> None:
                extra = _json.loads(ops[row]["extra"])
                for _ in range(rng.randint(1, 3)):
                    kinds.append(_graph_mutation(extra[field], rng))
                if rng.random() < 0.05:  # the whole field something else
                    extra[field] = rng.choice([5, "x", [1], None, "(" * 10_000])
                    kinds.append("field")
                ops[row]["extra"] = _json.dumps(extra)
            C.edit_op_texts(f, change)
        p = C._copy_and_edit(comp, tmp_path / f"g{case}.h5", edit)
        for k in kinds:
            if k:
                counts[k] = counts.get(k, 0) + 1
        out = tmp_path / f"g{case}.py"
        try:
            write_repro(p, op, out, seq=seq)
            text = out.read_text()
            forward_is_ours(text)
            compile(text, str(out), "exec")
            written += 1
        except AccuracyError:
            assert not out.exists()
        except Exception as e:  # noqa: BLE001 - what the fuzz looks for
            crashes.append((case, "repro", f"{type(e).__name__}: {e}"[:200]))
        try:
            with load_dump(p) as d:
                outcome = replay_op(d.record(seq), torch.device("cpu"), "fp64", TensorCache(0))
            assert outcome.status in ("ok", "skipped", "failed")
        except Exception as e:  # noqa: BLE001
            crashes.append((case, "replay", f"{type(e).__name__}: {e}"[:200]))
        p.unlink()
    print(f"graph mutations by kind: {counts}; scripts written: {written}; crashes: {crashes}")
    assert not (tmp_path / "PWNED").exists() and not list(tmp_path.rglob("PWNED"))
    assert crashes == [] and len(counts) >= 6
