"""Every figure the monitor writes is its own module's: checked against plain forward hooks
over many steps of models whose freed outputs come back at the same addresses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import accuracy.monitor as am


class _Residual(nn.Module):
    """`x + proj(x)`: proj's output is freed by the add (add keeps no inputs for backward), so
    the next block's proj output of the same size is allocated where it was."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return x + self.proj(x)


class _Stack(nn.Module):
    def __init__(self, d: int = 16, blocks: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(_Residual(d) for _ in range(blocks))
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _reference_hooks(model: nn.Module, names: list[str]) -> tuple[dict[str, list[float]], list]:
    """Each module's output norm as a plain forward hook computes it (L2 over the float
    outputs and over the calls of a step)."""
    sq: dict[str, list[float]] = {}
    mods = dict(model.named_modules())
    handles = []
    for label in names:
        mod = mods["" if label == "(root)" else label]

        def hook(_m, _a, out, label=label):
            leaves = [t for t in torch.utils._pytree.tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
            if leaves:
                with torch.no_grad():
                    sq.setdefault(label, []).append(
                        sum(float(torch.linalg.vector_norm(t.double())) ** 2 for t in leaves))
        handles.append(mod.register_forward_hook(hook))
    return sq, handles


def _mismatches(model, step_fn, batches, tmp_path) -> tuple[int, int, list[str]]:
    path = tmp_path / "f.monitor.h5"
    mon = am.Monitor(model, None, path=path, snapshot_every=None, triggers=None)
    sq, handles = _reference_hooks(model, mon.collector.module_names)
    expected: list[dict[str, float]] = []
    for batch in batches:
        sq.clear()
        mon.begin_step()
        step_fn(batch)
        mon.end_step()
        expected.append({k: math.sqrt(sum(v)) for k, v in sq.items()})
    mon.close()
    for h in handles:
        h.remove()
    s = am.read_series(path)
    names, act = s.figure("module", "act_norm")
    bad, checked = [], 0
    for row, exp in enumerate(expected):
        for j, name in enumerate(names):
            if name not in exp:
                continue
            checked += 1
            if not np.isclose(act[row, j], exp[name], rtol=1e-4, atol=1e-6, equal_nan=True):
                bad.append(f"step {row} {name}: monitor {act[row, j]:.6g}, hook {exp[name]:.6g}")
    return len(bad), checked, bad


@pytest.mark.parametrize("rows,d", [(8, 16), (300, 256)])
def test_every_module_figure_is_its_own_over_40_steps_of_reused_allocations(tmp_path, rows, d):
    """Small outputs (reduced in batches, held by reference) and outputs over the holding
    bound (300 KB: reduced at once, and known again only by identity, never by address)."""
    model = _Stack(d)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    g = torch.Generator().manual_seed(0)
    # each step's scale differs, so a figure taken from another module or step shows
    batches = [(torch.randn(rows, d, generator=g) * (1 + i % 7),
                torch.randn(rows, 1, generator=g)) for i in range(40)]
    n_bad, checked, bad = _mismatches(model, step, batches, tmp_path)
    assert checked >= 40 * 13
    assert n_bad == 0, bad[:5]


def test_every_module_figure_of_a_transformers_qwen2_is_its_own(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(ids):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (2, 12), generator=g) for _ in range(30)]
    n_bad, checked, bad = _mismatches(model, step, batches, tmp_path)
    assert checked >= 30 * 20
    assert n_bad == 0, bad[:5]


def test_a_step_without_gradients_is_not_flagged_non_finite(tmp_path):
    """A step with no gradient at all (a forward-only step, an optimizer step whose closure
    never ran) has its gradient norm not measured, not NaN."""
    model = _Stack()
    watched = am.watch(lambda x: model(x).sum(), model, None, path=tmp_path / "g.monitor.h5",
                       snapshot_every=None)
    with torch.no_grad():
        for _ in range(3):
            watched(torch.randn(2, 16))
    watched.monitor.close()
    s = am.read_series(tmp_path / "g.monitor.h5")
    assert np.isnan(s.grad_norm).all() and np.isfinite(s.loss).all()
    assert not [e for e in s.events if e["kind"] == "trigger"]


@pytest.mark.parametrize("path", ["cpp", "torch"])
def test_bf16_outputs_under_autocast_have_float32_norms(tmp_path, monkeypatch, path):
    """A bf16 output's norm is accumulated and kept in float32 or wider (the C++ module's
    double, torch's path float32): in bf16 it keeps 3 significant digits (31.94 reads 32.0),
    a figure off by up to 0.4%."""
    from accuracy.native import fastpath

    if path == "torch":
        _without_cpp_module(monkeypatch)
    elif fastpath.loaded() is None:
        pytest.skip("no C++ toolchain: the statistics module is not built")
    model = _Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g))
               for _ in range(30)]
    path = tmp_path / "bf16.monitor.h5"
    mon = am.Monitor(model, None, path=path, snapshot_every=None, triggers=None)
    sq, handles = _reference_hooks(model, mon.collector.module_names)
    expected = []
    for b in batches:
        sq.clear()
        mon.begin_step()
        step(b)
        mon.end_step()
        expected.append({k: math.sqrt(sum(v)) for k, v in sq.items()})
    mon.close()
    names, act = am.read_series(path).figure("module", "act_norm")
    got = np.array([[act[r, j] for j, n in enumerate(names) if n in e]
                    for r, e in enumerate(expected)])
    want = np.array([[e[n] for n in names if n in e] for e in expected])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _reference_row(t: torch.Tensor) -> tuple[float, float, float, float, float]:
    """(norm, min, max, nan, inf) computed in float64 with torch, one figure at a time."""
    d = t.detach().double()
    if d.numel() == 0:
        return (0.0, math.nan, math.nan, 0.0, 0.0)
    return (float(torch.linalg.vector_norm(d)), float(d.min()), float(d.max()),
            float(torch.isnan(d).sum()), float(torch.isinf(d).sum()))


