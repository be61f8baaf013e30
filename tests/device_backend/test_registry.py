"""Backend registry, detection and host copies, on a machine with only a CPU."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
import torch

from accuracy.device_backend import (
    AcceleratorBackend,
    Backend,
    available_backends,
    backend_for_tensor,
    backends_table,
    get_backend,
    register_backend,
    sim,
)
from accuracy.device_backend import registry as registry_mod

VENDORS = {"npu": "torch_npu", "mlu": "torch_mlu", "musa": "torch_musa"}


@pytest.fixture
def clean_registry():
    saved = dict(registry_mod._REGISTRY)
    yield
    registry_mod._REGISTRY.clear()
    registry_mod._REGISTRY.update(saved)


def test_get_backend_by_name_and_device():
    assert get_backend("cpu").name == "cpu"
    assert get_backend(torch.device("cpu")).name == "cpu"
    assert get_backend("cuda:1").name == "cuda"
    assert get_backend(torch.device("cuda", 0)).name == "cuda"
    assert get_backend(" NPU:3 ").name == "npu"
    assert get_backend("mps").device_type == "mps"
    assert get_backend("sim").name == "sim"
    with pytest.raises(ValueError, match="unknown backend 'tpu'.*known: .*cpu"):
        get_backend("tpu")
    with pytest.raises(TypeError):
        get_backend(3)  # type: ignore[arg-type]


def test_backend_attributes():
    npu = get_backend("npu")
    assert npu.extension == "torch_npu" and npu.device_type == "npu"
    assert npu.sync_env == {"ASCEND_LAUNCH_BLOCKING": "1"}
    assert get_backend("cuda").sync_env == {"CUDA_LAUNCH_BLOCKING": "1"}
    assert get_backend("mlu").sync_env == {"CATCH_ASYNC_DISABLE": "1"}
    assert get_backend("musa").sync_env == {"MUSA_LAUNCH_BLOCKING": "1"}
    for name in ("cpu", "sim", "cuda", "npu", "mlu", "musa", "xpu", "mps"):
        assert get_backend(name).fallback_note, name
    cpu = get_backend("cpu")
    assert cpu.is_available() and cpu.version() == torch.__version__ and cpu.extension is None
    cpu.synchronize()
    assert cpu.memory()["max_rss"] > 0


def test_missing_extensions_are_unavailable_without_import():
    for name, ext in VENDORS.items():
        if importlib.util.find_spec(ext) is not None:
            continue  # really installed here: nothing to check
        if torch._C._get_privateuse1_backend_name() != name:  # not the npu test device
            assert not get_backend(name).is_available()
            assert get_backend(name).memory() is None
        assert ext not in sys.modules  # asking never imports a vendor's extension


def test_backend_for_tensor_and_sim():
    t = torch.ones(2)
    assert backend_for_tensor(t).name == "cpu"
    with sim(profile="exact"):
        assert backend_for_tensor(t).name == "sim"
    assert backend_for_tensor(t).name == "cpu"
    with pytest.raises(ValueError, match="unknown backend 'meta'"):
        backend_for_tensor(torch.ones(1, device="meta"))


def test_available_backends_lists_cpu_and_sim():
    names = [b.name for b in available_backends()]
    assert names[:2] == ["cpu", "sim"]
    assert ("cuda" in names) == torch.cuda.is_available()


def test_backends_table_on_this_machine():
    rows = backends_table()
    keys = {"name", "available", "device", "extension", "version", "sync_env", "memory"}
    assert all(set(r) == keys for r in rows)
    by_name = {r["name"]: r for r in rows}
    assert {"cpu", "sim", "cuda", "npu", "mlu", "musa", "xpu", "mps"} <= set(by_name)
    assert by_name["cpu"]["available"] and by_name["sim"]["available"]
    assert by_name["cpu"]["version"] == torch.__version__
    assert by_name["sim"]["device"] == "cpu (emulated)"
    assert by_name["npu"]["extension"] == "torch_npu"
    assert by_name["npu"]["sync_env"] == {"ASCEND_LAUNCH_BLOCKING": "1"}
    assert by_name["cuda"]["available"] == torch.cuda.is_available()
    assert by_name["cpu"]["memory"]["max_rss"] > 0 and by_name["cpu"]["extension"] is None
    for r in rows:
        assert isinstance(r["available"], bool) and isinstance(r["sync_env"], dict)
        if not r["available"]:
            assert r["memory"] is None
    json.dumps(rows)  # `accuracy backends --json`


def test_cpu_to_host_is_a_private_contiguous_copy():
    src = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous view
    copy = get_backend("cpu").to_host(src)
    assert copy.ready()
    host = copy.wait()
    assert host.is_contiguous() and torch.equal(host, src)
    src.mul_(-1)
    assert host[0, 1] == 4.0, "the copy must not share memory with the source"
    bf = torch.randn(5).bfloat16()
    assert get_backend("cpu").to_host(bf).wait().dtype == torch.bfloat16


def test_to_host_is_invisible_to_sim():
    """The dumper copies from inside its own dispatch handler: sim must not see or fault it."""
    t = torch.ones(3)
    with sim(faults=[sim.fault("aten.clone.default", kind="nan")]) as mode:
        host = backend_for_tensor(t).to_host(t).wait()
    assert mode.calls == 0 and mode.applied == []
    assert torch.equal(host, t)


def test_register_backend_for_new_vendor(clean_registry, monkeypatch):
    """A vendor with a CUDA-like `torch.<dev>` module is one AcceleratorBackend(...) away."""
    events = []

    class Event:
        def record(self):
            events.append("record")

        def synchronize(self):
            events.append("sync")

        def query(self):
            return True

    fake_dev = types.SimpleNamespace(
        is_available=lambda: True,
        synchronize=lambda: events.append("device-sync"),
        Event=Event,
        memory_allocated=lambda: 2**20,
        memory_reserved=lambda: 2**21,
        get_device_name=lambda i: "Fake Chip 1",
    )
    ext = types.ModuleType("torch_fakevendor")
    ext.__version__ = "9.9.9"
    monkeypatch.setitem(sys.modules, "torch_fakevendor", ext)
    monkeypatch.setattr(torch, "fakevendor", fake_dev, raising=False)

    register_backend(AcceleratorBackend(
        "fakevendor", "fakevendor", "torch_fakevendor",
        sync_env={"FAKE_LAUNCH_BLOCKING": "1"}, fallback_note="never falls back",
    ))
    b = get_backend("fakevendor:0")
    assert isinstance(b, Backend) and b.is_available() and b.version() == "9.9.9"
    b.synchronize()
    assert events == ["device-sync"]
    assert b.memory() == {"allocated": 2**20, "reserved": 2**21}
    row = {r["name"]: r for r in backends_table()}["fakevendor"]
    assert row["available"] and row["device"] == "fakevendor:0 (Fake Chip 1)"
    assert row["version"] == "9.9.9" and row["sync_env"] == {"FAKE_LAUNCH_BLOCKING": "1"}
    assert row["memory"] == {"allocated": 2**20, "reserved": 2**21}
    assert "fakevendor" in [x.name for x in available_backends()]
    with pytest.raises(TypeError):
        register_backend("fakevendor")  # type: ignore[arg-type]


def test_async_host_copy_path_with_events(clean_registry, monkeypatch):
    """The event-based copy path, exercised with CPU tensors standing in for device ones."""
    log = []

    class Event:
        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("sync")

        def query(self):
            return False

    ext = types.ModuleType("torch_fakecopy")
    monkeypatch.setitem(sys.modules, "torch_fakecopy", ext)
    monkeypatch.setattr(torch, "cpu_fake_events", types.SimpleNamespace(
        is_available=lambda: True, Event=Event), raising=False)
    b = AcceleratorBackend("fakecopy", "cpu", "torch_fakecopy")
    b.device_type = "cpu"
    b._module = torch.cpu_fake_events  # the torch.<dev> module of this pretend vendor
    src = torch.arange(6.0).reshape(2, 3).t()
    pending = b.to_host(src)
    assert log == ["record"] and not pending.ready()
    host = pending.wait()
    assert log == ["record", "sync"]
    assert host.is_contiguous() and torch.equal(host, src)
    assert host.data_ptr() != src.data_ptr()
    assert pending.wait() is host and log == ["record", "sync"]  # waits once
