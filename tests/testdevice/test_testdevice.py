"""The npu test device (accuracy/testdevice): an accelerator made of the CPU.

What the tests hold it to: it computes what CPU computes (the same kernels), but as a device
does: asynchronously (a read that does not wait sees stale memory, the proper paths wait), on
addresses the host cannot read, with its own generators, with the optimizer, autocast and
GradScaler behaviour of a CUDA device, and with counters of what crossed to the host.

The conftest loads the device when these tests are collected (building it on a clean clone):
torch's autograd engine only serves devices registered before the process's first backward.
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import accuracy.testdevice as testdevice
from accuracy.errors import ExtensionUnavailableError


@pytest.fixture(scope="module")
def npu():
    try:
        module = testdevice.load()
    except ExtensionUnavailableError as e:
        pytest.skip(f"the npu test device cannot be had here: {e}")
    yield module
    module.set_device(0)
    module.synchronize(0)
    module.synchronize(1)


def _script(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env},
                          start_new_session=True)


class OpNames(TorchDispatchMode):
    """The ATen ops a block ran, by packet name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


# ---- the device and its module ----

def test_registers_as_npu_with_a_torch_module(npu):
    assert torch.npu is npu and testdevice.load() is npu  # idempotent
    assert npu.is_available() and npu.device_count() == 2
    x = torch.arange(3.0).npu()
    assert x.is_npu and x.device == torch.device("npu", 0)
    assert torch.nn.Linear(2, 2).npu().weight.device.type == "npu"
    npu.set_device(1)
    try:
        assert npu.current_device() == 1 and torch.empty(1, device="npu").device.index == 1
        with npu.device(0):
            assert torch.empty(1, device="npu").device.index == 0
        assert npu.current_device() == 1
    finally:
        npu.set_device(0)
    assert npu.is_bf16_supported()
    assert npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.amp.is_autocast_available("npu")