def _figure_cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(64, 48, generator=g)
    wide[:, 1::2] = 1e4  # what a read of the raw memory would see, and the view does not
    nan = torch.randn(300, generator=g)
    nan[7] = math.nan
    inf = torch.randn(300, generator=g)
    inf[3], inf[9] = math.inf, -math.inf
    return {
        "fp32": torch.randn(4, 64, 128, generator=g),
        "fp64": torch.randn(513, generator=g, dtype=torch.float64) * 1e3,
        "bf16": torch.randn(1000, generator=g).bfloat16(),
        "fp16": torch.randn(1000, generator=g).half(),
        "nan": nan, "inf": inf,
        "strided": wide[:, ::2],
        "transposed": torch.randn(32, 64, generator=g).t(),
        "empty": torch.empty(0, 5),
        "one": torch.tensor([-2.5]),
    }


def _rows_of(ts: list[torch.Tensor]) -> list[tuple[float, ...]]:
    from accuracy.monitor import figures

    red = figures._Reductions()
    red.add(ts)
    f, c = figures._read_back(red.floats, red.ints)
    return list(zip(*figures._columns(red, f, c), strict=True))


@pytest.fixture(autouse=True, scope="module")
def _cpp_path_resolved():
    """The monitor loads the C++ module on a thread of its own: resolved here first, so which
    path a test's figures take does not depend on how far that thread got."""
    from accuracy.native import fastpath

    fastpath.load()


class _NormsSpy:
    """The C++ module with its `norms` counting the elements of every tensor it measures."""

    def __init__(self, ext, offered: list[int]) -> None:
        self.ext, self.offered = ext, offered

    def norms(self, ts):
        vals, declined = self.ext.norms(ts)
        skip = set(declined)
        self.offered.extend(t.numel() for i, t in enumerate(ts)
                            if i not in skip and not math.isnan(vals[3 * i]))
        return vals, declined


