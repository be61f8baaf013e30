"""Tests that fail when an answer is wrong (issue 20): each checks a value a user acts on
against an independent computation, on inputs where a plausible bug gives a different answer.

`make mutate` (tools/mutants.toml) applies such bugs one at a time and requires these to fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumpfile import stats as dstats
from accuracy.overflow import scan
from accuracy.replay import replay

FP8 = [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None))
       if d is not None]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.mm(x, self.w.t()) + 1.0)


class Chain(nn.Module):
    """Three identical blocks; `skip` leaves the middle one out (an op stream with a gap)."""

    def __init__(self, skip: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blk0, self.blk1, self.blk2 = Block(), Block(), Block()
        self.skip = skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blk0(x)
        if not self.skip:
            h = self.blk1(h)
        return self.blk2(h)


def _x() -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def _dump(path, net: nn.Module | None = None, mode: str = "tensor", **sim_kw):
    net = net or Chain()
    if sim_kw:
        with sim(**sim_kw), torch.no_grad(), dumper(str(path), mode=mode):
            net(_x())
    else:
        with torch.no_grad(), dumper(str(path), mode=mode):
            net(_x())
    return path


def _outputs(rep, verdict=None):
    return [r for r in rep.rows if r["kind"] == "op" and r["io"] == "output"
            and (verdict is None or r["verdict"] == verdict)]


# -- culprit -------------------------------------------------------------------------------------

def test_culprit_is_the_faulty_op_not_the_first_divergence(tmp_path):
    """Three things go wrong on the device run: a small local error in blk0 (harmless
    downstream), a weight of blk1 that differs (its matmul kernel is fine, its output is not)
    and a large kernel error in blk2's relu. The culprit is blk2's relu; the first
    divergence is earlier (blk0's local error or blk1's output, depending on the rule)."""
    gold = _dump(tmp_path / "g.h5")
    net = Chain()
    with torch.no_grad():
        net.blk1.w.mul_(1.1)
    faults = [sim.fault("aten.relu.default", module="*blk0", kind="bias", value=2e-3),
              sim.fault("aten.relu.default", module="*blk2", kind="bias", value=0.3)]
    dev = _dump(tmp_path / "d.h5", net, profile="fp16-cube", faults=faults)
    replay(dev, tmp_path / "r.h5")
    rep = compare(dev, gold, replay=tmp_path / "r.h5")
    first, culprit = rep.summary["first_divergence"], rep.summary["culprit"]
    assert first is not None and culprit is not None, rep.summary["counts"]
    assert (culprit["op"], culprit["module"].split(".")[-1]) == ("aten.relu.default", "blk2")
    assert culprit["local_verdict"] == "error" and culprit["accumulated_verdict"] == "error"
    assert first["index"] < culprit["index"]
    assert first["module"].split(".")[-1] in ("blk0", "blk1")


# -- statistics mode -----------------------------------------------------------------------------

@pytest.mark.parametrize("bias,expected", [(0.05, "error"), (3e-3, "warning")])
def test_statistics_dumps_that_differ_are_flagged(tmp_path, bias, expected):
    gold = _dump(tmp_path / "g.h5", mode="statistics")
    fault = sim.fault("aten.relu.default", module="*blk1", kind="bias", value=bias)
    dev = _dump(tmp_path / "d.h5", mode="statistics", faults=[fault])
    rep = compare(dev, gold)
    flagged = [r for r in _outputs(rep) if r["verdict"] in ("warning", "error")]
    assert flagged, rep.summary["counts"]
    first = flagged[0]
    assert first["op"] == "aten.relu.default" and first["module"].endswith("blk1")
    assert first["verdict"] == expected and "statistics only" in first["message"]
    before = [r for r in _outputs(rep) if r["index"] < first["index"]]
    assert before and all(r["verdict"] == "pass" for r in before)
    # the relative difference of max is the injected bias (relu output max > 0)
    assert first["max_rel_diff"] == pytest.approx(bias, rel=1e-3)


# -- decodes: values, not just "a cosine exists" ------------------------------------------------

def _pair(tmp_path, mine: torch.Tensor, golden: torch.Tensor):
    """Compare dumps whose only op is clone() of `mine` / `golden`: rows of that op's output."""
    for name, t in (("m.h5", mine), ("g.h5", golden)):
        with dumper(str(tmp_path / name)):
            t.clone()
    rep = compare(tmp_path / "m.h5", tmp_path / "g.h5")
    (row,) = _outputs(rep)
    return row


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_bf16_identical_runs_compare_as_identical(tmp_path):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)).bfloat16()
    row = _pair(tmp_path, x, x.clone())
    assert row["cosine"] == pytest.approx(1.0, abs=1e-12) and row["max_abs_err"] == 0
    assert row["verdict"] == "pass"