def test_refuses_in_one_line_where_it_cannot_work(npu):
    done = _script("""
        import json, sys, types, torch
        import accuracy.testdevice as td
        from accuracy.errors import ExtensionUnavailableError
        out = {}
        (torch.ones(1, requires_grad=True) * 2).sum().backward()   # before the device
        sys.modules["torch_npu"] = types.ModuleType("torch_npu")   # a real torch_npu loaded
        for case in ("torch_npu", "late", "again"):
            if case == "late":
                del sys.modules["torch_npu"]
            try:
                td.load()
            except ExtensionUnavailableError as e:
                out[case] = str(e)
        print(json.dumps(out))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert "a real torch_npu is loaded" in out["torch_npu"]
    # torch's autograd engine gives device threads only to devices known at the first backward
    assert "backward() ran in this process before the npu test device" in out["late"]
    assert out["again"] == out["late"]
    assert all("\n" not in line for line in out.values())
    done = _script("""
        import torch
        import accuracy.testdevice as td
        torch.utils.rename_privateuse1_backend("foo")               # another backend's key
        td.load()
    """)
    assert done.returncode == 1
    assert "PrivateUse1 is already taken by the backend 'foo'" in done.stderr.splitlines()[-1]


def test_a_forked_child_is_told_it_cannot_use_the_device(npu):
    done = _script("""
        import os, torch
        import accuracy.testdevice as td
        td.load()
        (torch.ones(2, device="npu") + 1).cpu()
        pid = os.fork()
        if pid == 0:
            ok = torch.npu._is_in_bad_fork()
            try:
                torch.ones(1, device="npu") + 1
                ok = False
            except RuntimeError as e:
                ok = ok and "forked child" in str(e)
            os._exit(0 if ok else 1)
        print(os.waitpid(pid, 0)[1], torch.npu._is_in_bad_fork())
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", "False"]


# ---- the same numbers as CPU ----

class _CrossEntropy(torch.nn.Module):
    """A linear head and its cross-entropy loss against fixed classes (a 0-dim output)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        target = torch.tensor([0, 3, 1, 4], device=x.device)
        return torch.nn.functional.cross_entropy(self.head(x), target, label_smoothing=0.1)


def _layers():
    return {
        "linear": (lambda: torch.nn.Linear(6, 4), lambda: torch.randn(3, 6)),
        "layer_norm": (lambda: torch.nn.LayerNorm(6), lambda: torch.randn(3, 6)),
        "gelu_mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(),
                                                 torch.nn.Linear(8, 2)), lambda: torch.randn(3, 6)),
        "conv2d": (lambda: torch.nn.Conv2d(2, 3, 3, padding=1), lambda: torch.randn(2, 2, 5, 5)),
        "embedding": (lambda: torch.nn.Embedding(10, 4), lambda: torch.tensor([[1, 2], [3, 9]])),
        "softmax": (lambda: torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Softmax(-1)),
                    lambda: torch.randn(4, 6)),
        "cross_entropy": (lambda: _CrossEntropy(), lambda: torch.randn(4, 6)),
        "lstm": (lambda: torch.nn.LSTM(4, 5, batch_first=True), lambda: torch.randn(2, 3, 4)),
        "gru": (lambda: torch.nn.GRU(4, 5, num_layers=2), lambda: torch.randn(3, 2, 4)),
    }


@pytest.mark.parametrize("name", list(_layers()))
def test_layers_compute_what_cpu_computes(npu, name):
    build, data = _layers()[name]
    torch.manual_seed(0)
    cpu_model, x = build(), data()
    dev_model = copy.deepcopy(cpu_model).npu()
    outs = []
    for model, inp in ((cpu_model, x), (dev_model, x.npu())):
        out = model(inp)
        out = out[0] if isinstance(out, tuple) else out
        (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
        outs.append((out, [p.grad for p in model.parameters()]))
    (out_c, grads_c), (out_n, grads_n) = outs
    assert out_n.device.type == "npu" and all(g.device.type == "npu" for g in grads_n)
    if name in ("lstm", "gru"):
        # ATen runs fused RNN cells on every device but the CPU: same maths, other rounding
        torch.testing.assert_close(out_n.cpu(), out_c, rtol=1e-5, atol=1e-6)
        for gc, gn in zip(grads_c, grads_n, strict=True):
            torch.testing.assert_close(gn.cpu(), gc, rtol=1e-4, atol=1e-6)
    else:
        assert torch.equal(out_n.cpu(), out_c)
        assert all(torch.equal(gn.cpu(), gc) for gc, gn in zip(grads_c, grads_n, strict=True))


def test_arithmetic_and_autograd_compute_what_cpu_computes(npu):
    torch.manual_seed(1)
    a, b = torch.randn(4, 5), torch.randn(5)

    def f(a, b):
        h = (a * b + 1.5).exp().log1p() / (b.abs() + 0.1) - a @ torch.ones_like(b)[:, None]
        h = torch.where(h > 0, h, h * 0.1).masked_fill(h.isnan(), 0)
        h = torch.cat([h, h.pow(2)], 1).max(dim=1).values.sum() + a.half().float().mean()
        return h

    results = []
    for dev in ("cpu", "npu"):
        x = a.detach().to(dev).requires_grad_()
        y = b.detach().to(dev).requires_grad_()
        out = f(x, y)
        out.backward()
        results.append((out.detach().cpu(), x.grad.cpu(), y.grad.cpu()))
    assert all(torch.equal(c, n) for c, n in zip(*results, strict=True))
    # a Python scalar keeps its weak type: half stays half, as on CPU and CUDA
    assert (torch.ones(2, dtype=torch.half, device="npu") * 2.5).dtype == torch.half
    assert (torch.ones((), dtype=torch.half, device="npu") * 2.5).dtype == torch.half


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 4))


def _train(model, opt, data, steps=3):
    for x, y in data[:steps]:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def test_moving_a_module_keeps_its_parameters_and_their_ties(npu):
    """`module.to("npu")` sets each Parameter's data in place, as on CUDA: a weight tied on CPU
    (an LM's embedding and output layer) stays one Parameter, so its gradient sums both uses."""
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    before = emb.weight
    model.to("npu")
    assert model["emb"].weight is before and model["head"].weight is model["emb"].weight
    assert before.device.type == "npu"
    model.cpu()
    assert model["head"].weight is before and before.device.type == "cpu"


def test_a_training_step_with_adamw_matches_cpu_up_to_its_foreach_kernels(npu):
    torch.manual_seed(2)
    model = _mlp()
    data = [(torch.randn(5, 8), torch.randint(0, 4, (5,))) for _ in range(3)]
    dev_model = copy.deepcopy(model).npu()
    cpu_opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    dev_opt = torch.optim.AdamW(dev_model.parameters(), lr=1e-2)
    with OpNames() as cpu_ops:
        on_cpu = _train(model, cpu_opt, data)
    with OpNames() as dev_ops:
        on_dev = _train(dev_model, dev_opt, [(x.npu(), y.npu()) for x, y in data])
    # on the device AdamW runs its foreach implementation (as on CUDA), per tensor on CPU
    assert any(n.startswith("_foreach_") for n in dev_ops.names)
    assert not any(n.startswith("_foreach_") for n in cpu_ops.names)
    for c, n in zip(on_cpu, on_dev, strict=True):
        torch.testing.assert_close(n, c, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [lambda p: torch.optim.Adam(p, lr=1e-2),
                                  lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)],
                         ids=["adam", "sgd"])
def test_other_optimizers_default_to_foreach_on_npu(npu, make):
    model = _mlp().npu()
    data = [(torch.randn(5, 8, device="npu"), torch.randint(0, 4, (5,), device="npu"))]
    with OpNames() as ops:
        _train(model, make(model.parameters()), data, steps=1)
    assert any(n.startswith("_foreach_") for n in ops.names)


def test_fused_adamw_on_npu_is_cpus_fused_kernel(npu):
    torch.manual_seed(3)
    model = _mlp()
    data = [(torch.randn(5, 8), torch.randint(0, 4, (5,))) for _ in range(2)]
    dev_model = copy.deepcopy(model).npu()
    on_cpu = _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True), data)
    with OpNames() as ops:
        on_dev = _train(dev_model, torch.optim.AdamW(dev_model.parameters(), lr=1e-2, fused=True),
                        [(x.npu(), y.npu()) for x, y in data])
    assert "_fused_adamw_" in ops.names
    assert all(torch.equal(c, n) for c, n in zip(on_cpu, on_dev, strict=True))