def _offered_to_native_pass(monkeypatch) -> list[int]:
    """The element count of every tensor a native pass reads from now on (the C++ module's
    where it is built, else the C kernels')."""
    from accuracy import native
    from accuracy.native import fastpath

    offered: list[int] = []
    real = native.stats_passes

    def spy(blocks, build=True):
        offered.extend(n for _, n, _ in blocks)
        return real(blocks, build)

    monkeypatch.setattr(native, "stats_passes", spy)
    ext = fastpath.loaded()
    if ext is not None:
        monkeypatch.setattr(fastpath, "_resolved", [_NormsSpy(ext, offered)])
    return offered


def _without_cpp_module(monkeypatch) -> None:
    from accuracy.native import fastpath

    monkeypatch.setattr(fastpath, "_resolved", [None])


def test_the_native_pass_gives_the_figures_of_the_torch_path(monkeypatch):
    """The monitor's one-pass native figures (contiguous fp32/fp64 on CPU) equal the torch
    path's and float64 references, for every kind of tensor, in one batch with the tensors it
    leaves to torch (16-bit, NaN/inf, non-contiguous views, empty); the native pass is offered
    the tensors it can read and no other."""
    from accuracy import native

    if native.kernels() is None:
        pytest.skip("no C compiler: the native pass is not built")
    _without_cpp_module(monkeypatch)  # the C kernels' pass (the C++ module's: below)
    cases = _figure_cases()
    names, ts = list(cases), list(cases.values())
    taken = _offered_to_native_pass(monkeypatch)
    fast = _rows_of(ts)
    # offered: every contiguous fp32/fp64 tensor (NaN/inf ones come back declined)
    assert sorted(taken) == sorted(cases[n].numel() for n in ("fp32", "fp64", "one", "nan",
                                                              "inf"))
    monkeypatch.setattr(native, "_resolved", [None])  # the kernels unavailable: torch only
    slow = _rows_of(ts)
    for name, t, a, b in zip(names, ts, fast, slow, strict=True):
        ref = _reference_row(t)
        rtol = 1e-2 if t.dtype in (torch.bfloat16, torch.float16) else 1e-6
        for got in (a, b):
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=0, equal_nan=True,
                                       err_msg=name)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0, equal_nan=True, err_msg=name)


def test_the_cpp_module_gives_the_figures_of_the_torch_path(monkeypatch):
    """The C++ module's figures (accuracy/native/stats.cpp `norms`: one call for the step's
    tensors, fp16 and bf16 too, over torch's threads) equal float64 references, and the
    torch path's for what it declines (NaN/inf, non-contiguous views, empty): every tensor
    of one batch; the same bits at one thread and at two."""
    from accuracy.native import fastpath

    if fastpath.loaded() is None:
        pytest.skip("no C++ toolchain: the statistics module is not built")
    cases = _figure_cases() | {"large": torch.randn(5 * (1 << 16) + 3) * 7}  # many chunks
    names, ts = list(cases), list(cases.values())
    taken = _offered_to_native_pass(monkeypatch)
    rows = _rows_of(ts)
    native_ones = ("fp32", "fp64", "bf16", "fp16", "one", "large")
    assert sorted(taken) == sorted(cases[n].numel() for n in native_ones)
    for name, t, got in zip(names, ts, rows, strict=True):
        np.testing.assert_allclose(got, _reference_row(t), rtol=1e-12 if name in native_ones
                                   else 1e-6, atol=0, equal_nan=True, err_msg=name)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _rows_of(ts)
    finally:
        torch.set_num_threads(before)
    assert np.array_equal(np.array(one), np.array(rows), equal_nan=True)


