"""The monitor through Lightning: its own callback (figures, triggers, capture of a flagged step
re-run from a snapshot) and the plain `Monitor` as a probe of `AccuracyLightningCallback`."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

L = pytest.importorskip("lightning")

import accuracy.monitor as am  # noqa: E402
from accuracy.integrations import AccuracyLightningCallback  # noqa: E402
from accuracy.monitor.capture import same_bits  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2),
                                       torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if torch.is_grad_enabled():
            self.losses.append(float(loss))
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(module, callbacks, steps=3):
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(4, generator=g), torch.randn(1, generator=g)) for _ in range(4 * steps)]
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", callbacks=callbacks, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


def test_lightning_callback_records_each_batch_and_captures_a_flagged_step(tmp_path):
    module = Tiny()
    path = tmp_path / "pl.monitor.h5"
    cb = AccuracyLightningCallback(monitor={
        "path": path, "snapshot_every": 1, "detail_every": 1,  # update ratios every step
        "triggers": [am.Predicate(lambda s: s.step == 1)]})
    _fit(module, [cb])
    s = am.read_series(path)
    assert list(s.step) == [0, 1, 2]
    assert s.loss[0] == pytest.approx(module.losses[0])  # training_step's loss (a capture's
    assert s.loss[2] == pytest.approx(module.losses[-1])  # re-runs add to module.losses)
    assert "net.0" in s.module_names and np.isfinite(s.param["update_ratio"]).all()
    caps = cb.monitor.captures
    assert [c.step for c in caps] == [1]
    assert caps[0].exact is True and same_bits(caps[0].rerun_loss, float(s.loss[1]))


def test_monitor_is_a_probe_of_the_debugger_callback(tmp_path, caplog):
    module = Tiny()
    path = tmp_path / "probe.monitor.h5"
    mon = am.Monitor(module, path=path, snapshot_every=None)
    with caplog.at_level(logging.ERROR):
        _fit(module, [AccuracyLightningCallback(mon)])
    mon.close()  # the rows reach the file in batches: all of them by close (or exit)
    assert not [r for r in caplog.records if "Monitor" in r.getMessage()]
    s = am.read_series(path)
    assert list(s.step) == [0, 1, 2]
    assert np.isfinite(s.grad_norm).all() and np.isfinite(s.module["act_norm"]).any()
    # a probe is given no loss: the loss is unknown, not a non-finite loss to flag
    assert not [e for e in s.events if e["kind"] == "trigger"]



def test_the_old_import_path_says_what_to_write_instead():
    with pytest.raises(ImportError, match="AccuracyLightningCallback\\(monitor="):
        import accuracy.monitor.lightning  # noqa: F401