def test_a_transformers_model_trains_on_npu(npu):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(4)
    model = transformers.GPT2LMHeadModel(config)
    dev_model = copy.deepcopy(model).to("npu")
    ids = torch.randint(0, 64, (2, 12))
    dev_model.train()  # dropout on: drawn from the device's generator
    out = dev_model(ids.to("npu"), labels=ids.to("npu"))
    out.loss.backward()
    assert torch.isfinite(out.loss).item()
    assert all(p.grad is not None and p.grad.device.type == "npu"
               for p in dev_model.parameters() if p.requires_grad)
    model.eval()
    dev_model.eval()
    with torch.no_grad():
        cpu_logits, dev_logits = model(ids).logits, dev_model(ids.npu()).logits.cpu()
    # attention runs SDPA's math path here, CPU's own flash kernel on CPU: rounding apart
    torch.testing.assert_close(dev_logits, cpu_logits, rtol=1e-5, atol=1e-5)


# ---- asynchronous execution ----

def test_a_read_that_does_not_wait_sees_stale_memory(npu):
    x = torch.zeros(4, device="npu")
    npu.synchronize()
    with testdevice.paused():
        x.add_(1)
        assert torch.equal(testdevice.peek_unsynchronized(x), torch.zeros(4))  # stale
        assert not npu.current_stream().query()
        with pytest.raises(RuntimeError, match="paused by a test hook"):
            x.cpu()  # a wait inside a pause is refused, not a hang
    assert torch.equal(x.cpu(), torch.ones(4))


def _wait_by(how: str, x: torch.Tensor) -> torch.Tensor:
    """Read `x` back the way `how` says, returning its values on the host."""
    if how == "cpu":
        return x.cpu()
    if how == "item":
        return torch.tensor([x[i].item() for i in range(x.numel())])
    if how == "tolist":
        return torch.tensor(x.tolist())
    if how == "synchronize":
        torch.npu.synchronize()
    elif how == "stream":
        torch.npu.current_stream().synchronize()
    elif how == "event":
        event = torch.npu.Event()
        event.record()
        event.synchronize()
    return testdevice.peek_unsynchronized(x)


@pytest.mark.parametrize("how", ["cpu", "item", "tolist", "synchronize", "stream", "event"])
def test_the_paths_that_wait_read_what_the_queue_wrote(npu, how):
    x = torch.zeros(4, device="npu")
    npu.synchronize()
    with testdevice.slowed(5000):  # every kernel starts 5 ms late: a read that did not wait
        for _ in range(5):        # would see fewer than five additions
            x.add_(1)
        assert torch.equal(_wait_by(how, x), torch.full((4,), 5.0))


