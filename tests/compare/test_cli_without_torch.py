"""`accuracy compare` reads bytes with numpy alone: no torch import, same rows (#19).

bfloat16 and the 8-bit floats are decoded by accuracy/dumpfile/dtypes.py; these tests hold
that decoding bit-exact against torch's, and a whole compare free of torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from accuracy.compare import compare
from accuracy.compare import engine as E
from accuracy.dumper.core import dumper
from accuracy.dumpfile import dtypes as D

REPO = Path(__file__).resolve().parents[2]


def _torch_decode(raw: np.ndarray, name: str, out: np.ndarray | None = None) -> np.ndarray:
    """The decoding compare used before dtypes.py: torch's own conversion to float64."""
    vals = torch.from_numpy(raw.copy()).view(getattr(torch, D.value_dtype(name)))
    vals = vals.to(torch.float64).numpy()
    if out is None:
        return vals
    out = out[: vals.size]
    out[:] = vals
    return out


@pytest.mark.parametrize("name", [*D.FLOAT8, "bfloat16"])
def test_every_code_decodes_as_torch_decodes_it(name):
    bits = np.arange(256 if name in D.FLOAT8 else 1 << 16,
                     dtype=np.uint8 if name in D.FLOAT8 else np.uint16)
    raw = bits.view(np.uint8)
    ours, theirs = D.decode(raw, name), _torch_decode(raw, name)
    np.testing.assert_array_equal(ours, theirs)  # NaN positions equal, every value exact
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))


def test_dtype_tables_agree_with_torch():
    names = {str(v).removeprefix("torch.") for v in vars(torch).values()
             if isinstance(v, torch.dtype)}
    assert names <= set(D.ITEMSIZE), "a torch dtype without an item size: dumps holding it " \
                                     "would be refused"
    for n in names:
        dt = D.torch_dtype(n)
        assert D.ITEMSIZE[n] == dt.itemsize, n
        assert D.dtype_name(dt) == n
        if dt.is_floating_point or dt.is_complex:
            try:
                eps = torch.finfo(dt).eps
            except (TypeError, NotImplementedError):  # float4 has no epsilon
                continue
            assert D.eps(n) == eps, n
    with pytest.raises(ValueError, match="unknown tensor dtype"):
        D.itemsize("float7")


def _mixed_dump(path: Path, golden: bool) -> Path:
    """One op per dtype: fp32, fp16, bf16 (NaN, inf, subnormals, -0), fp8 e4m3/e5m2, int, bool.

    The golden side differs a little everywhere, and in its non-finite positions."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, generator=g)
    if golden:
        x = x * (1 + 1e-3 * torch.randn(4096, generator=torch.Generator().manual_seed(4)))
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -3e-39,
                            9.2e-41, 65504.0])
    if golden:
        special = torch.tensor([float("nan"), 1.0, -float("inf"), 0.0, 2e-40, -3e-39,
                                float("nan"), 65504.0])
    bf = torch.cat([x, special]).to(torch.bfloat16)
    ints = (x * 100).to(torch.int64)
    with torch.no_grad(), dumper(str(path)):
        (x * 2).sum()
        (x.to(torch.float16) * 2).relu()
        (bf * 2).neg()
        x.to(torch.float8_e4m3fn).to(torch.float32)
        x.to(torch.float8_e5m2).to(torch.float32)
        (ints + 1).abs()
        (x > 0.1).logical_not()
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("mixed")
    return _mixed_dump(d / "my.h5", False), _mixed_dump(d / "golden.h5", True)


def test_rows_identical_with_torch_and_numpy_decoding(mixed, monkeypatch):
    my, golden = mixed
    ours = compare(my, golden, algorithms="all")
    dtypes = {r["dtype_my"] for r in ours.rows if r["cosine"] is not None}
    assert {"float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64",
            "bool"} <= dtypes
    assert any(r["nan_mismatch"] for r in ours.rows if r["dtype_my"] == "bfloat16")
    monkeypatch.setattr(E, "_decode", _torch_decode)
    theirs = compare(my, golden, algorithms="all")
    assert len(ours.rows) == len(theirs.rows)
    skip = {"seconds", "gb_per_s"}
    for a, b in zip(ours.rows, theirs.rows, strict=True):
        assert json.dumps(a.as_dict(), default=str) == json.dumps(b.as_dict(), default=str)
    sa = {k: v for k, v in ours.summary.items() if k not in skip}
    sb = {k: v for k, v in theirs.summary.items() if k not in skip}
    assert json.dumps(sa, default=str) == json.dumps(sb, default=str)


_PROBE = """
import json, sys
from accuracy.cli import main
code = main(["compare", "-m", sys.argv[1], "-g", sys.argv[2], "-o", sys.argv[3],
             "--no-progress", "-alg", "all"])