def test_parameter_and_state_norms_take_the_native_pass_or_torch_alike(monkeypatch):
    from accuracy import native
    from accuracy.monitor import figures

    if native.kernels() is None:
        pytest.skip("no C compiler: the native pass is not built")
    ts = list(_figure_cases().values())
    from accuracy.native import fastpath

    has_cpp = fastpath.loaded() is not None
    cpp = figures._read_back(figures._norm_values(ts), [])[0]
    _without_cpp_module(monkeypatch)
    fast = figures._read_back(figures._norm_values(ts), [])[0]
    monkeypatch.setattr(native, "_resolved", [None])
    slow = figures._read_back(figures._norm_values(ts), [])[0]
    ref = [_reference_row(t)[0] for t in ts]
    np.testing.assert_allclose(fast, ref, rtol=1e-2, equal_nan=True)
    np.testing.assert_allclose(fast[:2], ref[:2], rtol=1e-6)  # fp32, fp64: native, exact
    np.testing.assert_allclose(fast, slow, rtol=1e-2, equal_nan=True)
    np.testing.assert_allclose(cpp, ref, rtol=1e-6, equal_nan=True)
    if has_cpp:  # fp32, fp64, bf16, fp16 through the C++ module, summed in double
        np.testing.assert_allclose(cpp[:4], ref[:4], rtol=1e-12)


def test_on_an_accelerator_a_step_reads_its_figures_back_once(tmp_path):
    """On the npu test device (asynchronous, host reads counted) the figures stay on the
    device until the step's one read-back: the CPU-only native pass adds no read per tensor,
    and the figures are those of the model's outputs."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, "-m", "tests._support.monitor_device_worker",
                           str(tmp_path)], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "unavailable" in got:
        pytest.skip(got["unavailable"])
    assert got["d2h_copies"] == got["steps"]  # one copy to the host per step
    assert all(math.isfinite(v) and v > 0 for v in got["act_norm"])
    assert math.isfinite(got["grad_norm"]) and got["grad_norm"] > 0


class _InPlaceAfter(nn.Module):
    """A Linear whose output an in-place ReLU (a module) changes, then the parent adds to in
    place (`y += 1`, no module): read after the module returned, its values are no longer the
    Linear's output."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(d, d)
        self.act = nn.ReLU(inplace=True)
        self.lin2 = nn.Linear(d, d)
        self.head = nn.Linear(d, 1)
        self.shift_from: int | None = None  # from this call on, lin2's output is shifted
        self.calls = 0

    def forward(self, x):
        h = self.act(self.lin(x))
        y = self.lin2(h)
        if self.shift_from is None or self.calls >= self.shift_from:
            y += 1.0
        self.calls += 1
        return self.head(y)


def _train(model: nn.Module):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step(batch):
        x, y = batch
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return step


def _batches(n: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=g) * (1 + i % 5), torch.randn(8, 1, generator=g))
            for i in range(n)]


def test_outputs_changed_in_place_after_their_module_keep_their_own_figures(tmp_path):
    """Small outputs are reduced in batches after their module returned: a module whose
    output is then changed in place (an in-place ReLU, `y += 1`) is still measured as it
    returned, on every step from the first (never NaN, never the changed values)."""
    model = _InPlaceAfter()
    n_bad, checked, bad = _mismatches(model, _train(model), _batches(20), tmp_path)
    assert checked >= 20 * 5
    assert n_bad == 0, bad[:5]


def test_an_output_changed_in_place_only_later_is_not_measured_rather_than_wrong(tmp_path):
    """A module whose outputs stayed unchanged is reduced in a batch after it returned; when
    its output is changed in place on a later step before that pass, the figure of that step
    is NaN and said in an event, never the changed values, and the next steps are measured
    as the module returns them."""
    model = _InPlaceAfter()
    model.shift_from = 6  # lin2's output is left alone on steps 0-5 (so batched), then not
    n_bad, checked, bad = _mismatches(model, _train(model), _batches(12), tmp_path)
    s = am.read_series(tmp_path / "f.monitor.h5")
    names, act = s.figure("module", "act_norm")
    lin2 = names.index("lin2")
    assert np.isnan(act[6, lin2]) and np.isfinite(np.delete(act[:, lin2], 6)).all()
    assert bad == [f"step 6 lin2: monitor nan, hook {bad[0].split('hook ')[1]}"]
    assert n_bad == 1 and checked >= 12 * 5
    said = [e for e in s.events if e["kind"] == "not-measured" and "in place" in e["message"]]
    assert [(e["step"], e["modules"]) for e in said] == [(6, ["lin2"])]