def test_a_non_blocking_copy_to_pinned_memory_is_done_when_its_event_is(npu):
    x = torch.zeros(1000, device="npu")
    npu.synchronize()
    host = torch.full((1000,), -1.0, pin_memory=True)
    assert host.is_pinned()
    start = npu.Event(enable_timing=True)
    with testdevice.slowed(50000):  # every task, the events' markers too, starts 50 ms late
        start.record()
        x.add_(7)
        host.copy_(x, non_blocking=True)
        event = npu.Event(enable_timing=True)
        event.record()
        assert not event.query()
        assert torch.equal(host, torch.full((1000,), -1.0))  # not yet there: it did not wait
        event.synchronize()
    assert event.query() and torch.equal(host, torch.full((1000,), 7.0))
    assert start.elapsed_time(event) >= 145.0  # ms: three tasks of 50 ms between the markers


def test_host_to_device_copies_keep_their_place_in_the_queue(npu):
    x = torch.full((4,), 3.0, device="npu")
    npu.synchronize()
    pinned = torch.full((4,), 5.0, pin_memory=True)
    with testdevice.slowed(5000):
        doubled = x * 2                       # queued: reads x before the copies below
        x.copy_(torch.full((4,), 4.0))        # blocking: waits for the queue, then writes
        tripled = x * 3
        x.copy_(pinned, non_blocking=True)    # queued in order
        plus_one = x + 1
    assert torch.equal(doubled.cpu(), torch.full((4,), 6.0))
    assert torch.equal(tripled.cpu(), torch.full((4,), 12.0))
    assert torch.equal(plus_one.cpu(), torch.full((4,), 6.0))


def test_a_queued_kernels_error_is_raised_at_the_next_wait(npu):
    x = torch.zeros(3, device="npu")
    bad = torch.tensor([5], device="npu")
    npu.synchronize()
    y = x[bad]  # the index is only read when the kernel runs: no error at the call
    assert y.shape == (1,)
    with pytest.raises(RuntimeError, match="queued earlier failed: aten::index.*out of bounds"):
        npu.synchronize()
    assert torch.equal((x + 1).cpu(), torch.ones(3))  # the error was reported once, cleared
    with testdevice.launch_blocking(), pytest.raises(RuntimeError, match="out of bounds"):
        x[bad]  # blocking launches: raised by the op that queued it


def test_ops_whose_shapes_depend_on_the_data_run_after_a_drain(npu):
    x = torch.tensor([0.0, 2.0, 0.0, 3.0], device="npu")
    with testdevice.counting() as c:
        nz = torch.nonzero(x)
        picked = x[x > 0]
        values = torch.unique(x)
    assert nz.device.type == "npu" and torch.equal(nz.cpu(), torch.tensor([[1], [3]]))
    assert torch.equal(picked.cpu(), torch.tensor([2.0, 3.0]))
    assert torch.equal(values.cpu(), torch.tensor([0.0, 2.0, 3.0]))
    assert c["kernels_sync"] >= 3
    assert {"aten::nonzero", "aten::_unique2"} <= set(c["sync_reasons"])


# ---- addresses the host cannot read ----

def test_data_ptr_is_an_address_the_host_cannot_read(npu):
    with pytest.raises(TypeError, match="npu"):
        torch.ones(2, device="npu").numpy()
    done = _script("""
        import ctypes, sys, torch
        import accuracy.testdevice as td
        td.load()
        t = torch.arange(4.0, device="npu") * 2
        print(t.cpu().tolist(), flush=True)            # the device's own copy works
        print(ctypes.string_at(t.data_ptr(), 4), flush=True)  # a raw host read faults
    """)
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stderr[-3000:])
    assert done.stdout.splitlines() == ["[0.0, 2.0, 4.0, 6.0]"]


# ---- its own random numbers ----

def _draws(dev: str, g: torch.Generator | None) -> dict[str, torch.Tensor]:
    """One draw of each random op on `dev` (from `g`, else the device's default generator)."""
    ones = torch.ones(64, device=dev)
    return {
        "dropout": torch.nn.functional.dropout(ones, 0.5),  # native_dropout: takes no generator
        "bernoulli_": torch.empty(64, device=dev).bernoulli_(0.5, generator=g),
        "normal_": torch.empty(64, device=dev).normal_(generator=g),
        "uniform_": torch.empty(64, device=dev).uniform_(generator=g),
        "randn": torch.randn(64, device=dev, generator=g),
        "randint": torch.randint(0, 1000, (64,), device=dev, generator=g),
        "randperm": torch.randperm(64, device=dev, generator=g),
        "multinomial": torch.multinomial(ones, 16, generator=g),
    }


