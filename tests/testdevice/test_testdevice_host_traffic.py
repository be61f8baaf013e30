"""Host traffic of the dumps on the npu test device, counted by its counters: the budget of
issue 46 item 4, kept by the statistics window (accuracy/dumper/stats_window.py).

Here and not in tests/dumper/ because the device must be registered before the process's
first backward(), which tests/conftest.py does for the tests of this folder.

What a user on an accelerator relies on: a statistics dump of N recorded ops copies its
figures to the host once per window of 64 ops (at most ceil(N/64) copies and waits in one
recorded block: the only other window close is a recorded step leaving the dumper, one per
step), at most 64 bytes a tensor; a tensor dump copies each stored byte once, without
blocking, and waits once per window; the figures are those the per-tensor path gives; a
block that raises mid-window still leaves every recorded op's figures in a readable dump.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

import accuracy.testdevice as testdevice
from accuracy import dumper, load_dump
from accuracy.dumper.stats_window import WINDOW_OPS
from accuracy.dumpfile.stats import tensor_stats
from accuracy.errors import ExtensionUnavailableError


@pytest.fixture(scope="module")
def npu():
    try:
        return testdevice.load()
    except ExtensionUnavailableError as e:
        pytest.skip(f"the npu test device cannot be had here: {e}")


def _inputs(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(16, 16, generator=g) / 4).to(device)
    return w, torch.randn(8, 16, generator=g).to(device)


def _chain(w: torch.Tensor, x: torch.Tensor, n: int) -> None:
    """`n` pairs of recorded ops (mm, tanh), forward only."""
    for _ in range(n):
        x = torch.tanh(x @ w)


def _rows(path) -> tuple[int, int, list]:
    with load_dump(path) as d:
        recs = list(d.records)
        tensors = [t for r in recs for t in (*r.inputs, *r.outputs)]
        ranges = {(t.offset, t.nbytes) for t in tensors if t.nbytes > 0 and t.offset >= 0}
        return len(recs), len(tensors), sorted(ranges)


@pytest.mark.parametrize("pairs", [20, 90])
def test_a_statistics_dump_fetches_its_figures_once_per_window(npu, tmp_path, pairs):
    w, x = _inputs("npu")
    with testdevice.counting() as c, dumper(str(tmp_path / "s.h5"), mode="statistics"):
        _chain(w, x, pairs)
    ops, tensors, _ = _rows(tmp_path / "s.h5")
    assert ops >= 2 * pairs
    windows = math.ceil(ops / WINDOW_OPS)
    assert c["d2h_copies"] == windows  # one per window: at 64 ops and at the block's end
    assert c["syncs_implicit"] + c["syncs_explicit"] <= windows
    assert 0 < c["d2h_bytes"] <= 64 * tensors


def test_a_tensor_dump_copies_each_stored_byte_once_and_never_blocks(npu, tmp_path):
    w, x = _inputs("npu")
    with testdevice.counting() as c, dumper(str(tmp_path / "t.h5"), mode="tensor"):
        _chain(w, x, 90)
    ops, tensors, ranges = _rows(tmp_path / "t.h5")
    stored = sum(n for _, n in ranges)
    windows = math.ceil(ops / WINDOW_OPS)
    assert c["d2h_nonblocking"] == c["d2h_copies"]
    assert c["syncs_implicit"] == 0
    assert c["syncs_explicit"] <= windows
    assert len(ranges) <= c["d2h_copies"] <= len(ranges) + windows
    # the stored bytes once, and at most 64 bytes of figures a tensor beside them
    assert stored <= c["d2h_bytes"] <= stored + 64 * tensors


def _samples() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    base = torch.randn(40, 24, generator=g) * 30
    special = base.clone()
    special[0, :3] = torch.tensor([math.nan, math.inf, -math.inf])
    out = {
        "fp32": base, "fp64": base.double(), "bf16": base.bfloat16(), "fp16": base.half(),
        "int64": base.long(), "int32": base.int(), "int8": base.clamp(-100, 100).to(torch.int8),
        "uint8": base.abs().clamp(0, 255).to(torch.uint8), "bool": base > 0,
        "empty": torch.empty(0, 5), "transposed": base.t(), "strided": base[::3, 1::2],
        "nonfinite fp32": special, "nonfinite bf16": special.bfloat16(),
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            out[name] = base.clamp(-200, 200).to(getattr(torch, name))
    return out


def _dumped_figures(device: str, path) -> dict[str, dict]:
    samples = {k: v.to(device) for k, v in _samples().items()}
    with dumper(str(path), mode="statistics"):
        for t in samples.values():
            t.clone()
    with load_dump(path) as d:
        recs = [r for r in d.records if r.op == "aten.clone.default"]
        assert len(recs) == len(samples)
        return {k: dict(r.outputs[0].stats) for k, r in zip(samples, recs, strict=True)}


def _per_tensor(t: torch.Tensor) -> dict:
    """The per-tensor path's figures, read one tensor at a time (as the writer read them)."""
    floats, checksum = tensor_stats(t)
    values = floats.tolist() if isinstance(floats, torch.Tensor) else list(floats)
    keys = ("min", "max", "mean", "l2", "nan_count", "inf_count")
    return {**dict(zip(keys, values, strict=True)), "checksum": int(checksum)}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_windowed_figures_equal_the_per_tensor_path_for_every_dtype(npu, tmp_path):
    got = _dumped_figures("npu", tmp_path / "npu.h5")
    on_cpu = _dumped_figures("cpu", tmp_path / "cpu.h5")
    for name, t in _samples().items():
        want = _per_tensor(t.to("npu"))
        mine, cpu = got[name], on_cpu[name]
        for key, value in want.items():
            assert _same(mine[key], value), (name, key, mine[key], value)
        # against the CPU dump (numpy and the fused C pass there): counts and sums exact
        for key in ("min", "max", "nan_count", "inf_count", "checksum"):
            assert _same(mine[key], cpu[key]), (name, key, mine[key], cpu[key])
        for key in ("mean", "l2"):
            assert mine[key] == pytest.approx(cpu[key], rel=1e-5, abs=1e-6, nan_ok=True), name


