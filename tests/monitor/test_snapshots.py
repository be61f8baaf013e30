"""Snapshots: only what a capture can use is kept."""

from __future__ import annotations

import torch

import accuracy.monitor as am
from accuracy.examples import lm_batch, lm_step, tiny_lm


def test_only_the_latest_snapshot_and_its_batches_stay_in_memory(tmp_path):
    """A capture re-runs the flagged step, the current one, from the latest snapshot at or
    before it. Without a budget every snapshot was kept: a copy of the model and optimizer
    state every 10 steps for the whole run."""
    model = tiny_lm(layers=1, d_model=16, ff=32, vocab=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(x, y):
        opt.zero_grad()
        loss = lm_step(model, (x, y))
        opt.step()
        return loss

    step = am.watch(train, model, opt, path=tmp_path / "s.monitor.h5", snapshot_every=10,
                    triggers=[am.Predicate(lambda s: s.step == 34)])
    for i in range(35):
        step(*lm_batch(seed=i, batch=2, seq=8, vocab=32))
    store = step.monitor.store
    assert [s.step for s in store.snapshots] == [30]
    assert sorted(store.batches) == [30, 31, 32, 33, 34]
    cap = step.monitor.captures[0]  # and the capture still re-runs from it, bit for bit
    step.monitor.close()
    assert cap.step == 34 and cap.snapshot_step == 30 and cap.exact is True
