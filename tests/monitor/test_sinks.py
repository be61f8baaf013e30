"""The monitor's scalars in the viewers users already open: TensorBoard event files (read back
with TensorBoard's own reader) from a plain loop and from Lightning's logger."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import accuracy.monitor as am

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def _read(folder) -> EventAccumulator:
    ea = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    return ea


def test_tensorboard_gets_loss_grad_norm_the_triggers_figures_and_events(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    fires = am.Predicate(lambda f: "layer 2 too large" if f.step == 4 else None, "big",
                         figures=["module/act_norm"])
    watched = am.watch(step, model, opt, path=tmp_path / "m.monitor.h5", snapshot_every=None,
                       triggers=[am.NonFinite(), fires], tensorboard=tmp_path / "tb")
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        watched(torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g))
    watched.monitor.close()
    s = am.read_series(tmp_path / "m.monitor.h5")
    ea = _read(tmp_path / "tb")
    scal = ea.Tags()["scalars"]
    assert [e.step for e in ea.Scalars("monitor/loss")] == list(range(6))
    np.testing.assert_allclose([e.value for e in ea.Scalars("monitor/loss")], s.loss, rtol=1e-6)
    np.testing.assert_allclose([e.value for e in ea.Scalars("monitor/grad_norm")], s.grad_norm,
                               rtol=1e-6)
    names, act = s.figure("module", "act_norm")
    for j, name in enumerate(names):
        got = [e.value for e in ea.Scalars(f"monitor/module/act_norm/{name}")]
        np.testing.assert_allclose(got, act[:, j], rtol=1e-6)
    assert not [t for t in scal if "param/" in t]  # only the figures a trigger reads
    texts = ea.Tensors("monitor/trigger/text_summary")
    assert [t.step for t in texts] == [4]
    assert b"layer 2 too large" in texts[0].tensor_proto.string_val[0]


def test_lightning_loggers_get_the_monitors_scalars(tmp_path):
    L = pytest.importorskip("lightning")
    from accuracy.integrations import AccuracyLightningCallback

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.lin(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, generator=g), torch.randn(1, generator=g)) for _ in range(20)]
    logger = L.pytorch.loggers.TensorBoardLogger(str(tmp_path), name="tb", version=0)
    cb = AccuracyLightningCallback(monitor={"path": tmp_path / "pl.monitor.h5",
                                            "snapshot_every": None})
    L.Trainer(max_steps=5, accelerator="cpu", callbacks=[cb], logger=logger,
              enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, log_every_n_steps=1).fit(
        Net(), torch.utils.data.DataLoader(data, batch_size=4))
    s = am.read_series(tmp_path / "pl.monitor.h5")
    ea = _read(tmp_path / "tb" / "version_0")
    got = ea.Scalars("monitor/loss")
    assert [e.step for e in got] == list(range(1, 6))  # the trainer's global step
    np.testing.assert_allclose([e.value for e in got], s.loss, rtol=1e-6)