def test_outputs_held_for_the_batched_pass_stay_bounded(tmp_path):
    """The small outputs held for a batched pass are passed over once they reach about a
    MiB: outputs the forward frees are not all kept alive to the step's end."""
    import weakref

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(40)])  # 128 KiB outputs
    mon = am.Monitor(model, None, path=tmp_path / "m.monitor.h5", snapshot_every=None,
                     triggers=None)
    refs: list = []
    handles = [m.register_forward_hook(lambda _m, _a, out: refs.append(weakref.ref(out)))
               for m in model]
    most = 0
    for _ in range(3):
        refs.clear()
        mon.begin_step()
        with torch.no_grad():
            out = model(torch.randn(128, 256))
        most = max(most, sum(r() is not None for r in refs))
        mon.end_step(out.sum())
    mon.close()
    for h in handles:
        h.remove()
    assert most <= 11, most  # 1 MiB of 128 KiB outputs, one more, and the model's output


_FREED_SCRIPT = """
import math, sys
import torch
from torch import nn
import accuracy.monitor as am

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
freed = nn.Parameter(torch.randn(64))
model.register_parameter("freed", freed)  # FSDP frees an unsharded parameter so, between uses
opt = torch.optim.SGD([p for n, p in model.named_parameters() if n != "freed"], lr=0.1)

def train_step(x):
    loss = model(x).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss

step = am.watch(train_step, model, opt, path=sys.argv[1], detail_every=1, snapshot_every=None)
freed.data.untyped_storage().resize_(0)
for i in range(3):
    step(torch.randn(3, 4))
step.monitor.close()
s = am.read_series(sys.argv[1])
i = s.param_names.index("freed")
assert all(math.isnan(v) for v in s.param["norm"][:, i]), s.param["norm"][:, i]
assert all(math.isfinite(v) for v in s.param["norm"][:, s.param_names.index("0.weight")])
print("trained")
"""


def test_a_parameter_whose_storage_was_freed_is_not_measured_and_training_goes_on(tmp_path):
    """FSDP frees each unsharded parameter by resizing its storage to 0. Its figures (the
    parameter norm, every detail step) read NaN, not measured, where reading its address 0
    killed the user's process (the native pass, and torch's own vector_norm). A child process:
    the old failure was a segfault."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FREED_SCRIPT, str(tmp_path / "f.monitor.h5")],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0 and "trained" in out.stdout, (out.returncode, out.stderr[-800:])


class _Narrow(nn.Module):
    """Returns the first rows of its Linear's output: another tensor at the same address."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x)[:4]


class _Passing(nn.Module):
    """Returns its Linear's output itself, in a tuple (as an attention block returns its
    output projection's)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return self.lin(x), None


class _SharedOutputs(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.narrow = _Narrow(d)
        self.passing = _Passing(d)
        self.head = nn.Linear(d, 1)

    def forward(self, x):
        y, _ = self.passing(self.narrow(x))
        return self.head(y)


def test_a_tensor_returned_again_by_its_container_is_passed_over_once(tmp_path, monkeypatch):
    """A container returning its child's output (the tensor itself, or in a tuple) shares
    the child's figure, and the step's pass reads that tensor once; another tensor at the
    same address (a view of the first rows) keeps its own figure."""
    from accuracy import native

    if native.kernels() is None:
        pytest.skip("no C compiler: the native pass is not built")
    model = _SharedOutputs()
    offered = _offered_to_native_pass(monkeypatch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    per_step: list[int] = []

    def step(batch):  # the values offered in the monitored step before (its end included)
        per_step.append(sum(offered))
        offered.clear()
        x, y = batch
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y[:4]).backward()
        opt.step()

    n_bad, checked, bad = _mismatches(model, step, _batches(12), tmp_path)
    assert checked >= 12 * 6
    assert n_bad == 0, bad[:5]
    # narrow.lin 8x16, narrow 4x16, passing.lin 4x16 (passing's tuple: the same tensor),
    # head 4x1 (the root's output: the same tensor), then every gradient
    params = sum(p.numel() for p in model.parameters())
    once = 128 + 64 + 64 + 4 + params
    # steps 3-9; step 10 reads the parameters' norms too (every 10th step)
    assert per_step[4:] == [once] * 7 + [once + params], per_step


def test_a_tensor_is_known_again_only_while_it_lives():
    """A tensor measured already is known again by its identity, checked through a weak
    reference: a later output that CPython gives the freed one's id (and the same version)
    is measured as itself, never given the freed one's figure."""
    from accuracy.monitor import figures

    col = figures.Collector(nn.Sequential(nn.Identity(), nn.Identity()))
    first, second = col.module_names.index("0"), col.module_names.index("1")
    n, calls, reused = 70_000, 50, 0  # 280 KB: over the holding bound, measured at once
    col.start(detail=False)
    for _ in range(calls):
        a = torch.full((n,), 1.0)
        col._measure(first, a)
        freed_id = id(a)
        del a
        b = torch.full((n,), 2.0)
        reused += id(b) == freed_id
        col._measure(second, b)
        del b
    figs = col.collect()
    col.close()
    assert reused > 0  # the case this test is about did happen
    norms = dict(zip(col.module_names, figs["module"]["act_norm"], strict=True))
    assert norms["0"] == pytest.approx(math.sqrt(n * calls))
    assert norms["1"] == pytest.approx(2 * math.sqrt(n * calls))


