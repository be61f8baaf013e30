import contextlib
import os
import sys
from pathlib import Path

import pytest
import torch

from tests._support.families import mark_families


def pytest_collection_modifyitems(config, items):
    mark_families(items)  # compiled, postgres: the families `make test-quick` leaves out
    if not os.environ.get("ACCURACY_SLOW"):
        skip = pytest.mark.skip(reason="long soak/fuzz run: set ACCURACY_SLOW=1")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA device on this machine")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


TESTDEVICE_TESTS = Path(__file__).resolve().parent / "testdevice"


# The npu test device (accuracy/testdevice) must be registered before the process's first
# backward(): torch's autograd engine sizes its per-device threads then, once. When its tests
# (tests/testdevice/) are collected, load it (building it on a clean clone) before any test
# runs; each pytest-xdist worker collects every test, so each loads it before its first test.
# Where it cannot be had, its tests' fixture says why (load() raises the same reason again).
def pytest_collection_finish(session):
    # The statistics dump's C++ module (accuracy/native/stats.cpp): built once per cache (on a
    # clean clone, tens of seconds) here, not inside the first test that opens a dumper.
    from accuracy.native import fastpath

    fastpath.load()
    if not any(item.path.resolve().is_relative_to(TESTDEVICE_TESTS) for item in session.items):
        return
    from accuracy.errors import ExtensionUnavailableError
    from accuracy.testdevice import load

    with contextlib.suppress(ExtensionUnavailableError):
        load()


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    """The test runs in its own temporary folder (relative paths land there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """The tiny LM's step dumped on CPU and on `sim` with one faulty addmm, once per module:
    (folder holding gold.h5 and dev.h5, the batch); see tests/_support/lm_dumps.py."""
    from tests._support.lm_dumps import addmm_fault_runs

    return addmm_fault_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(autouse=True)
def _torch_threads_kept(request):
    """A test that leaves torch's intra-op thread count changed fails, and the count is put
    back: what a later test compiles depends on it (with one CPU thread Inductor fuses
    max_pool's backward scatter into a kernel instead of calling ATen's `scatter_reduce_`),
    and the later test would fail far from the cause, in some orders only."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if after != before:
        torch.set_num_threads(before)
        pytest.fail(f"{request.node.nodeid} left torch's thread count at {after} (was "
                    f"{before}): put it back", pytrace=False)


@pytest.fixture(autouse=True)
def _standing_hooks_stopped():
    """Kernel hooks compiled in from the start (accuracy/dumper/compiled/standing.py: the
    debugger and the monitor put them in once dynamo is loaded) stay for the process: a later
    test would compile hooked programs without asking. Stopped after each test."""
    yield
    standing = sys.modules.get("accuracy.dumper.compiled.standing")
    if standing is not None:
        standing.stop()


# CI (`.ci/run` sets ACCURACY_NO_SKIPS=1) fails the run when a test is skipped for any reason
# other than a missing CUDA device or an opt-in soak run: a skipped test hides a broken setup
# (no Chromium, a missing extra) as well as a failure would.
_ALLOWED_SKIPS = ("cuda", "slow")
_unexpected_skips: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail") and not any(
            m in report.keywords for m in _ALLOWED_SKIPS):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _unexpected_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("ACCURACY_NO_SKIPS") and _unexpected_skips and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("ACCURACY_NO_SKIPS") and _unexpected_skips:
        terminalreporter.section("skipped tests fail this run (ACCURACY_NO_SKIPS=1)")
        for line in _unexpected_skips:
            terminalreporter.line(line)