def test_a_block_raising_mid_window_leaves_every_recorded_figure(npu, tmp_path):
    path = tmp_path / "crash.h5"
    w, x = _inputs("npu")
    with pytest.raises(RuntimeError, match="user's bug"), dumper(str(path)):
        _chain(w, x, 40)  # 80 ops: the second window is open when the block raises
        raise RuntimeError("the user's bug")
    with load_dump(path) as d:
        recs = list(d.records)
        assert not d.attrs["complete"]
        assert len(recs) >= 80
        for r in recs:
            for t in (*r.inputs, *r.outputs):
                assert t.stats["nan_count"] == 0 and math.isfinite(t.stats["l2"]), r.op


def test_a_tensor_dump_bigger_than_its_queue_finishes(npu, tmp_path):
    """Copies held by an open window never make the writer wait for the training thread
    while the training thread waits for the writer."""
    done = threading.Event()

    def run() -> None:
        x = torch.ones(256, 1024, device="npu")  # 1 MiB a tensor
        with dumper(str(tmp_path / "big.h5"), mode="tensor", max_pending_bytes=3 << 20):
            for _ in range(12):
                x = x * 1.5
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert done.is_set(), "the tensor dump hung: its window held up the writer"
    with load_dump(tmp_path / "big.h5") as d:
        assert len(d.records) == 12


def test_a_recorded_step_leaving_the_dumper_fetches_its_figures(npu, tmp_path):
    """Between recorded steps the dumper records nothing: the step's last figures are fetched
    as it leaves (the writer writes them then), not held until the block ends."""
    w, x = _inputs("npu")
    with dumper(str(tmp_path / "steps.h5"), steps=[0]) as d:
        _chain(w, x, 5)
        before = testdevice.counters()["d2h_copies"]
        d.step()
        assert testdevice.counters()["d2h_copies"] == before + 1
        _chain(w, x, 5)  # an idle step
    with load_dump(tmp_path / "steps.h5") as dump:
        assert len(dump.records) == 10


def test_the_online_overflow_check_writes_its_births_figures_on_the_device(npu, tmp_path):
    """With check_overflow the recorder is no observer (only births are written through it):
    the dump's close still fetches the births' figures."""
    done = threading.Event()
    x = torch.ones(4, 8).npu()
    zero = torch.zeros(4, 8).npu()

    def run() -> None:
        with dumper(str(tmp_path / "ovf.h5"), check_overflow=True):
            y = x / zero
            for _ in range(3):
                y = y * 2
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert done.is_set(), "the dump's close waited for figures never fetched"
    with load_dump(tmp_path / "ovf.h5") as d:
        births = [r for r in d.records if r.op == "aten.div.Tensor"]
        assert len(births) == 1
        assert births[0].outputs[0].stats["inf_count"] == 32
        assert births[0].inputs[0].stats["max"] == 1.0


