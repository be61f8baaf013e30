"""The cuda backend on a real GPU: host copies, sync, memory, and a dumped training step.

Skipped, with the reason, where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest
import torch

from accuracy.device_backend import backend_for_tensor, backends_table, get_backend

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device: torch.cuda.is_available() is False on this machine",
    ),
]


def test_cuda_backend_detected():
    cuda = get_backend("cuda")
    assert cuda.is_available()
    assert backend_for_tensor(torch.ones(1, device="cuda")) is cuda
    assert (cuda.version() or "").startswith(("CUDA", "HIP"))
    row = {r["name"]: r for r in backends_table()}["cuda"]
    assert row["available"] and row["device"].startswith("cuda:0")
    mem = cuda.memory()
    assert mem is not None and mem["total"] > 0 and "allocated" in mem


def test_cuda_to_host_is_async_private_and_contiguous():
    cuda = get_backend("cuda")
    src = torch.arange(4096.0, device="cuda").reshape(64, 64).t()
    expected = src.cpu()
    pending = cuda.to_host(src)
    # Mutations queued after the copy on the same stream must not reach the snapshot.
    src.mul_(-1)
    host = pending.wait()
    assert host.device.type == "cpu" and host.is_contiguous()
    assert torch.equal(host, expected)
    assert host.is_pinned()
    cuda.synchronize()
    assert torch.equal(src.cpu(), -expected)


def test_dumper_records_a_cuda_training_step(tmp_path):
    accuracy = pytest.importorskip("accuracy")
    if not hasattr(accuracy, "dumper") or not hasattr(accuracy, "load_dump"):
        pytest.skip("accuracy.dumper / load_dump not available yet")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 4)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 32, device="cuda"), torch.randint(0, 4, (8,), device="cuda")
    path = tmp_path / "cuda.h5"
    with accuracy.dumper(dump_path=str(path)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    dump = accuracy.load_dump(path)
    assert dump.attrs["backend"] == "cuda"
    records = dump.records
    ops = {r.op for r in records}
    assert "aten.addmm.default" in ops and "aten.native_layer_norm.default" in ops
    assert {"forward", "backward"} <= {r.phase for r in records}
    first = next(r for r in records if r.op == "aten.addmm.default")
    out = first.outputs[0].load()
    assert out.device.type == "cpu" and out.shape == (8, 64)
    assert torch.isfinite(out).all()