class _Ragged(nn.Module):
    """A module returning a nested tensor (ragged rows, as a packed-sequence model would)."""

    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.layout = layout

    def forward(self, x):
        y = self.proj(x)
        return torch.nested.as_nested_tensor([y[0:2], y[2:5]], layout=self.layout)


class _RaggedModel(nn.Module):
    def __init__(self, layout: torch.layout) -> None:
        super().__init__()
        self.ragged = _Ragged(layout)

    def forward(self, x):
        return sum(part.square().sum() for part in self.ragged(x).unbind())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged])
def test_a_nested_tensor_output_is_measured_by_its_components(tmp_path, caplog, layout):
    """A module returning a nested tensor gets the figures of its components taken together
    (norm over every element, min, max), as a tuple of them would; before, every step logged
    a traceback and the module read NaN."""
    torch.manual_seed(0)
    model = _RaggedModel(layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    want = []

    def step(x):
        opt.zero_grad()
        loss = model(x)
        loss.backward()
        opt.step()
        return loss

    hook = model.ragged.register_forward_hook(lambda m, a, out: want.append(
        torch.cat([p.detach().reshape(-1).double() for p in out.unbind()])))
    path = tmp_path / "nested.monitor.h5"
    watched = am.watch(step, model, opt, path=path, snapshot_every=None, triggers=None)
    with caplog.at_level("ERROR"):
        for _ in range(4):
            watched(torch.randn(5, 6))
    watched.monitor.close()
    hook.remove()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    s = am.read_series(path)
    for fig, ref in (("act_norm", lambda v: float(v.norm())), ("act_min", lambda v: float(v.min())),
                     ("act_max", lambda v: float(v.max()))):
        names, values = s.figure("module", fig)
        col = names.index("ragged")
        np.testing.assert_allclose(values[:, col], [ref(v) for v in want], rtol=1e-6)


def test_finite_values_whose_squares_overflow_keep_a_finite_norm():
    """Values too large to square in their sum's type (fp32 above about 1.8e19 where torch's
    path sums fp32 in fp32: a non-contiguous view; fp64 near 1e200 in any path) read their
    true norm with no NaN or inf counted; before, the norm read inf beside counts of 0, and a
    diverging run read "non-finite" with no inf value in it."""
    big32 = torch.full((8, 4), 3e20).t()  # transposed: torch's path
    big64 = torch.full((6,), -2e200, dtype=torch.float64)
    for t, want in ((big32, 3e20 * math.sqrt(32)), (big64, 2e200 * math.sqrt(6))):
        [(norm, lo, hi, nans, infs)] = _rows_of([t])
        assert norm == pytest.approx(want, rel=1e-6)
        assert (nans, infs) == (0.0, 0.0) and lo == hi