def test_bf16_known_perturbation_gives_known_errors(tmp_path):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(2)).bfloat16()
    y = x.clone()
    y[100] += 0.5
    row = _pair(tmp_path, y, x)
    # the exact difference at element 100, in float64 from the bf16 values
    assert row["max_abs_err"] == pytest.approx(abs(y[100].double() - x[100].double()).item())
    assert row["cosine"] == pytest.approx(_cos(y.double().numpy(), x.double().numpy()),
                                          abs=1e-12)
    assert row["my_max"] == pytest.approx(y.float().max().item())


def test_bf16_against_fp32_golden_measures_the_rounding(tmp_path):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    row = _pair(tmp_path, x.bfloat16(), x)
    expect = (x.bfloat16().double() - x.double()).abs().max().item()
    assert 0 < row["max_abs_err"] == pytest.approx(expect, rel=1e-9)
    assert row["cosine"] == pytest.approx(_cos(x.bfloat16().double().numpy(),
                                               x.double().numpy()), abs=1e-12)
    assert row["cosine"] > 0.9999 and row["verdict"] == "pass"


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_values_are_decoded(tmp_path, dtype):
    x = torch.randn(512, generator=torch.Generator().manual_seed(4))
    row = _pair(tmp_path, x.to(dtype), x)
    q = x.to(dtype).double()
    assert row["max_abs_err"] == pytest.approx((q - x.double()).abs().max().item(), rel=1e-9)
    assert row["cosine"] == pytest.approx(_cos(q.numpy(), x.double().numpy()), abs=1e-12)
    assert row["verdict"] == "pass"


def test_complex_compares_every_real_and_imaginary_part(tmp_path):
    z = torch.randn(256, dtype=torch.complex64, generator=torch.Generator().manual_seed(5))
    w = z.clone()
    w[-1] = w[-1] + 0.75j  # the very last imaginary part
    row = _pair(tmp_path, w, z)
    assert row["max_abs_err"] == pytest.approx(0.75, rel=1e-6)
    a, b = torch.view_as_real(w).double().numpy().ravel(), torch.view_as_real(z).double(
    ).numpy().ravel()
    assert row["cosine"] == pytest.approx(_cos(a, b), abs=1e-12)


# -- checksums on both paths ---------------------------------------------------------------------

def _wrap(total: int, bits: int) -> int:
    return (total + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def _independent_checksum(t: torch.Tensor) -> int:
    """Sum of the raw bit patterns (signed integers of the element size), wrapped like the
    dumper's (int32, int64 for 8-byte types), computed with Python integers."""
    a = t.contiguous().view(-1)
    if a.is_complex():
        a = torch.view_as_real(a).reshape(-1)
    size = a.element_size()
    ints = a.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
    total = sum(int(v) for v in ints.numpy().astype(object)) if size == 8 else int(
        ints.numpy().astype(np.int64).sum())
    return _wrap(total, 64 if size == 8 else 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.complex64], ids=str)
@pytest.mark.parametrize("n", [1000, 3 * dstats._SMALL + 7], ids=["small", "large"])
def test_checksum_matches_an_independent_sum(tmp_path, dtype, n):
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(n, generator=g, dtype=torch.complex64 if dtype.is_complex else None) * 100
         ).to(dtype)
    with dumper(str(tmp_path / "d.h5"), mode="statistics"):
        x.clone()
    with load_dump(tmp_path / "d.h5") as d:
        got = d.records[0].outputs[0].stats["checksum"]
    assert got == _independent_checksum(x)
    assert got != 0


