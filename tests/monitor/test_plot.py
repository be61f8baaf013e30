"""Monitor plots: the CLI's self-contained HTML page and the server's monitor pages; untrusted
module names never become markup."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch
from torch import nn

import accuracy.monitor as am

ROOT = Path(__file__).resolve().parents[2]
EVIL = "x</script><img src=q onerror=alert(1)>"
CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"))
                 if p and Path(p).exists()), None)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    d = tmp_path_factory.mktemp("mon")
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module(EVIL, nn.Linear(8, 8))
    model.add_module("out", nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    path = d / "evil.monitor.h5"
    step = am.watch(step, model, opt, path=path, snapshot_every=None,
                    triggers=[am.Predicate(lambda s: s.step == 3, name=EVIL)])
    for i in range(6):
        step(torch.randn(4, 8) * (100 if i == 3 else 1))
    step.monitor.close()
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "accuracy.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_a_self_contained_page_with_names_escaped(series, tmp_path):
    out = tmp_path / "plot.html"
    r = _cli("monitor", "plot", str(series), "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "uPlot" in page and "module/act_norm" in page
    assert not re.search(r"https?://(?!www\.w3\.org)", page.split("<script>")[0])  # no fetch
    assert EVIL not in page and "<img" not in page
    assert "x\\u003c/script\\u003e\\u003cimg" in page  # the name is there, as JSON text
    again = _cli("monitor", "plot", str(series), "-o", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_cli_refuses_a_file_that_is_not_a_monitor_series(tmp_path):
    bad = tmp_path / "other.h5"
    with h5py.File(bad, "w") as f:
        f["x"] = [1, 2]
    r = _cli("monitor", "show", str(bad))
    assert r.returncode == 2 and "is not a monitor file" in r.stderr
    assert r.stderr.count("\n") == 1


def test_show_lists_the_trigger(series):
    r = _cli("monitor", "show", str(series))
    assert r.returncode == 0, r.stderr
    assert "6 rows" in r.stdout and "step 3: trigger" in r.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not found")
@pytest.mark.browser
def test_the_page_draws_in_a_browser_without_running_the_names(series, tmp_path):
    from accuracy.monitor.plot import write_plot

    out = write_plot(series, tmp_path / "p.html")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        f"--user-data-dir={tmp_path / 'prof'}", "--virtual-time-budget=5000",
                        "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=90)
    dom = r.stdout
    assert 'class="uplot' in dom  # the charts were drawn
    assert "step 3 \u2014 trigger" in dom  # the event line, as text
    assert "<img" not in dom  # no element was made from a name
    assert "&lt;img src=q onerror=alert(1)&gt;</div>" in dom  # shown as text


def test_server_lists_and_draws_series_and_keeps_to_its_roots(series, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

    local = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
    other = tmp_path / "elsewhere.monitor.h5"
    shutil.copy(series, other)
    app = create_app(tmp_path / "data", allowed_roots=[series.parent, tmp_path / "data"])
    with TestClient(**local, app=app) as c:
        listing = c.get("/monitor")
        assert listing.status_code == 200 and "evil.monitor.h5" in listing.text
        assert "elsewhere" not in listing.text
        page = c.get("/monitor/view", params={"path": str(series)})
        assert page.status_code == 200 and "module/act_norm" in page.text
        assert EVIL not in page.text and "<img" not in page.text
        assert c.get("/monitor/view", params={"path": str(other)}).status_code == 403
        bad = series.parent / "bad.monitor.h5"
        with h5py.File(bad, "w") as f:
            f["x"] = [1]
        r = c.get("/monitor/view", params={"path": str(bad)})
        assert r.status_code == 400 and "not a monitor file" in r.text


def test_every_page_links_to_the_monitor_list(series, tmp_path):
    """The monitor list is reachable from the UI's navigation, not only by typing its URL."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

    local = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
    app = create_app(tmp_path / "data", allowed_roots=[series.parent])
    with TestClient(**local, app=app) as c:
        home = c.get("/")
        assert home.status_code == 200 and '<a href="/monitor">monitor</a>' in home.text
        listing = c.get(re.search(r'<a href="(/monitor)">monitor</a>', home.text).group(1))
        assert listing.status_code == 200 and "evil.monitor.h5" in listing.text


def test_a_run_whose_loss_went_nan_plots_and_serves(tmp_path):
    """The step a user most wants to see (the loss went NaN) is recorded in the events: the
    page is still strict JSON, in the CLI and on the server."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, bad):
        opt.zero_grad()
        loss = model(x).pow(2).mean() * (float("nan") if bad else 1.0)
        loss.backward()
        opt.step()
        return loss

    path = tmp_path / "nan.monitor.h5"
    step = am.watch(step, model, opt, path=path, snapshot_every=None)
    for i in range(6):
        step(torch.randn(8, 4), i == 3)
    step.monitor.close()
    out = tmp_path / "nan.html"
    r = _cli("monitor", "plot", str(path), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert '"loss":"nan"' in out.read_text()
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

    local = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
    app = create_app(tmp_path / "data", allowed_roots=[tmp_path])
    with TestClient(**local, app=app) as c:
        page = c.get("/monitor/view", params={"path": str(path)})
        assert page.status_code == 200 and "loss is nan" in page.text



def _run(tmp_path, name, model, change, steps=8):
    """`steps` monitored steps of `model`; `change(n)` runs after backward of step n."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    at = {"n": 0}

    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        change(at["n"])
        opt.step()
        at["n"] += 1
        return loss

    path = tmp_path / f"{name}.monitor.h5"
    watched = am.watch(step, model, opt, path=path, snapshot_every=None)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        watched(torch.randn(4, 8, generator=g))
    watched.monitor.close()
    return am.read_series(path)


