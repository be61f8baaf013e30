"""A job resumed from a checkpoint continues its monitor's run: the same series (the steps run
after the checkpoint give way to their re-runs), and the triggers fire on the steps an
uninterrupted run fires on, because their history is restored."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import accuracy.monitor as am
from accuracy.errors import OutputExistsError

SPIKES = (17, 26)  # targets scaled up: loss spikes a window of history is needed to see


def _batch(i: int):
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
    return x, y * (12.0 if i in SPIKES else 1.0)


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def _run(path, steps, start=0, state=None, **kw):
    model, opt, step = _setup()
    if state is not None:
        model.load_state_dict(state[0])
        opt.load_state_dict(state[1])
    watched = am.watch(step, model, opt, path=path, snapshot_every=None, start_step=start, **kw)
    kept = None
    for i in steps:
        if i == 15:  # the checkpoint: the state before step 15
            kept = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()))
        watched(*_batch(i))
    watched.monitor.close()
    return watched.monitor, kept


def test_a_resumed_run_fires_where_an_uninterrupted_one_does_and_joins_its_series(tmp_path):
    whole, _ = _run(tmp_path / "whole.monitor.h5", range(30))
    assert [s for s, _ in whole.fired] == list(SPIKES)
    path = tmp_path / "run.monitor.h5"
    # the job ran to step 19, was killed, and resumes from its checkpoint of step 15
    _, state = _run(path, range(20))
    resumed, _ = _run(path, range(15, 30), start=15, state=state)
    assert [s for s, _ in resumed.fired] == list(SPIKES)
    a, b = am.read_series(tmp_path / "whole.monitor.h5"), am.read_series(path)
    assert list(b.step) == list(range(30)) and b.segments == [tmp_path / "run.monitor.seg1.h5"]
    np.testing.assert_array_equal(b.loss, a.loss)
    np.testing.assert_array_equal(b.module["act_norm"], a.module["act_norm"])
    assert [e["step"] for e in b.events if e["kind"] == "trigger"] == list(SPIKES)
    # the earlier file is left as it was: its steps 15-19 are still in it
    assert list(am.read_series(path, join=False).step) == list(range(20))


def test_a_new_run_does_not_write_over_an_earlier_one(tmp_path):
    path = tmp_path / "run.monitor.h5"
    _run(path, range(3))
    model, opt, _ = _setup()
    with pytest.raises(OutputExistsError):
        am.Monitor(model, opt, path=path)


def test_a_segment_of_another_run_is_not_joined(tmp_path):
    path = tmp_path / "run.monitor.h5"
    _, state = _run(path, range(16))
    _run(path, range(15, 18), start=15, state=state)
    _run(path, range(3), overwrite=True)  # a new run under the same name
    s = am.read_series(path)
    assert list(s.step) == [0, 1, 2] and s.segments == []