def test_random_ops_draw_from_the_devices_generator(npu):
    torch.manual_seed(7)
    cpu_state = torch.random.get_rng_state()
    first = {k: v.cpu() for k, v in _draws("npu", None).items()}
    assert torch.equal(torch.random.get_rng_state(), cpu_state)  # CPU's generator untouched
    torch.manual_seed(7)
    again = {k: v.cpu() for k, v in _draws("npu", None).items()}
    torch.manual_seed(7)
    on_cpu = _draws("cpu", None)
    for name in first:
        assert torch.equal(again[name], first[name]), name  # reproducible on the device
        assert not torch.equal(on_cpu[name], first[name]), name  # not CPU's draws
    mine = _draws("npu", torch.Generator(device="npu").manual_seed(11))
    same = _draws("npu", torch.Generator(device="npu").manual_seed(11))
    for name in mine:
        if name != "dropout":
            assert torch.equal(mine[name].cpu(), same[name].cpu()), name


def test_rng_state_saves_and_restores_exactly(npu):
    torch.manual_seed(5)
    torch.randn(10, device="npu")
    state, state1 = npu.get_rng_state(), npu.get_rng_state(1)
    a = torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.3).cpu()
    b = torch.rand(10, device="npu:1").cpu()
    npu.set_rng_state(state)
    npu.set_rng_state(state1, 1)
    assert torch.equal(torch.nn.functional.dropout(torch.ones(100, device="npu"), 0.3).cpu(), a)
    assert torch.equal(torch.rand(10, device="npu:1").cpu(), b)
    states = npu.get_rng_state_all()
    c = torch.rand(3, device="npu").cpu()
    npu.set_rng_state_all(states)
    assert torch.equal(torch.rand(3, device="npu").cpu(), c)
    assert npu.initial_seed() == 5
    with pytest.raises(RuntimeError, match="Expected a 'npu' device type for generator"):
        torch.empty(3, device="npu").normal_(generator=torch.Generator())


# ---- autocast and GradScaler ----

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_like_cudas(npu, dtype):
    x = torch.randn(4, 8, device="npu")
    lin = torch.nn.Linear(8, 8).npu()
    conv = torch.nn.Conv2d(2, 2, 3).npu()
    target = torch.randint(0, 8, (4,), device="npu")
    with torch.autocast("npu", dtype=dtype):
        h = lin(x)
        assert h.dtype == dtype and (x @ x.t()).dtype == dtype
        assert conv(torch.randn(1, 2, 5, 5, device="npu")).dtype == dtype
        assert torch.softmax(h, -1).dtype == torch.float32  # fp32 list, as on CUDA
        assert torch.nn.functional.layer_norm(h, (8,)).dtype == torch.float32
        assert torch.nn.functional.cross_entropy(h, target).dtype == torch.float32
        assert torch.nn.functional.gelu(h).dtype == dtype  # unlisted: runs as it comes
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            torch.nn.functional.binary_cross_entropy(torch.sigmoid(h), torch.rand_like(h))
    assert lin(x).dtype == torch.float32


def test_grad_scaler_scales_steps_and_skips_infinite_grads(npu):
    torch.manual_seed(6)
    model = torch.nn.Linear(4, 2).npu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu", init_scale=256.0, growth_interval=1)
    x = torch.randn(3, 4, device="npu")

    def step(scale_by: float) -> list[torch.Tensor]:
        opt.zero_grad()
        with torch.autocast("npu", dtype=torch.float16):
            loss = model(x).float().sum() * scale_by
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return [p.detach().cpu().clone() for p in model.parameters()]

    before = [p.detach().cpu().clone() for p in model.parameters()]
    after = step(1.0)
    assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert scaler.get_scale() == 512.0  # grew: growth_interval=1
    skipped = step(float("inf"))
    assert all(torch.equal(a, b) for a, b in zip(skipped, after, strict=True))
    assert scaler.get_scale() == 256.0  # backed off, the step skipped


# ---- counters ----