def test_large_tensor_checksum_tells_one_bit_apart(tmp_path):
    a = torch.randn(4 * dstats._SMALL, generator=torch.Generator().manual_seed(7))
    b = a.clone()
    b[12345] = torch.nextafter(b[12345], torch.tensor(10.0))
    with dumper(str(tmp_path / "d.h5"), mode="statistics"):
        a.clone()
        b.clone()
    with load_dump(tmp_path / "d.h5") as d:
        ca, cb = (r.outputs[0].stats["checksum"] for r in d.records)
    assert abs(cb - ca) == 1  # one step in the last bit of one float32


# -- dedupe: identity and version ----------------------------------------------------------------

def test_a_new_tensor_at_a_reused_address_is_not_linked_to_the_old_one(tmp_path):
    """Python reuses object ids of freed tensors: identity must be checked, not just id()."""
    with dumper(str(tmp_path / "d.h5")):
        for i in range(40):
            t = torch.full((4,), float(i))
            t.neg()
            del t
    with load_dump(tmp_path / "d.h5") as d:
        got = [r.inputs[0].load()[0].item() for r in d.select(op="aten.neg")]
    assert got == [float(i) for i in range(40)]


def test_in_place_change_between_uses_is_recorded(tmp_path):
    x = torch.ones(64)
    with dumper(str(tmp_path / "d.h5")):
        for _ in range(3):
            x.neg()
            x.mul_(2.0)
    with load_dump(tmp_path / "d.h5") as d:
        got = [r.inputs[0].load()[0].item() for r in d.select(op="aten.neg")]
    assert got == [1.0, 2.0, 4.0]


def test_weights_updated_by_unrecorded_ops_are_stored_again(tmp_path):
    """Only matmuls recorded; the optimizer's in-place update is filtered out, so only the
    version counter tells the dumper that the weight changed between the two matmuls."""
    w, x = torch.ones(8, 8), torch.ones(2, 8)
    with dumper(str(tmp_path / "d.h5"), ops="aten.mm"):
        x @ w
        w.add_(1.0)  # not recorded
        x @ w
    with load_dump(tmp_path / "d.h5") as d:
        first, second = d.records
        assert second.inputs[1].load()[0, 0].item() == 2.0
        assert first.inputs[1].load()[0, 0].item() == 1.0


# -- verdicts at known errors --------------------------------------------------------------------

@pytest.mark.parametrize("dtype,rel,expected", [
    (torch.float32, 1e-5, "pass"), (torch.float32, 1e-3, "warning"),
    (torch.float32, 0.1, "error"),
    (torch.float16, 5e-3, "warning"),
    (torch.float16, 0.1, "error"),
    (torch.bfloat16, 4e-2, "warning"), (torch.bfloat16, 0.2, "error"),
], ids=str)
def test_verdict_at_a_known_relative_error(tmp_path, dtype, rel, expected):
    """A tensor scaled by (1 + rel): cosine 1, relative Euclidean distance = rel."""
    x = (torch.rand(2048, generator=torch.Generator().manual_seed(9)) + 1.0).to(dtype)
    y = (x.double() * (1 + rel)).to(dtype)
    row = _pair(tmp_path, y, x)
    assert row["rel_euc_dist"] == pytest.approx(rel, rel=0.1)
    assert row["accumulated_verdict"] == expected, row["message"]


# -- alignment anchored on modules ---------------------------------------------------------------

def test_missing_block_pairs_later_ops_with_their_own_module(tmp_path):
    """My run skips blk1: its blk2 ops must pair with golden's blk2 ops (same module), not with
    golden's blk1 ops that have the same names and shapes and come first."""
    gold = _dump(tmp_path / "g.h5")
    mine = _dump(tmp_path / "m.h5", Chain(skip=True))
    rep = compare(mine, gold)
    with load_dump(gold) as d:
        golden_module = {r.seq: r.module for r in d.records}
    paired = [r for r in _outputs(rep) if r["seq_my"] is not None and r["seq_golden"] is not None]
    assert paired
    for r in paired:
        assert golden_module[r["seq_golden"]].split(".")[-1] == r["module"].split(".")[-1], r
    only_golden = [r for r in _outputs(rep) if r["verdict"] == "unmatched"]
    assert only_golden and all(golden_module[r["seq_golden"]].endswith("blk1")
                               for r in only_golden)


