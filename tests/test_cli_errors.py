"""Bad input on the command line gets one line on stderr and exit 2; a bug gets a traceback.

Every command is run with the mistakes a user makes: a missing file, a folder for a file, an
HDF5 file that is not a dump, a file that is not HDF5, option values that cannot be used, and
an existing output without --overwrite. Each must answer with exactly one line, `accuracy
<command>: error: ...`, and exit status 2, and must not touch the file that was in the way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

from accuracy import dumper
from accuracy.cli import main
from accuracy.errors import AccuracyError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("cli_errors")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    with dumper(d / "run.h5"):
        model(x).sum().backward()
    with dumper(d / "stats.h5", mode="statistics"):
        model(x).sum()
    with h5py.File(d / "foreign.h5", "w") as f:
        f["data"] = [1, 2, 3]
    (d / "text.h5").write_text("not hdf5\n")
    (d / "folder").mkdir()
    (d / "existing.h5").write_bytes(b"precious")
    (d / "full").mkdir()
    (d / "full" / "keep.txt").write_text("precious")
    assert main(["compare", "-m", str(d / "run.h5"), "-g", str(d / "run.h5"),
                 "-o", str(d / "report")]) == 0
    assert main(["extract", str(d / "run.h5"), "--seq", "0", "-o", str(d / "ops.h5")]) == 0
    (d / "bad.toml").write_text("[thresholds\n")
    (d / "steps.py").write_text("def step():\n    return 0\n")
    return {"dump": str(d / "run.h5"), "stats": str(d / "stats.h5"),
            "foreign": str(d / "foreign.h5"), "text": str(d / "text.h5"),
            "missing": str(d / "nope.h5"), "dir": str(d / "folder"),
            "existing": str(d / "existing.h5"), "full": str(d / "full"),
            "report": str(d / "report"), "badtoml": str(d / "bad.toml"),
            "steps": str(d / "steps.py"), "tmp": str(d), "extract": str(d / "ops.h5")}


# (argv with {placeholders}, a word the error line must contain). A value argparse refuses
# (a count below its minimum) prints argparse's usage first; everything else is one line.
CASES = [
    # info / ls: the dump to read
    (["info", "{missing}"], "no such file"),
    (["info", "{dir}"], "directory"),
    (["info", "{foreign}"], "not an accuracy dump"),
    (["info", "{text}"], "not an HDF5 file"),
    (["info", "{dump}", "--top", "-1"], "--top"),
    (["ls", "{missing}"], "no such file"),
    (["ls", "{foreign}"], "not an accuracy dump"),
    (["ls", "{dump}", "--limit", "-3"], "--limit"),
    # a file `accuracy extract` wrote is named as such, with what reads it
    (["info", "{extract}"], "written by `accuracy extract`"),
    (["ls", "{extract}"], "written by `accuracy extract`"),
    (["compare", "-m", "{extract}", "-g", "{dump}"], "written by `accuracy extract`"),
    # extract / convert: inputs, selections, outputs in the way
    (["extract", "{missing}", "-o", "{tmp}/x.h5"], "no such file"),
    (["extract", "{text}", "-o", "{tmp}/x.h5"], "not an HDF5 file"),
    (["extract", "{dump}", "--op", "aten.nope", "-o", "{tmp}/x.h5"], "no op"),
    (["extract", "{dump}", "-o", "{existing}"], "--overwrite"),
    (["extract", "{dump}", "-o", "{dir}"], "directory"),
    (["convert", "{missing}", "-o", "{tmp}/npy"], "no such file"),
    (["convert", "{dump}", "--seq", "99999", "-o", "{tmp}/npy2"], "no op"),
    (["convert", "{dump}", "-o", "{full}"], "--overwrite"),
    (["convert", "{dump}", "-o", "{existing}"], "is a file"),
    (["convert", "{dump}", "-d", "{dump}", "-o", "{tmp}/npy3"], "give the dump once"),
    (["convert", "-d", "{full}", "-out", "{tmp}/npy4"], "no .h5 dump"),
    # an op pattern naming no op of the dump: the closest names first, in any spelling
    (["ls", "{dump}", "--op", "aten::rleu"], "closest first: aten.relu.default"),
    (["extract", "{dump}", "--op", "rlu", "-o", "{tmp}/x.h5"], "closest first: aten.relu"),
    (["convert", "{dump}", "--op", "aten.relu_", "-o", "{tmp}/npy5"], "first: aten.relu"),
    (["replay", "{dump}", "-o", "{tmp}/r.h5", "--op", "aten.relu", "--op", "aten.adm"],
     "'aten.adm' matches no op"),
    # replay
    (["replay", "{missing}", "-o", "{tmp}/r.h5"], "no such file"),
    (["replay", "{dir}", "-o", "{tmp}/r.h5"], "rank"),
    (["replay", "{foreign}", "-o", "{tmp}/r.h5"], "not an accuracy dump"),
    (["replay", "{text}", "-o", "{tmp}/r.h5"], "not an HDF5 file"),
    (["replay", "{stats}", "-o", "{tmp}/r.h5"], "statistics"),
    (["replay", "{dump}", "-o", "{existing}"], "--overwrite"),
    (["replay", "{dump}", "-o", "{tmp}/r.h5", "--on", "nope"], "nope"),
    (["replay", "{dump}", "-o", "{tmp}/r.h5", "--jobs", "0"], "--jobs"),
    (["replay", "{dump}", "-o", "{tmp}/r.h5", "--jobs", "two"], "--jobs"),
    (["replay", "{dump}", "-o", "{tmp}/r.h5", "--cluster", "local:x"], "local:N"),
    # compare
    (["compare", "-m", "{missing}", "-g", "{dump}"], "no such file"),
    (["compare", "-m", "{dump}", "-g", "{text}"], "not an HDF5 file"),
    (["compare", "-m", "{foreign}", "-g", "{dump}"], "not an accuracy dump"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "-r", "{missing}"], "no such file"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "-r", "{dump}"], "not a replay"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "-o", "{report}"], "--overwrite"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "-o", "{existing}"], "is a file"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--alg", "nope"], "nope"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--config", "{missing}"], "config"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--config", "{badtoml}"], "TOML"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--mapping", "{missing}"], "mapping"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--formats", "pdf", "-o", "{tmp}/rep2"],
     "pdf"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--jobs", "0"], "--jobs"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "--cluster", "nowhere"], "cluster"),
    (["compare", "-m", "{dump}", "-g", "{dump}", "-o", "/proc/accuracy-report"],
     "cannot write"),
    # outputs where nothing can be written (a pseudo file system; a file in the way)
    (["replay", "{dump}", "-o", "/proc/accuracy-r.h5"], "cannot write"),
    (["replay", "{dump}", "-o", "{existing}/r.h5"], "in the way"),
    (["extract", "{dump}", "-o", "/proc/accuracy-x.h5"], "cannot write"),
    (["convert", "{dump}", "-o", "/proc/accuracy-npy"], "cannot write"),
    (["suspects", "{report}", "-o", "/proc/accuracy-sel.json"], "cannot write"),
    # suspects
    (["suspects", "{missing}", "-o", "{tmp}/sel.json"], "no report"),
    (["suspects", "{dir}", "-o", "{tmp}/sel.json"], "no report"),
    (["suspects", "{report}", "-o", "{existing}"], "--overwrite"),
    (["suspects", "{report}", "-o", "{tmp}/sel.json", "--top", "0"], "top"),
    # overflow
    (["overflow", "{missing}"], "no such file"),
    (["overflow", "{dir}"], "directory"),
    (["overflow", "{foreign}"], "not an accuracy dump"),
    (["overflow", "{text}"], "not an HDF5 file"),
    (["overflow", "{dump}", "--confirm-on", "nope"], "nope"),
    (["overflow", "{dump}", "--limit", "-1"], "--limit"),
    # serve: refused before anything listens
    (["serve", "--data", "{tmp}/data", "--run", "{missing}"], "no such file"),
    (["serve", "--data", "{tmp}/data", "--run", "{dir}"], "directory"),
    (["serve", "--data", "{tmp}/data", "--report", "{missing}"], "no report"),
    (["serve", "--data", "{tmp}/data", "--host", "0.0.0.0"], "token"),
    (["serve", "--data", "{existing}"], "data"),
    (["serve", "--data", "{tmp}/data", "--port", "70000"], "port"),
    # prove
    (["prove", "--step", "nocolon", "--golden-step", "x:y", "--report", "{tmp}/p",
      "--culprit", "aten.mm.default"], "module:function"),
    (["prove", "--step", "{tmp}/nope.py:step", "--golden-step", "x:y", "--report", "{tmp}/p",
      "--culprit", "aten.mm.default"], "no such file"),
    (["prove", "--step", "{steps}:nothere", "--golden-step", "{steps}:step",
      "--report", "{tmp}/p", "--culprit", "aten.mm.default"], "no function"),
    (["prove", "--step", "{steps}:step", "--golden-step", "{steps}:step",
      "--report", "{tmp}/p"], "--culprit"),
    (["prove", "--step", "{steps}:step", "--golden-step", "{steps}:step",
      "--report", "{tmp}/p", "--culprit", "@encoder"], "OP@MODULE"),
    # demo: refused before the first run
    (["demo", "--out", "{tmp}/demo", "--no-serve", "--profile", "nope"], "profile"),
    (["demo", "--out", "{tmp}/demo", "--no-serve", "--fault-kind", "nope"], "fault kind"),
    # demo: a fault naming no op or module of its step, refused after the golden run
    (["demo", "--out", "{tmp}/demo", "--no-serve", "--fault-op", "aten::gleu"],
     "closest first: aten.gelu.default"),
    (["demo", "--out", "{tmp}/demo", "--no-serve", "--fault-op", "aten.gelu",
      "--fault-module", "encoder.layer.2"], "closest first: TinyTransformerLM.encoder.layers.2"),
    # verify reports a bad file on stdout and exits 1 (its contract), a missing one too
]


def _fill(argv: list[str], files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in argv]


def _untouched(files: dict[str, str]) -> None:
    assert Path(files["existing"]).read_bytes() == b"precious"
    assert (Path(files["full"]) / "keep.txt").read_text() == "precious"
    assert json.loads((Path(files["report"]) / "summary.json").read_text())


@pytest.mark.parametrize("argv,word", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_gets_one_line_and_exit_2(argv, word, files, capsys):
    try:
        code = main(_fill(argv, files))
    except SystemExit as e:  # argparse refused an option value: its usage, then one line
        code = e.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2, err
    assert err and err[-1].startswith(f"accuracy {argv[0]}: error: "), err
    assert len(err) == 1 or err[0].startswith("usage: "), err  # argparse's usage block only
    assert word.lower() in err[-1].lower(), err
    assert "=True" not in err[-1] and "(CLI:" not in err[-1], err  # command-line wording
    _untouched(files)


@pytest.mark.parametrize("device", ["cuda", "npu", "mlu", "musa"],
                         ids=lambda d: f"on_{d}")  # an id "cuda" would read as the cuda mark
def test_replay_on_a_device_this_machine_lacks(device, files, capsys, monkeypatch):
    import torch

    from accuracy.device_backend import get_backend

    backend = get_backend(device)
    if backend.is_available():
        if torch._C._get_privateuse1_backend_name() != device:
            pytest.skip(f"{device} is present here")
        # the npu test device, loaded by an earlier test of this worker: as on a machine without
        monkeypatch.setattr(type(backend), "is_available", lambda self: False)
    code = main(["replay", files["dump"], "-o", files["tmp"] + "/r.h5", "--on", device])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("accuracy replay: error: ") and device in err[0], err
    assert "not available" in err[0] and "accuracy backends" in err[0], err
    assert not Path(files["tmp"], "r.h5").exists()


def test_serve_on_a_busy_port_is_one_line(files, tmp_path):
    """Refused before the URL is printed or the data directory is locked (it was the URL,
    then uvicorn's `[Errno 98]`, exit 3)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "accuracy.cli", "serve", "--data",
                            str(tmp_path / "data"), "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2, lines
    assert len(lines) == 1 and lines[0].startswith("accuracy serve: error: "), lines
    assert f"port {port}" in lines[0] and "--port" in lines[0], lines


def test_swapped_sides_are_one_error_line(files, tmp_path):
    """In a process of its own: under pytest the CLI's logging handler is pytest's."""
    import subprocess
    import sys

    from accuracy.device_backend import sim

    dev = tmp_path / "dev.h5"
    model = torch.nn.Linear(4, 3)
    with sim(profile="exact"), dumper(dev):
        model(torch.ones(2, 4))
    gold = tmp_path / "gold.h5"
    with dumper(gold):
        model(torch.ones(2, 4))
    r = subprocess.run([sys.executable, "-m", "accuracy.cli", "compare", "-m", str(gold),
                        "-g", str(dev)], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith("accuracy compare: error: ") and "swap them" in lines[0], lines


def test_overflow_birth_prints_once(tmp_path):
    """A birth is one OverflowWarning, not also a log line with the same text."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import logging, torch\n"
        "from accuracy import dumper\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "with dumper('ovf.h5', check_overflow=True):\n"
        "    (torch.full((4,), 6e4, dtype=torch.float16) * 4).sum()\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("overflow born") == 1, r.stderr


def test_a_bug_shows_its_traceback(files, monkeypatch):
    """An exception that is not an AccuracyError is a bug: it propagates (traceback, exit 1)
    instead of being dressed up as a user error."""
    import sys

    scan_module = sys.modules["accuracy.overflow.scan"]

    def broken(*a, **k):
        raise ValueError("an internal bug")

    monkeypatch.setattr(scan_module, "scan", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["overflow", files["dump"]])


def test_traceback_flag_shows_where_a_user_error_came_from(files, capsys):
    assert main(["--traceback", "info", files["missing"]]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("accuracy info: error: ")


def test_every_part_error_is_an_accuracy_error():
    from accuracy.cluster import ClusterError
    from accuracy.dumpfile.reader import DamagedDataError, DumpError
    from accuracy.dumpfile.validate import LayoutError
    from accuracy.dumpfile.writer import DiskFullError, DumpWriteError
    from accuracy.live.check import LiveCheckError
    from accuracy.replay.engine import ReplayError
    from accuracy.server.datalock import DataDirBusy

    for cls in (ClusterError, DamagedDataError, DumpError, LayoutError, DiskFullError,
                DumpWriteError, LiveCheckError, ReplayError, DataDirBusy):
        assert issubclass(cls, AccuracyError), cls
    # and they keep the built-in bases callers catch today
    assert issubclass(DumpError, ValueError) and issubclass(DumpWriteError, RuntimeError)


@pytest.mark.parametrize("command", [["replay", "d.h5", "-o", "r.h5"],
                                     ["compare", "-m", "a.h5", "-g", "b.h5"],
                                     ["demo"]])
def test_one_progress_flag_pair_with_the_old_spellings_kept(command):
    from accuracy.cli import build_parser

    def parse(*flags):
        argv = [*command, *flags]
        return build_parser(argv).parse_args(argv)

    assert parse("--quiet").quiet and parse("-q").quiet
    assert parse("--no-progress").quiet  # compare's old spelling, hidden
    assert parse("--progress").progress and not parse("--progress").quiet
    assert not parse().quiet and not parse().progress
    with pytest.raises(SystemExit):
        parse("--quiet", "--progress")  # contradictory: argparse says so


def test_old_progress_spelling_is_hidden_from_help(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "--quiet" in out and "--progress" in out and "--no-progress" not in out


def test_help_opens_with_what_the_tool_does(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    text = out.split("\n\n", 1)[1]  # after the usage block
    assert text.startswith("Find the op that broke the numbers"), text[:200]
    assert "argument parsing" not in out and "accuracy compare -m" in out


# -- a closed pipe, a missing run file, a file where a report folder goes ---


def _cli(*argv: str, close_stdout: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "accuracy.cli", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    if close_stdout:  # the reader of the pipe is gone before anything is written
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, b"", err)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("command", ["info", "ls", "replay"])
def test_closed_pipe_ends_quietly(lm_runs, in_tmp, command):
    d, _ = lm_runs
    argv = [command, str(d / "gold.h5")] + (["-o", "r.h5", "-q", "--op", "aten.addmm*"]
                                            if command == "replay" else [])
    r = _cli(*argv, close_stdout=True)
    assert b"Traceback" not in r.stderr and b"BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode == 141


def test_serve_names_the_missing_run_file(in_tmp, capsys):
    assert main(["serve", "--data", "data", "--run", "nope.h5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "accuracy serve: error: --run nope.h5: no such file"


def test_compare_to_an_existing_file_says_so(lm_runs, in_tmp, capsys):
    d, _ = lm_runs
    Path("taken").write_text("someone's notes")
    for extra in ([], ["--overwrite"]):
        code = main(["compare", "-m", str(d / "dev.h5"), "-g", str(d / "gold.h5"), "-o",
                     "taken", *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert "taken is a file, not a report folder" in err and "Errno" not in err
        assert "\n" not in err
    assert Path("taken").read_text() == "someone's notes"



REFUSED_COMPARES = [
    (["-m", "{text}", "-g", "{dump}"], "not an HDF5 file"),
    (["-m", "{missing}", "-g", "{dump}"], "no such file"),
    (["-m", "{dump}", "-g", "{dump}", "-r", "{dump}"], "not a replay"),
    (["-m", "{dump}", "-g", "{dump}", "--formats", "json,pdf"], "unknown report formats"),
]


@pytest.mark.parametrize("argv,word", REFUSED_COMPARES,
                         ids=[" ".join(c[0]) for c in REFUSED_COMPARES])
def test_a_refused_compare_leaves_no_report_folder(argv, word, files, tmp_path, capsys):
    out = tmp_path / "new" / "report"
    assert main(["compare", *_fill(argv, files), "-o", str(out)]) == 2
    assert word in capsys.readouterr().err
    assert not (tmp_path / "new").exists(), "a refused compare made the -o folder"
    assert main(["compare", "-m", files["dump"], "-g", files["dump"], "-o", str(out)]) == 0
    assert (out / "summary.json").exists()  # made when the report is written