def test_a_tensor_dump_of_cpu_and_device_tensors_bigger_than_its_ring_finishes(npu, tmp_path):
    """CPU tensors staged for the writer behind an open window of device figures: the window
    closes before they fill the staging ring (the writer, waiting for the window, would
    never free the ring's slots)."""
    done = threading.Event()

    def run() -> None:
        x = torch.ones(8, device="npu")
        big = torch.ones(256, 1024)  # 1 MiB on CPU
        with dumper(str(tmp_path / "mixed.h5"), mode="tensor", max_pending_bytes=3 << 20):
            for _ in range(8):
                x = x + 1
                big = big * 1.5
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(120)
    assert done.is_set(), "the tensor dump hung: CPU tensors filled the ring behind a window"
    with load_dump(tmp_path / "mixed.h5") as d:
        assert len(d.records) == 16


# -- the live check (accuracy/live/window.py) ------------------------------------------------

def test_the_live_check_waits_for_the_device_once_per_window(npu):
    """Each checked op's inputs and outputs reach the host without waiting; the device is
    waited for once per window of 64 ops (it waited ~3 times per op), and the verdicts are
    the CPU run's."""
    from accuracy import live_check

    counts = {}
    for device in ("cpu", "npu"):
        w, x = _inputs(device)
        with testdevice.counting() as c, live_check(on="cpu") as chk:
            for i in range(90):
                x = torch.tanh(x @ w)
                if i % 30 == 0:  # a host op between them: judged at once, kept in order
                    torch.ones(2).mul(2)
        counts[device] = chk.counts()
        assert [r.seq for r in chk.results] == sorted(r.seq for r in chk.results)
    windows = math.ceil(chk.checked / WINDOW_OPS)
    assert chk.checked > 180  # 90 (mm, tanh) pairs and the host ops
    assert c["d2h_copies"] == c["d2h_nonblocking"] >= 2 * 180  # an mm reads two
    assert c["syncs_implicit"] == 0
    assert c["syncs_explicit"] <= windows
    assert counts["npu"] == counts["cpu"]


def test_a_live_check_stop_still_names_the_faulty_device_op(npu):
    """The window judges late, never wrongly: a fault on the device stops the block at the
    window's end with the faulty op named, and the block's own error is never hidden by it."""
    from accuracy import live_check
    from accuracy.device_backend import sim
    from accuracy.live import LiveCheckError

    fault = sim.fault("aten.tanh.default", kind="bias", value=0.5, occurrence=3)
    w, x = _inputs("npu")
    with pytest.raises(LiveCheckError) as stopped, sim(profile="exact", faults=[fault]), \
            live_check(on="cpu", stop_on="error") as chk:
        _chain(w, x, 10)  # 20 ops: one window, closed when the block ends
    assert stopped.value.result.op == "aten.tanh.default"
    assert [r.op for r in chk.errors()] == ["aten.tanh.default"]
    with pytest.raises(RuntimeError, match="user's bug"), sim(profile="exact", faults=[fault]), \
            live_check(on="cpu", stop_on="error") as chk:
        _chain(w, x, 10)
        raise RuntimeError("the user's bug")
    assert [r.op for r in chk.errors()] == ["aten.tanh.default"]  # judged all the same


def test_ops_that_make_their_outputs_on_the_device_wait_in_the_live_checks_window(npu):
    """`zeros`, `arange`, `full` on the device (masks, positions, optimizer states) read
    nothing of the host's: they are judged in the window like any device op, not read back
    one by one with a wait each (a tiny Llama's step made 14 such waits)."""
    from accuracy import live_check

    counts = {}
    for device in ("cpu", "npu"):
        x = _inputs(device)[1][:, :8]
        with testdevice.counting() as c, live_check(on="cpu") as chk:
            for _ in range(10):
                mask = torch.full((8, 8), float("-inf"), device=device).triu(1)
                pos = torch.arange(8, device=device)
                x = (x + mask[0]).softmax(-1) + torch.zeros(8, device=device) + pos
        counts[device] = chk.counts()
        assert [r.seq for r in chk.results] == sorted(r.seq for r in chk.results)
    assert chk.checked >= 10 * 8
    assert c["syncs_implicit"] == 0
    assert c["syncs_explicit"] <= math.ceil(chk.checked / WINDOW_OPS)
    assert counts["npu"] == counts["cpu"]
