"""msprobe's `dump_enable` switch and a config steered while the job runs: the file is re-read
after each step through the same hardened loader as at the start; a change written before step
N applies from step N+1; a half-written or invalid file keeps the config in force and says why
once; one line at the start says what is in force."""

from __future__ import annotations

import json
import logging
import os

from accuracy import PrecisionDebugger
from accuracy.examples import lm_batch, lm_step, tiny_lm

BASE = {"task": "statistics", "rank": [], "step": [], "level": "L1",
        "statistics": {"list": ["Functional.linear"]}}


def _write(path, cfg) -> None:
    tmp = path.with_name(path.name + ".tmp")  # as an editor saves: whole, then renamed
    tmp.write_text(json.dumps(cfg))
    os.replace(tmp, path)


def _run(cfg_path, steps: int, before_step=None) -> list[int]:
    """Train `steps` steps; `before_step(n)` runs before step n starts (between step() of
    n-1 and start() of n). Returns the steps that were dumped."""
    model, batch = tiny_lm(layers=1, d_model=16, ff=32, vocab=32), lm_batch(vocab=32)
    dbg = PrecisionDebugger(config_path=cfg_path)
    dumped = []
    for n in range(steps):
        if before_step is not None:
            before_step(n)
        dbg.start(model)
        if dbg.recording:
            dumped.append(n)
        lm_step(model, batch)
        dbg.stop()
        dbg.step()
    return dumped


def test_dump_enable_false_records_nothing_and_true_the_listed_steps(tmp_path):
    cfg = tmp_path / "config.json"
    _write(cfg, {**BASE, "dump_path": str(tmp_path / "off"), "dump_enable": False})
    assert _run(cfg, 3) == []
    assert not (tmp_path / "off").exists()
    _write(cfg, {**BASE, "dump_path": str(tmp_path / "on"), "dump_enable": True,
                 "step": [1, 2]})
    assert _run(cfg, 4) == [1, 2]


def test_a_change_written_before_step_n_applies_from_step_n_plus_1(tmp_path, caplog):
    cfg = tmp_path / "config.json"
    _write(cfg, {**BASE, "dump_path": str(tmp_path / "d"), "dump_enable": False})

    def steer(n):
        if n == 5:
            _write(cfg, {**BASE, "dump_path": str(tmp_path / "d"), "dump_enable": True})
        if n == 9:
            _write(cfg, {**BASE, "dump_path": str(tmp_path / "d"), "dump_enable": True,
                         "step": ["0-7"]})

    with caplog.at_level(logging.INFO, logger="accuracy.debugger"):
        assert _run(cfg, 12, steer) == [6, 7, 8, 9]
    lines = [r.getMessage() for r in caplog.records]
    start = [m for m in lines if "in force" in m]
    assert len(start) == 1 and "dump_enable=false" in start[0] and "task=statistics" in start[0]
    assert sorted(int(p.parent.parent.name[4:]) for p in (tmp_path / "d").glob(
        "step*/rank*/dump.h5")) == [6, 7, 8, 9]
    assert [m for m in lines if "re-read: from step 6" in m]


def test_a_half_written_or_invalid_file_keeps_the_config_and_says_why_once(tmp_path, caplog):
    cfg = tmp_path / "config.json"
    good = {**BASE, "dump_path": str(tmp_path / "d"), "dump_enable": True}
    _write(cfg, good)

    def steer(n):
        if n == 2:
            cfg.write_text(json.dumps(good)[:25])  # the editor's first write of two
        if n == 5:
            _write(cfg, {**good, "level": "L9"})
        if n == 8:
            cfg.write_bytes(b" " * (2 << 20))  # refused by the loader's size bound
        if n == 10:
            _write(cfg, {**good, "dump_enable": False})

    with caplog.at_level(logging.WARNING, logger="accuracy.debugger"):
        assert _run(cfg, 13, steer) == list(range(11))
    said = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(said) == 3, said
    assert "not JSON" in said[0] or "JSON" in said[0]
    assert "level 'L9'" in said[1]
    assert "a config is at most" in said[2]
    assert all("the config in force stays" in m and "dump_enable=true" in m for m in said)
