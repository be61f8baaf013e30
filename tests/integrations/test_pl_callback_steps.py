"""The monitor under Lightning, numbers checked against Lightning's own: gradients read after
`optimizer.step(closure)` has run the backward, no false non-finite flag at the first step or
after a resume, and with `accumulate_grad_batches` a step is an optimizer step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

L = pytest.importorskip("lightning")

import accuracy.monitor as am  # noqa: E402
from accuracy.integrations import AccuracyLightningCallback  # noqa: E402
from accuracy.monitor.capture import same_bits  # noqa: E402


class Net(L.LightningModule):
    """Records what Lightning itself sees: each batch's training_step loss, and the global
    gradient norm just before each optimizer step (after the closure's backward)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def on_before_optimizer_step(self, optimizer):
        norms = [p.grad.detach().norm() for p in self.parameters() if p.grad is not None]
        self.grad_norms.append(float(torch.linalg.vector_norm(torch.stack(norms))))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _data(n: int):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, generator=g), torch.randn(1, generator=g)) for _ in range(n)]


def _trainer(tmp_path, callbacks, steps, accumulate=1, **kw):
    return L.Trainer(max_steps=steps, accelerator="cpu", callbacks=callbacks, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     accumulate_grad_batches=accumulate, default_root_dir=str(tmp_path), **kw)


def test_gradient_norms_are_the_steps_own_and_step_0_is_not_flagged(tmp_path):
    module = Net()
    path = tmp_path / "pl.monitor.h5"
    cb = AccuracyLightningCallback(monitor={"path": path, "snapshot_every": None})
    _trainer(tmp_path, [cb], 8, enable_checkpointing=False).fit(
        module, torch.utils.data.DataLoader(_data(32), batch_size=4))
    s = am.read_series(path)
    assert list(s.step) == list(range(8))
    np.testing.assert_allclose(s.grad_norm, module.grad_norms, rtol=1e-5)
    assert not [e for e in s.events if e["kind"] == "trigger"]


def test_a_step_is_an_optimizer_step_with_accumulated_batches(tmp_path):
    module = Net()
    path = tmp_path / "acc.monitor.h5"
    cb = AccuracyLightningCallback(monitor={
        "path": path, "snapshot_every": 2,
        "triggers": [am.Predicate(lambda f: f.step == 5, "step-5")]})
    _trainer(tmp_path, [cb], 15, accumulate=2, enable_checkpointing=False).fit(
        module, torch.utils.data.DataLoader(_data(64), batch_size=4))
    s = am.read_series(path)
    assert list(s.step) == list(range(15))  # 30 batches, 15 optimizer steps
    assert s.micro_steps.tolist() == [2] * 15, s.micro_steps
    # the step's loss: the mean of its two batches' losses (the capture re-ran steps 4 and 5
    # from the snapshot of step 4, after step 5: four more training_step calls)
    live = module.losses[:12] + module.losses[16:]
    expected = [(live[2 * i] + live[2 * i + 1]) / 2 for i in range(15)]
    np.testing.assert_allclose(s.loss, expected, rtol=1e-6)
    np.testing.assert_allclose(s.grad_norm, module.grad_norms, rtol=1e-5)  # the re-run
    # calls no Lightning hook
    caps = cb.monitor.captures
    assert [c.step for c in caps] == [5]
    assert caps[0].exact is True and same_bits(caps[0].rerun_loss, float(s.loss[5]))


def test_a_resumed_fit_continues_the_series_without_a_false_flag(tmp_path):
    data = torch.utils.data.DataLoader(_data(48), batch_size=4)
    path = tmp_path / "r.monitor.h5"
    first = Net()
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=5,
                                               save_top_k=-1)
    _trainer(tmp_path, [AccuracyLightningCallback(monitor={"path": path}), ckpt], 8).fit(
        first, data)
    second = Net()
    cb = AccuracyLightningCallback(monitor={"path": path})
    _trainer(tmp_path, [cb], 12).fit(second, data, ckpt_path=str(tmp_path / "ck" /
                                                                  "epoch=0-step=5.ckpt"))
    s = am.read_series(path)
    assert list(s.step) == list(range(12))  # 0-4 from the first fit, 5-11 from the resumed
    assert len(s.segments) == 1
    np.testing.assert_allclose(s.grad_norm[5:], second.grad_norms, rtol=1e-5)
    assert all(math.isfinite(g) for g in s.grad_norm)
    assert not [e for e in s.events if e["kind"] == "trigger"]