def test_the_page_opens_on_what_fired(tmp_path):
    from accuracy.monitor.plot import render_html, series_data

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 1))

    def jump(n):  # step 5: layer 2's weight gradient 1000x
        if n == 5:
            model[2].weight.grad.mul_(1000.0)

    s = _run(tmp_path, "jump", model, jump)
    f = series_data(s)["focus"]
    assert f["figure"] == "param/grad_norm" and f["step"] == 5
    assert f["layer"] == "2.weight" and f["why"][0].startswith("grad-norm-jump")
    assert '"focus":{"figure":"param/grad_norm"' in render_html(s)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    bad = {"on": False}
    model[1].register_forward_hook(lambda m, a, out: out * float("nan") if bad["on"] else None)

    def nan_from_3(n):
        bad["on"] = n >= 2  # from step 3's forward on
    f = series_data(_run(tmp_path, "nan", model, nan_from_3, steps=5))["focus"]
    assert f["figure"] == "module/act_nan" and f["step"] == 3 and f["layer"] == "1"


def test_a_quiet_run_opens_on_activation_norms(tmp_path):
    from accuracy.monitor.plot import series_data

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    assert series_data(_run(tmp_path, "quiet", model, lambda n: None, steps=4))["focus"] is None


def _nan_run(tmp_path):
    """A NaN born in layer 1 at step 3 (and the loss NaN from there), a layer that runs on
    even steps only (not measured on odd ones)."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.act, self.b, self.extra = (nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1),
                                                    nn.Linear(8, 8))
            self.n = 0

        def forward(self, x):
            h = self.act(self.a(x))
            if self.n % 2 == 0:
                h = self.extra(h)
            self.n += 1
            return self.b(h)

    model = Net()
    bad = {"on": False}
    model.act.register_forward_hook(lambda m, a, out: out * float("nan") if bad["on"] else None)
    return _run(tmp_path, "nanplot", model, lambda n: bad.update(on=n >= 2), steps=6), model


def test_a_nan_born_at_the_flagged_step_is_drawn_black_not_as_not_measured(tmp_path):
    """docs/monitor.md: black non-finite, grey not measured. The file keeps NaN for both; the
    page tells them apart by the NaN/Inf counts, so the NaN born at step 3 is visible."""
    from accuracy.monitor.plot import series_data

    s, _ = _nan_run(tmp_path)
    data = series_data(s)
    assert data["focus"]["step"] == 3 and data["focus"]["layer"] == "act"
    norms = data["figures"]["module/act_norm"]
    col = norms["names"].index("act")
    steps = data["steps"]
    at = {st: row[col] for st, row in zip(steps, norms["values"], strict=True)}
    assert at[3] == "nan" and isinstance(at[2], float)  # measured NaN, not "not measured"
    extra = norms["names"].index("extra")
    ran = {st: row[extra] for st, row in zip(steps, norms["values"], strict=True)}
    assert [ran[st] is None for st in (1, 2, 3)] == [True, False, True], ran
    assert ran[5] is None and ran[4] == "nan"  # did not run: grey; ran on NaN: black
    # the loss line's gap is there to be marked (a null, not dropped)
    assert len(data["loss"]) == len(steps) and data["loss"][steps.index(3)] is None


def test_binning_keeps_a_measured_nan_visible():
    """Over 2,000 steps a bin shows its largest magnitude: a measured NaN ranks first (it
    used to rank last, below any finite value, and vanished from the heat map)."""
    import numpy as np

    from accuracy.monitor.plot import _bin

    values = np.ones((4000, 1))
    values[1001, 0] = np.nan  # measured: its counts say so
    values[2001, 0] = np.nan  # not measured
    measured = np.zeros_like(values, dtype=bool)
    measured[1001, 0] = True
    out, _ = _bin(values, np.arange(4000), 2000, measured)
    assert np.isnan(out[500, 0]) and out[1000, 0] == 1.0


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not found")
@pytest.mark.browser
def test_the_page_marks_the_loss_gap_and_says_what_black_and_grey_mean(tmp_path):
    from accuracy.monitor.plot import write_plot

    s, _ = _nan_run(tmp_path)
    out = write_plot(s.path, tmp_path / "nan.html")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        f"--user-data-dir={tmp_path / 'prof'}", "--virtual-time-budget=5000",
                        "--dump-dom", out.as_uri()], capture_output=True, text=True, timeout=90)
    dom = r.stdout
    assert 'class="uplot' in dom
    assert "loss NaN, Inf or not recorded at steps 3, 4, 5" in dom, dom[-3000:]
    assert "NaN or Inf" in dom and "not measured" in dom


def test_a_module_never_measured_draws_without_a_numpy_warning(tmp_path):
    """A module with no figure on any row (one run inside torch.compile, one never called)
    beside a trigger: the page's focus skips its all-NaN column. Before, numpy's "All-NaN
    slice encountered" RuntimeWarning reached the user's terminal from `accuracy monitor plot`."""
    import warnings

    from accuracy.monitor.plot import write_plot

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    model.add_module("unused", nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        opt.zero_grad()
        loss = model[1](model[0](x)).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    path = tmp_path / "run.monitor.h5"
    step = am.watch(step, model, opt, path=path, snapshot_every=None,
                    triggers=[am.Predicate(lambda s: s.step == 3, name="flagged")])
    for _ in range(5):
        step(torch.randn(4, 8))
    step.monitor.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_plot(path, tmp_path / "plot.html")
    assert "flagged" in (tmp_path / "plot.html").read_text()
