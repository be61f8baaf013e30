"""PrecisionDebugger runs msprobe users' config.json and call order; idle steps cost nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from accuracy import PrecisionDebugger, dumper, load_dump, schedule
from accuracy.debugger import config as _config
from accuracy.errors import UsageError
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.steps import ACTIVE, parse_ids

REPO = Path(__file__).resolve().parents[2]

# msprobe's own example config (its docs, task statistics), with a step list holding a range
MSPROBE_EXAMPLE = {
    "task": "statistics",
    "dump_path": "./dump_path",
    "rank": [],
    "step": [0, "2-3"],
    "level": "L1",
    "async_dump": False,
    "extra_info": True,
    "statistics": {"scope": [], "list": [], "tensor_list": [], "data_mode": ["all"],
                   "summary_mode": "statistics"},
    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"},
}


def _write(tmp_path: Path, cfg: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def _train(dbg: PrecisionDebugger, steps: int, seen: list | None = None) -> None:
    model, batch = tiny_lm(), lm_batch()
    for _ in range(steps):
        dbg.start(model)
        if seen is not None:
            seen.append(_get_current_dispatch_mode())
        lm_step(model, batch)
        dbg.stop()
        dbg.step()


def _dumped_steps(root: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p in sorted(root.glob("step*/rank*/dump.h5")):
        with load_dump(p) as d:
            assert d.records  # readable, with rows
            out[int(p.parts[-3][4:])] = sorted({r.step for r in d.records})
    return out


def test_msprobe_example_config_runs_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dbg = PrecisionDebugger(config_path=_write(tmp_path, MSPROBE_EXAMPLE))
    seen: list = []
    _train(dbg, 5, seen)
    assert _dumped_steps(tmp_path / "dump_path") == {0: [0], 2: [2], 3: [3]}
    assert (tmp_path / "dump_path/step2/rank0/dump.h5").is_file()
    # unselected steps ran with no dispatch mode installed at all
    assert seen[1] is None and seen[4] is None and seen[0] is not None


def test_schedule_in_config_and_as_keyword(tmp_path):
    cfg = {**MSPROBE_EXAMPLE, "dump_path": str(tmp_path / "a")}
    del cfg["step"]
    cfg["schedule"] = {"skip_first": 1, "wait": 1, "warmup": 0, "active": 1, "repeat": 2}
    _train(PrecisionDebugger(config_path=_write(tmp_path, cfg)), 6)
    assert sorted(_dumped_steps(tmp_path / "a")) == [2, 4]
    dbg = PrecisionDebugger(dump_path=tmp_path / "b", task="statistics", level="L1",
                            schedule=schedule(wait=2, active=1, repeat=1))
    _train(dbg, 4)
    assert sorted(_dumped_steps(tmp_path / "b")) == [2]


@pytest.mark.filterwarnings("ignore:Profiler won.t be using warmup")
@pytest.mark.parametrize("kw", [dict(wait=1, warmup=1, active=2, repeat=2),
                                dict(wait=0, warmup=0, active=1, repeat=0, skip_first=3),
                                dict(wait=2, warmup=1, active=3, repeat=0, skip_first=1)])
def test_schedule_records_the_steps_torch_profiler_records(kw):
    from torch.profiler import ProfilerAction
    from torch.profiler import schedule as torch_schedule

    ours, theirs = schedule(**kw), torch_schedule(**kw)
    recorded = {ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE}
    for step in range(40):
        assert (ours.phase(step) == ACTIVE) == (theirs(step) in recorded), step


def test_step_lists_with_ranges_and_their_refusals():
    ids = parse_ids([0, 2, "4-6"])
    assert [s for s in range(10) if s in ids] == [0, 2, 4, 5, 6]
    assert ids.describe() == [0, 2, "4-6"] and parse_ids([3, "0-2"]).describe() == ["0-3"]
    assert parse_ids(torch.tensor([0, 2]).numpy()).describe() == [0, 2]  # numpy's ints too
    assert parse_ids([]) is None and parse_ids(None) is None
    for bad, word in [([1, "0-3"], "overlaps"), ([2, 2], "overlaps"), ([-1], "negative"),
                      (["-2"], "negative"), (["6-4"], "empty"), (["a"], "range"),
                      ([1.5], "range"), (["\u00b2"], "digits 0-9"), (["1-\u0663"], "digits"),
                      ([2**63], "past the largest"), (["9" * 5000], "past the largest"),
                      (range(0, 40_000, 2), "more than 10000 entries")]:
        with pytest.raises(UsageError, match=word):
            parse_ids(bad)
    for bad in (dict(wait=-1), dict(active=0), dict(repeat=-2)):
        with pytest.raises(UsageError, match="schedule"):
            schedule(**bad)


@pytest.mark.parametrize("change,words", [
    ({"task": "free_benchmark"}, ["free_benchmark", "statistics, tensor, overflow_check"]),
    ({"level": "L2"}, ["'L2'", "L0, L1, mix"]),
    ({"level": "debug"}, ["'debug'", "L0, L1, mix"]),
    ({"dump_pth": "x"}, ["'dump_pth'", "dump_path"]),
    ({"statistics": {"summary_mode": "statistics", "lst": []}}, ["'lst'", "list"]),
    ({"statistics": {"summary_mode": "sha1"}}, ["sha1", "statistics, md5"]),
    ({"statistics": {"data_mode": ["inputs"]}}, ["inputs", "forward"]),
    ({"step": [1, "1-3"]}, ["overlaps"]),
    ({"rank": ["3-1"]}, ["rank range", "empty"]),
    ({"statistics": {"scope": ["Module.a.A.forward.0", "Module.b.B.forward.0"]}},
     ["scope", "list"]),
])
def test_bad_config_is_one_line_naming_the_field(tmp_path, change, words):
    with pytest.raises(UsageError) as e:
        PrecisionDebugger(config_path=_write(tmp_path, {**MSPROBE_EXAMPLE, **change}))
    msg = str(e.value)
    assert "\n" not in msg and "config.json" in msg
    for w in words:
        assert w in msg


def test_a_range_of_a_billion_steps_stays_a_range(tmp_path):
    """msprobe's "0-1000000000" once became a set of a billion numbers (42 s, 6 GB, then
    MemoryError): it is one range, and membership is a lookup."""
    from accuracy.steps import IdRanges

    cfg = _config.load(_write(tmp_path, {**MSPROBE_EXAMPLE, "step": [0, "2-1000000000"]}))
    assert isinstance(cfg.steps, IdRanges) and cfg.steps.describe() == [0, "2-1000000000"]
    assert 1_000_000_000 in cfg.steps and 1 not in cfg.steps
    assert 1_000_000_001 not in cfg.steps and cfg.wants(999_999_999, 0)


_DEEP = '{"step": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("raw,words", [
    (_DEEP.encode(), ["nested deeper than 16 levels"]),
    (json.dumps({**MSPROBE_EXAMPLE, "step": ["\u00b2"]}).encode(), ["step entry", "digits"]),
    (b'{"task": "statistics", "dump_path": "caf\xe9"}',
     ["not UTF-8 text (byte 0xe9", "save it as UTF-8"]),
    (json.dumps({**MSPROBE_EXAMPLE, "step": list(range(2_000_000))}).encode(),
     ["bytes; a config is at most 1048576 bytes"]),
    (json.dumps({**MSPROBE_EXAMPLE, "step": [f"{i}" for i in range(0, 40_000, 2)]}).encode(),
     ["more than 10000 entries", "ranges"]),
    (json.dumps({**MSPROBE_EXAMPLE, "rank": [2**64]}).encode(), ["rank entry", "largest"]),
    (json.dumps({"statistics": {"list": ["x"] * 20_000}}).encode(), ["list holds 20000"]),
    (b"{\"step\": [1, 2", ["invalid JSON"]),
])
def test_hostile_config_is_one_line(tmp_path, raw, words):
    p = tmp_path / "config.json"
    p.write_bytes(raw)
    with pytest.raises(UsageError) as e:
        PrecisionDebugger(config_path=p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg, msg
    for w in words:
        assert w in msg, msg


def test_a_config_that_is_no_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    with pytest.raises(UsageError, match="not a regular file"):
        PrecisionDebugger(config_path=fifo)
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(MSPROBE_EXAMPLE).encode())
    assert PrecisionDebugger(config_path=tmp_path / "bom.json").config.task == "statistics"


def test_step_keywords_are_bounded_like_the_file(tmp_path):
    with pytest.raises(UsageError, match="more than 10000 entries"):
        PrecisionDebugger(dump_path=tmp_path / "d", step=list(range(2_000_000)))
    with pytest.raises(UsageError, match="more than 10000 entries"):
        dumper(tmp_path / "x.h5", steps=list(range(0, 40_000, 2)))


def test_dumper_steps_take_msprobe_ranges(tmp_path):
    model, batch = tiny_lm(), lm_batch()
    with dumper(tmp_path / "r.h5", "statistics", steps=[0, "2-3"]) as d:
        for _ in range(5):
            lm_step(model, batch)
            d.step()
    with load_dump(tmp_path / "r.h5") as dd:
        assert {r.step for r in dd.records} == {0, 2, 3}
        assert dd.attrs["filter"]["steps"] == [0, "2-3"]
    with dumper(tmp_path / "b.h5", "statistics", steps=range(1, 10**12)) as d:
        lm_step(model, batch)
        d.step()
        lm_step(model, batch)
    with load_dump(tmp_path / "b.h5") as dd:
        assert {r.step for r in dd.records} == {1}


def test_call_order_mistakes_are_one_line_each_and_training_goes_on(tmp_path, caplog):
    dbg = PrecisionDebugger(dump_path=tmp_path / "d", step=[0, 1])
    model, batch = tiny_lm(), lm_batch()
    caplog.set_level(logging.WARNING, logger="accuracy")
    dbg.stop()  # without start
    dbg.start(model)
    dbg.start(model)  # twice
    lm_step(model, batch)
    dbg.step()  # inside the recorded region: closes it
    dbg.start(model)
    lm_step(model, batch)
    dbg.stop()
    dbg.step()
    msgs = [r.getMessage() for r in caplog.records]
    assert any("stop() without start()" in m for m in msgs)
    assert any("start() called twice" in m for m in msgs)
    assert any("step() inside a recorded region" in m for m in msgs)
    assert all("\n" not in m for m in msgs)
    assert _get_current_dispatch_mode() is None
    with load_dump(tmp_path / "d/step0/rank0/dump.h5") as d:
        assert d.attrs["complete"] and {r.step for r in d.records} == {0}
    assert _dumped_steps(tmp_path / "d") == {0: [0], 1: [1]}


def test_ranks_outside_the_list_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    _train(PrecisionDebugger(config_path=_write(
        tmp_path, {**MSPROBE_EXAMPLE, "dump_path": str(tmp_path / "r"), "rank": [0]})), 1)
    assert not (tmp_path / "r").exists()
    _train(PrecisionDebugger(config_path=_write(
        tmp_path, {**MSPROBE_EXAMPLE, "dump_path": str(tmp_path / "s"), "rank": ["0-1"]})), 1)
    assert (tmp_path / "s/step0/rank1/dump.h5").is_file()


def test_tensor_task_with_an_api_list_and_data_mode(tmp_path):
    cfg = {"task": "tensor", "dump_path": str(tmp_path / "t"), "rank": [], "step": [0],
           "level": "L1", "tensor": {"scope": [], "list": ["Functional.linear", "addmm"],
                                     "data_mode": ["forward"]}}
    _train(PrecisionDebugger(config_path=_write(tmp_path, cfg)), 1)
    with load_dump(tmp_path / "t/step0/rank0/dump.h5") as d:
        assert d.attrs["mode"] == "tensor"
        ops = {r.op for r in d.records}
        assert ops and all("linear" in op or "addmm" in op for op in ops), ops
        assert {r.phase for r in d.records} == {"forward"}


def test_overflow_check_task_records_where_inf_is_born(tmp_path):
    cfg = {"task": "overflow_check", "dump_path": str(tmp_path / "o"), "step": [],
           "level": "L1", "overflow_check": {"overflow_nums": -1}}
    dbg = PrecisionDebugger(config_path=_write(tmp_path, cfg))
    dbg.start()
    x = torch.full((4,), 60000.0, dtype=torch.float16)
    (x * 4).sum()
    dbg.stop()
    with load_dump(tmp_path / "o/step0/rank0/dump.h5") as d:
        assert [r.op for r in d.records][:1] == ["aten.mul.Tensor"]


def test_dumper_installs_no_mode_on_steps_it_does_not_record(tmp_path):
    model, batch = tiny_lm(), lm_batch()
    seen = []
    with dumper(tmp_path / "w.h5", "statistics", steps=schedule(wait=1, active=1, repeat=1)) as d:
        for _ in range(3):
            seen.append(_get_current_dispatch_mode() is not None)
            lm_step(model, batch)
            d.step()
    assert seen == [False, True, False]
    assert _get_current_dispatch_mode() is None
    with load_dump(tmp_path / "w.h5") as dd:
        assert {r.step for r in dd.records} == {1}
        assert "schedule(" in json.dumps(dd.attrs["filter"])


def test_compare_two_debugger_trees_per_step_and_rank(tmp_path):
    for side in ("a", "b"):
        _train(PrecisionDebugger(dump_path=tmp_path / side, step=[0, 2]), 3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "accuracy.cli", "compare", "-m",
                        str(tmp_path / "a"), "-g", str(tmp_path / "b"), "-o",
                        str(tmp_path / "rep")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "== step 0 ==" in r.stdout and "== step 2 ==" in r.stdout and "rank 0" in r.stdout
    assert (tmp_path / "rep/step2/rank0").is_dir()
    (tmp_path / "b/step2").rename(tmp_path / "b/step1")
    r = subprocess.run([sys.executable, "-m", "accuracy.cli", "compare", "-m",
                        str(tmp_path / "a"), "-g", str(tmp_path / "b")], capture_output=True,
                       text=True, env=env, timeout=300)
    assert "steps in only one tree (not compared): [1, 2]" in r.stdout


def test_importing_the_debugger_imports_no_torch():
    code = ("import sys; from accuracy import PrecisionDebugger, schedule; "
            "print(any(m == 'torch' for m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert r.stdout.strip() == "False", r.stderr


# -- msprobe habits: where it dumps, a reused dump_path --------------------------------------

def _one_step(dbg: PrecisionDebugger, seed: int = 0) -> None:
    model, batch = tiny_lm(seed), lm_batch(batch=1, seq=4)
    dbg.start(model)
    lm_step(model, batch)
    dbg.stop()
    dbg.step()


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_start_says_where_it_dumps(tmp_path, caplog):
    """msprobe prints its dump path; `start()` said nothing a training script shows (no info
    lines there): the first `start()` says it as a warning, once."""
    caplog.set_level(logging.WARNING, logger="accuracy")
    dbg = PrecisionDebugger(dump_path=tmp_path / "dp", step=[0, "2-3"])
    _one_step(dbg)
    _one_step(dbg)
    said = _said(caplog)
    assert said == [f"PrecisionDebugger: recording steps 0, 2-3 (statistics mode) to "
                    f"{tmp_path / 'dp'}/step{{N}}/rank0/dump.h5"], said


def test_a_reused_dump_path_is_said_at_start_and_replaced_only_when_asked(tmp_path, caplog):
    """A second run into the same dump_path once logged only 'step 0: not recorded: ...
    already exists' per step. The first start() says what an earlier run left there, the old
    dumps are kept, and `overwrite` (keyword or config.json) replaces them."""
    dp = tmp_path / "dp"
    _one_step(PrecisionDebugger(dump_path=dp, step=[0]))
    first = (dp / "step0/rank0/dump.h5").read_bytes()
    caplog.set_level(logging.WARNING, logger="accuracy")
    dbg = PrecisionDebugger(dump_path=dp, step=[0])
    dbg.start(tiny_lm())  # said here, before the step runs
    said = _said(caplog)
    assert any(m.startswith(f"PrecisionDebugger: {dp} holds an earlier run's dumps (steps 0): "
                            "a step recorded again is not written and its old dump is kept; "
                            "pass overwrite=True") for m in said), said
    dbg.stop()
    assert (dp / "step0/rank0/dump.h5").read_bytes() == first  # nothing overwritten
    caplog.clear()
    cfg = _write(tmp_path, {**MSPROBE_EXAMPLE, "dump_path": str(dp), "step": [0],
                            "overwrite": True})
    _one_step(PrecisionDebugger(config_path=cfg), seed=1)  # other weights: the new dump differs
    assert any("each step recorded again replaces its dump (overwrite)" in m
               for m in _said(caplog)), _said(caplog)
    assert (dp / "step0/rank0/dump.h5").read_bytes() != first
    with pytest.raises(UsageError, match="overwrite must be true or false"):
        PrecisionDebugger(config_path=_write(tmp_path, {**MSPROBE_EXAMPLE, "overwrite": "yes"}))
    assert not PrecisionDebugger(config_path=cfg, overwrite=False).overwrite  # keyword wins