# -- overflow: born vs inherited ----------------------------------------------------------------

def test_overflow_birth_is_the_op_with_finite_inputs(tmp_path):
    x = torch.full((4,), 3e38)
    with dumper(str(tmp_path / "o.h5")):
        y = x * 10.0  # born: finite inputs, inf output
        z = y + 1.0  # inherited
        z.relu()
    rep = scan(tmp_path / "o.h5")
    assert [b.op for b in rep.births] == ["aten.mul.Tensor"]
    assert [f.op for f in rep.inherited] == ["aten.add.Tensor", "aten.relu.default"]
    assert math.isinf(z[0].item())


# -- silently corrupted tensor data -------------------------------------------------------------

def _corrupt_one_data_byte(path) -> int:
    """Flip one byte inside the stored bytes of the largest tensor, in place on disk; returns
    the index (in `Dump.tensors`) of the damaged tensor. The file stays a loadable dump."""
    with load_dump(path) as d:
        i, t = max(((i, t) for i, t in enumerate(d.tensors) if t.has_data and not t.is_link),
                   key=lambda it: it[1].nbytes)
        pos = t.offset + t.nbytes // 2
    import h5py

    with h5py.File(path, "r") as f:
        blob = f["_data/blob"]
        size = blob.chunks[0] if blob.chunks else blob.shape[0]
        if blob.chunks:
            base = blob.id.get_chunk_info_by_coord((pos // size * size,)).byte_offset
        else:
            base = blob.id.get_offset()
    where = base + pos % size
    with open(path, "r+b") as fh:
        fh.seek(where)
        b = fh.read(1)
        fh.seek(where)
        fh.write(bytes([b[0] ^ 0x10]))
    return i


@pytest.fixture
def corrupted(tmp_path):
    path = tmp_path / "c.h5"
    with dumper(str(path)):
        (torch.randn(4096, generator=torch.Generator().manual_seed(8)) * 2).sin()
    with load_dump(path) as d:
        clean = [t.load() for t in d.tensors]
    i = _corrupt_one_data_byte(path)
    with load_dump(path) as d:  # the damage is real: the bytes read back differ
        raw = d.read_bytes(d.tensors[i].offset, d.tensors[i].nbytes, "the damaged tensor")
        assert bytes(raw) != clean[i].contiguous().view(torch.uint8).numpy().tobytes()
    return path, i


def test_flipped_data_byte_is_detected_on_load(corrupted):
    from accuracy.dumpfile import DumpError

    path, i = corrupted
    with load_dump(path) as d, pytest.raises(DumpError):
        d.tensors[i].load()


def test_flipped_data_byte_fails_accuracy_verify(corrupted, capsys):
    from accuracy.cli import main

    path, _ = corrupted
    rc = main(["verify", str(path)])
    out = capsys.readouterr()
    said = out.out + out.err
    assert rc != 0 and "invalid choice" not in said  # a verdict on the file, not a usage error
    assert "c.h5" in said and "damaged" in said


def test_a_nan_does_not_hide_a_difference_as_rounding_noise(tmp_path):
    """[nan, 2] against [nan, 3] in bf16: the NaNs agree, the finite values differ by 50%.
    A NaN makes the max/min statistics NaN; that must not read as 'all values below the zero
    floor' (which passed this pair unjudged)."""
    for name, k in (("golden", 2.0), ("my", 3.0)):
        with dumper(dump_path=tmp_path / f"{name}.h5"):
            b = torch.tensor([float("nan"), 1.0], dtype=torch.bfloat16)
            (b * k).sum()
    rows = compare(tmp_path / "my.h5", tmp_path / "golden.h5").rows
    mul = next(r for r in rows if r["op"] == "aten.mul.Tensor" and r["io"] == "output")
    assert mul["verdict"] == "error", mul["message"]