print(json.dumps({"code": code, "torch": sorted(m for m in sys.modules
                                               if m == "torch" or m.startswith("torch."))}))
"""


def test_compare_command_imports_no_torch(mixed, tmp_path):
    my, golden = mixed
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _PROBE, str(my), str(golden), str(tmp_path / "r")],
                       capture_output=True, text=True, env=env, timeout=120,
                       start_new_session=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["code"] in (0, 1), r.stdout  # 1: --fail-on met; 2 would be an error
    assert got["torch"] == []
    assert {"rows.csv", "rows.json", "summary.json", "index.html"} <= {
        p.name for p in (tmp_path / "r").iterdir()}


def test_checksum_fast_paths_equal_the_exact_sum():
    """4- and 8-byte parts are summed in their own width: same value as the exact integer
    sum, wrapped as the dumper stores it, over any split of the bytes."""
    from accuracy.dumpfile.checksum import Checksum

    rng = np.random.default_rng(1)
    for part, view in ((1, np.uint8), (2, np.int16), (4, np.int32), (8, np.int64)):
        raw = rng.integers(0, 256, size=part * 10_007, dtype=np.uint8)
        c = Checksum(part)
        c.update(raw[: part * 501])
        c.update(raw[part * 501:])
        bits = 64 if part == 8 else 32
        exact = sum(int(v) for v in raw.view(view)) % (1 << bits)
        assert c.value == (exact - (1 << bits) if exact >= 1 << (bits - 1) else exact), part


def test_compare_modules_import_one_way():
    """No import circle among accuracy.compare's modules, function-level imports included
    (imports for type checking only are not run, so they don't count)."""
    import ast

    pkg = REPO / "accuracy" / "compare"
    graph: dict[str, set[str]] = {}
    for f in pkg.glob("*.py"):
        deps = set()
        tree = ast.parse(f.read_text())
        typing_only = {id(n) for b in ast.walk(tree) if isinstance(b, ast.If)
                       and getattr(b.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(b)}
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "accuracy.compare":
                    deps.update(a.name for a in node.names)
                elif node.module.startswith("accuracy.compare."):
                    deps.add(node.module.rsplit(".", 1)[1])
        graph[f.stem] = deps & {p.stem for p in pkg.glob("*.py")} - {f.stem}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, " -> ".join((*path, m))
        if m in done:
            return
        for d in graph.get(m, ()):
            visit(d, (*path, m))
        done.add(m)

    for m in graph:
        visit(m, ())


def test_verdict_ranking_is_one_order():
    from accuracy.compare.row import Verdict, worst

    assert [v.rank for v in (Verdict.PASS, Verdict.SKIPPED, Verdict.UNMATCHED,
                             Verdict.WARNING, Verdict.ERROR)] == [0, 0, 1, 2, 3]
    assert worst(["pass", "unmatched", "warning", None]) == Verdict.WARNING
    assert worst([]) == Verdict.PASS
    assert json.dumps({"v": Verdict.ERROR}) == '{"v": "error"}'  # files keep their text


def test_module_rows_keep_one_order_whatever_the_hash_seed(tmp_path):
    """Modules that end at the same op give their rows in one order (inner first) in every
    process: the report of the same dumps is the same file."""
    from torch import nn

    net = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4))))
    with torch.no_grad(), dumper(str(tmp_path / "d.h5")):
        net(torch.randn(2, 4))
    probe = ("import json, sys; from accuracy.compare.align import module_ends; "
             "from accuracy.dumpfile import load_dump; "
             "print(json.dumps([k[0] for k in module_ends(load_dump(sys.argv[1]).records)]))")
    seen = set()
    for seed in ("1", "2", "3", "4"):
        r = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "d.h5")],
                           capture_output=True, text=True, timeout=120, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed})
        assert r.returncode == 0, r.stderr
        seen.add(r.stdout)
    assert len(seen) == 1, seen
    order = json.loads(seen.pop())
    assert order.index("Sequential.0.1") < order.index("Sequential.0")