def test_counters_count_copies_syncs_and_kernels(npu):
    host = torch.randn(1000)
    with testdevice.counting() as c:
        x = host.to("npu")
    assert (c["h2d_copies"], c["h2d_bytes"], c["syncs_implicit"]) == (1, 4000, 1)
    assert c["sync_reasons"] == {"copy_ (host to npu)": 1}
    with testdevice.counting() as c:
        y = x * 2 + 1
        v = y.view(10, 100).t().unsqueeze(0)[..., 1:].as_strided((5,), (2,))
        y.unfold(0, 10, 10).transpose(0, 1).diagonal()
    assert c["kernels_queued"] == 2 and c["syncs_implicit"] + c["syncs_explicit"] == 0
    assert c["d2h_copies"] == 0 and v.device.type == "npu"
    with testdevice.counting() as c:
        y.cpu()
        y.sum().item()
    assert (c["d2h_copies"], c["d2h_bytes"], c["syncs_implicit"]) == (2, 4004, 2)
    assert c["sync_reasons"] == {"copy_ (npu to host)": 1, "aten::_local_scalar_dense": 1}
    pinned = torch.empty(1000, pin_memory=True)
    with testdevice.counting() as c:
        pinned.copy_(y, non_blocking=True)
        event = npu.Event()
        event.record()
    assert (c["d2h_copies"], c["d2h_nonblocking"], c["syncs_implicit"]) == (1, 1, 0)
    with testdevice.counting() as c:
        event.synchronize()
        npu.synchronize()
    assert (c["syncs_explicit"], c["syncs_implicit"]) == (2, 0)
    assert c["sync_reasons"] == {"Event.synchronize": 1, "torch.npu.synchronize": 1}
    with testdevice.counting() as outer:
        with testdevice.counting() as inner:
            torch.nonzero(y)
    assert inner == outer and inner["kernels_sync"] == 1
    testdevice.reset_counters()
    after = testdevice.counters()
    assert after["kernels_queued"] == 0 and after["sync_reasons"] == {}


# ---- metadata, memory, printing, several devices ----

def test_views_resize_set_and_printing_stay_on_the_host(npu):
    base = torch.arange(6.0, device="npu")
    with testdevice.counting() as c:
        grown = base.clone()
        grown.resize_(10)
        other = torch.empty(0, device="npu").set_(base.untyped_storage(), 2, (2, 2), (2, 1))
        real = torch.view_as_real(torch.zeros(3, dtype=torch.complex64, device="npu"))
    assert c["syncs_implicit"] == 0
    assert torch.equal(grown[:6].cpu(), torch.arange(6.0))  # resize_ kept the values
    assert torch.equal(other.cpu(), torch.tensor([[2.0, 3.0], [4.0, 5.0]]))
    assert real.shape == (3, 2) and real.device.type == "npu"
    host = torch.empty(0)
    torch.ops.aten._copy_from_and_resize(base, host)  # what fallbacks use to copy results back
    assert torch.equal(host, torch.arange(6.0))
    text = repr(base)
    assert "device='npu:0'" in text and "5." in text
    torch.testing.assert_close(base, torch.arange(6.0), check_device=False)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(base, torch.arange(6.0, device="npu") + 1)


def test_storages_and_serialization(npu):
    storage = torch.UntypedStorage(16, device="npu")  # the allocator torch asks for by type
    assert storage.device == torch.device("npu", 0) and storage.size() == 16
    t = torch.arange(4.0, device="npu")
    t.untyped_storage().resize_(32)  # the hooks' resize: the values are kept
    assert torch.equal(t.cpu(), torch.arange(4.0))
    buf = io.BytesIO()
    torch.save({"w": t, "on1": torch.ones(2, device="npu:1")}, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert back["w"].device == torch.device("npu", 0) and torch.equal(back["w"].cpu(), t.cpu())
    assert back["on1"].device == torch.device("npu", 1)


def test_memory_is_counted_and_freed_in_queue_order(npu):
    npu.synchronize()
    before = npu.memory_allocated()
    t = torch.empty(1 << 20, device="npu")  # 4 MiB
    assert npu.memory_allocated() - before >= 4 << 20
    del t
    npu.synchronize()
    assert npu.memory_allocated() == before
    free, total = npu.mem_get_info()
    assert 0 < free <= total


def test_tensors_of_two_devices_or_of_the_host_are_refused_like_cuda(npu):
    a = torch.ones(3, device="npu:0")
    b = torch.ones(3, device="npu:1")
    with pytest.raises(RuntimeError, match="npu:0 and npu:1"):
        a + b
    with pytest.raises(RuntimeError, match="npu:0 and cpu"):
        a + torch.ones(3)
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))  # a CPU scalar
    assert torch.equal(b.to("npu:0").cpu(), torch.ones(3))
    assert (b * 2).device == torch.device("npu", 1)
