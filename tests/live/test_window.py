"""The live check's window: device ops judged in order, once per window of ops or of bytes,
after one wait per device (the device side is tests/testdevice/test_testdevice_host_traffic.py)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from accuracy.live import window
from accuracy.live.window import CheckWindow


def test_a_window_closes_at_its_op_count_and_judges_in_order():
    w = CheckWindow(max_ops=3, max_bytes=1 << 30)
    assert w.add(lambda: 1) == [] and w.add(lambda: 2) == []
    assert w.add(lambda: 3) == [1, 2, 3]
    assert len(w) == 0 and w.close() == []


def test_a_window_closes_early_once_its_copies_fill_its_bytes():
    w = CheckWindow(max_ops=64, max_bytes=100)
    assert w.add(lambda: "a", nbytes=60) == []
    assert w.add(lambda: "b", nbytes=40) == ["a", "b"]  # 100 bytes held: judged now
    assert w.add(lambda: "c", nbytes=10) == []


def test_the_devices_are_waited_for_once_per_window(monkeypatch):
    waited = []

    class _Backend:
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            waited.append(str(self.device))

    monkeypatch.setattr("accuracy.device_backend.get_backend", _Backend)
    w = CheckWindow(max_ops=4)
    npu = {torch.device("meta")}  # any device but the host's
    for i in range(3):
        w.add(lambda i=i: i, 8, npu)
    assert waited == []
    assert w.add(lambda: 3, 8, npu) == [0, 1, 2, 3]
    assert waited == ["meta"] and w.windows == 1
    w.add(lambda: 4)  # host ops only: nothing to wait for
    assert w.close() == [4] and waited == ["meta"] and w.windows == 1


def test_only_accelerator_tensors_make_an_op_wait_in_the_window():
    def on(kind: str) -> SimpleNamespace:  # what `on_device` reads of a tensor
        return SimpleNamespace(device=SimpleNamespace(type=kind))

    assert not window.on_device([torch.ones(1), torch.empty(1, device="meta")])
    assert window.on_device([torch.ones(1), on("npu")])
    assert window.on_device([on("cuda")]) and not window.on_device([])
