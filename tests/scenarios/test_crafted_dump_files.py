"""A dump file is untrusted input (issue #12, file side): crafted files are refused by the
reader and every CLI command with a one-line reason, nothing from outside the file comes back,
checksums are verified on read, reports escape what they show, and a disk filled under a
running dump does not crash training."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import pytest
import torch

from accuracy import DumpError, dumper, load_dump
from accuracy.compare.api import compare
from tests._support import crafted as C

REPO = Path(__file__).resolve().parents[2]

REFUSED_AT_OPEN = {
    "external_storage": ("external files", lambda g, p, d: C.external_storage(
        g, p, C.outside_file(d))),
    "external_link": ("external link", lambda g, p, d: C.external_link(g, p, C.outside_h5(d))),
    "virtual_dataset": ("virtual dataset", lambda g, p, d: C.virtual_blob(
        g, p, C.outside_h5(d))),
    "soft_link": ("SoftLink", lambda g, p, d: C.soft_link(g, p)),
    "gzip_bomb": ("filters", lambda g, p, d: C.gzip_bomb(g, p)),
    "sparse_bomb": ("never written", lambda g, p, d: C.sparse_bomb(g, p)),
    "deep_json_extra": ("nested deeper", lambda g, p, d: C.deep_json_extra(g, p)),
    "deep_json_args": ("nested deeper", lambda g, p, d: C.deep_json_args(g, p)),
    "deep_json_attr": ("nested deeper", lambda g, p, d: C.deep_json_attr(g, p)),
    "negative_count": ("-1 ops", lambda g, p, d: C.negative_count(g, p)),
    "row_outside_data": ("past the end", lambda g, p, d: C.rows_outside(g, p)),
    "row_overflowing": ("past the end", lambda g, p, d: C.rows_outside(
        g, p, offset=2**62, nbytes=2**62)),
    "negative_shape": ("negative dimension", lambda g, p, d: C.negative_shape(g, p)),
    "shared_seq": ("two op rows share a sequence number", lambda g, p, d: C.shared_seq(g, p)),
    "shared_address": ("tensor rows 0 and 1 are both input 0 of op 0",
                       lambda g, p, d: C.shared_address(g, p)),
    "replayed_from_nul": ("attribute 'replayed_from' is not a file name (it holds a NUL byte)",
                          lambda g, p, d: C.replay_naming(g, p, b"/runs/good\0.h5")),
    "unknown_dtype": ("unknown tensor dtype 'float99'", lambda g, p, d: C.unknown_dtype(g, p)),
    "op_text_outside_data": ("text lies outside", lambda g, p, d: C.op_text_outside(g, p)),
    "op_text_overflowing": ("text lies outside", lambda g, p, d: C.op_text_outside(
        g, p, offset=2**62, nbytes=2**62)),
    "op_text_not_ours": ("op row 0: text is not 7 strings", lambda g, p, d: C.op_text_not_ours(
        g, p)),
    "flipped_chunk_index": ("damaged", lambda g, p, d: C.flipped_chunk_index(g, p)),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return C.good_dump(tmp_path_factory.mktemp("good") / "good.h5")


def _read_all(path: Path) -> None:
    with load_dump(path) as d:
        d.summary()
        for rec in d.records:
            rec.call([None] * len(rec.inputs))
            for t in rec.tensors:
                if t.has_data:
                    assert C.SECRET[:16] not in t.load().numpy().tobytes()


@pytest.mark.parametrize("case", sorted(REFUSED_AT_OPEN))
def test_crafted_file_refused_by_the_reader(case, good, tmp_path):
    reason, build = REFUSED_AT_OPEN[case]
    path = build(good, tmp_path / f"{case}.h5", tmp_path)
    with pytest.raises(DumpError) as e:
        _read_all(path)
    msg = str(e.value)
    assert str(path) in msg and reason in msg and "\n" not in msg


def _cli(args: list[str], capsys) -> tuple[int, str]:
    """Run one command as the `accuracy` script does; an escaping exception fails the test."""
    from accuracy.cli import main

    rc = main(args)
    out = capsys.readouterr()
    return rc, out.out + out.err


def _commands(path: Path, good: Path, out: Path) -> dict[str, list[str]]:
    return {
        "info": ["info", str(path)],
        "ls": ["ls", "--tensors", str(path)],
        "extract": ["extract", str(path), "-o", str(out / "x.h5"), "--overwrite"],
        "replay": ["replay", str(path), "-o", str(out / "r.h5"), "--overwrite", "-q"],
        "compare": ["compare", "-m", str(path), "-g", str(good), "-o", str(out / "rep"),
                    "--overwrite", "--no-progress"],
        "overflow": ["overflow", str(path), "--confirm-on", "cpu"],
        "verify": ["verify", str(path)],
    }


@pytest.mark.parametrize("case", sorted(REFUSED_AT_OPEN))
def test_every_command_refuses_crafted_file_in_one_line(case, good, tmp_path, capsys):
    reason, build = REFUSED_AT_OPEN[case]
    path = build(good, tmp_path / f"{case}.h5", tmp_path)
    for name, args in _commands(path, good, tmp_path).items():
        rc, out = _cli(args, capsys)
        assert rc == (1 if name == "verify" else 2), (name, out)
        assert "TOP-SECRET" not in out and out.count("\n") == 1, (name, out)
        assert reason in out and str(path) in out, (name, out)
        assert not (tmp_path / "x.h5").exists() and not (tmp_path / "r.h5").exists()


def test_info_refusal_is_one_line_without_traceback(good, tmp_path, capsys):
    from accuracy.cli import main

    path = C.deep_json_extra(good, tmp_path / "deep.h5")
    assert main(["ls", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nested deeper than 64" in err


def test_flipped_data_byte_is_an_error_naming_the_tensor(good, tmp_path):
    path = C.flipped_data(good, tmp_path / "flip.h5")
    with load_dump(path) as d:  # the index is intact: listing still works
        first = next(t for t in d.tensors if t.has_data)
        with pytest.raises(DumpError, match=f"{first.address}: data damaged"):
            first.load()
        with pytest.raises(DumpError, match="data damaged"):
            d.read_tensor_mapped(first)
        problems = d.verify()
    assert problems and all(first.address in p for p in problems)


def test_flipped_data_byte_fails_compare_replay_extract_and_verify(good, tmp_path, capsys):
    path = C.flipped_data(good, tmp_path / "flip.h5")
    for name, args in _commands(path, good, tmp_path).items():
        if name == "overflow":
            continue  # no inf/nan in this dump: nothing to confirm, nothing read
        rc, out = _cli(args, capsys)
        if name in ("info", "ls"):
            assert rc == 0, (name, out)  # they read no tensor bytes
            continue
        assert rc == (1 if name == "verify" else 2), (name, out)
        assert "/aten.mm.default/0/input/0: data damaged" in out, (name, out)


def test_verify_passes_a_good_dump_and_replay_output(good, tmp_path):
    from accuracy.cli import main
    from accuracy.replay.engine import replay

    replay(good, tmp_path / "replay.h5")
    assert main(["verify", str(good), str(tmp_path / "replay.h5")]) == 0


def test_compare_verifies_checksums_of_bulk_reads(good, tmp_path):
    path = C.flipped_data(good, tmp_path / "flip.h5")
    with pytest.raises(DumpError, match="data damaged"):
        compare(path, good)


def test_negative_numbers_and_dtypes_checksum_roundtrip(tmp_path):
    """Verification recomputes the dumper's checksum for every dtype family (both the numpy
    path for small tensors and the torch path for large ones)."""
    tensors = [torch.randn(5), torch.randn(40000), torch.randn(7).half(),
               torch.randn(40000).bfloat16(), torch.randint(-9, 9, (6,), dtype=torch.int8),
               torch.randint(-5, 5, (30000,), dtype=torch.int64), torch.randn(3) > 0,
               torch.randn(4, dtype=torch.complex64), torch.randn(20000).double(),
               torch.randn(9).to(torch.float8_e4m3fn)]
    path = tmp_path / "dtypes.h5"
    with dumper(dump_path=path):
        for t in tensors:
            t.clone()
    with load_dump(path) as d:
        assert d.verify() == []
        loaded = [t.load() for t in d.tensors if t.has_data]
    assert len(loaded) >= len(tensors)


# -- report writers ------------------------------------------------------------------------

HOSTILE = {"phase": "<script>alert('phase')</script>", "module": "=HYPERLINK(\"http://x\")",
           "source": "+cmd|' /C calc'!A0", "op_suffix": "@SUM(1)"}


def _hostile_dumps(tmp_path: Path) -> tuple[Path, Path]:
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    paths = []
    for name, scale in (("my.h5", 1.001), ("golden.h5", 1.0)):
        p = tmp_path / name
        with dumper(dump_path=p):
            ((x * scale) @ x).relu().sum()
        with h5py.File(p, "r+") as f:  # strings an attacker controls, as a dump holds them
            C.edit_op_texts(f, lambda ops: [o.update(phase=HOSTILE["phase"],
                                                     module=HOSTILE["module"],
                                                     source=HOSTILE["source"]) for o in ops])
            C.reseal(f)  # the attacker recomputes the (unkeyed) metadata hashes
        paths.append(p)
    return paths[0], paths[1]


def test_reports_escape_everything(tmp_path):
    my, golden = _hostile_dumps(tmp_path)
    rep = compare(my, golden)
    rep.summary["suspects"] = rep.summary.get("suspects") or [
        {"index": 0, "op": "<b>op</b>", "module": "<i>m</i>", "phase": HOSTILE["phase"],
         "score": 1.0, "verdict": "<u>v</u>"}]
    files = rep.write(tmp_path / "report")
    page = Path(files["html"]).read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(" in page
    assert "<b>op</b>" not in page and "<u>v</u>" not in page

    with zipfile.ZipFile(files["xlsx"]) as z:
        sheets = "".join(z.read(n).decode() for n in z.namelist() if n.startswith("xl/"))
    assert "<f>" not in sheets  # no formula cell anywhere
    assert "HYPERLINK" in sheets  # the text is there, as text

    with open(files["csv"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and all(r["Module"] == "'" + HOSTILE["module"] for r in rows)
    assert all(r["Source"] == "'" + HOSTILE["source"] for r in rows)
    assert all(r["Phase"] == HOSTILE["phase"] for r in rows)  # '<' is not a formula start


def test_names_from_a_dump_cannot_drive_the_terminal(tmp_path, capsys):
    """Escape sequences and newlines in a dump's names reach the terminal as \\xNN text: they
    cannot recolour, move the cursor or split `accuracy ls`'s one line per op."""
    from accuracy.cli import main

    esc = "\x1b]0;pwned\x07\x1b[2J"
    paths = []
    for name, scale in (("my.h5", 1.001), ("golden.h5", 1.0)):
        p = tmp_path / name
        x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
        with dumper(dump_path=p):
            ((x * scale) @ x).relu().sum()
        with h5py.File(p, "r+") as f:
            C.edit_op_texts(f, lambda ops: [o.update(module=f"blk{esc}\nfake line",
                                                     source=f"t.py:1{esc}") for o in ops])
            C.reseal(f)
        paths.append(p)
    with load_dump(paths[0]) as d:
        n_ops = len(d.records)
    assert main(["ls", "--source", str(paths[0])]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert len(out.splitlines()) == n_ops and "\\x1b]0;pwned\\x07" in out
    for argv in (["info", str(paths[0])],
                 ["compare", "-m", str(paths[0]), "-g", str(paths[1]), "--no-progress"]):
        main(argv)
        out = capsys.readouterr()
        assert "\x1b" not in out.out + out.err and "\x07" not in out.out + out.err, argv


def test_log_lines_on_stderr_escape_names_from_the_file(good, tmp_path):
    """A name the file holds reaches stderr through a log line (a sim rule replay cannot
    emulate) without its escape sequences. In a process of its own: under pytest the CLI's
    logging handler is pytest's."""
    bad = C.sim_rule_named(good, tmp_path / "bad.h5", "aten.mm\x1b]0;pwned\x07\x1b[2J*")
    r = subprocess.run([sys.executable, "-m", "accuracy.cli", "replay", str(bad), "-o",
                        str(tmp_path / "r.h5"), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "rule aten.mm\\x1b]0;pwned\\x07\\x1b[2J* not emulated" in r.stderr, r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr


def test_an_overflow_entry_that_is_not_a_table_is_read_as_none(tmp_path, capsys):
    """A check_overflow dump whose op says `"overflow": 5`: `accuracy overflow` reads no birth
    from it, without a traceback."""
    import json

    from accuracy.cli import main

    path = tmp_path / "o.h5"
    with dumper(path, check_overflow=True):
        (torch.full((4,), 1e38) * 10).sum()
    with h5py.File(path, "r+") as f:
        def edit(texts: list[dict[str, str]]) -> None:
            for t in texts:
                t["extra"] = json.dumps({"overflow": 5})
        C.edit_op_texts(f, edit)
        C.reseal(f)
    assert main(["overflow", str(path)]) == 0
    out = capsys.readouterr().out
    assert "no op produced inf/nan from finite inputs" in out and "inherited (1 ops" in out


def test_the_cli_stdout_escapes_control_characters_but_keeps_its_lines(capsys):
    """Whatever a command prints (a name some line forgot to escape too) reaches the terminal
    without escape sequences; tabs and newlines, the CLI's own layout, stay."""
    import sys

    from accuracy.termtext import PrintableStream

    out = PrintableStream(sys.stdout)
    print("a\x1b[31mred\x1b[0m\r\tb\n\x9bc", file=out)
    assert capsys.readouterr().out == "a\\x1b[31mred\\x1b[0m\\x0d\tb\n\\x9bc\n"


def test_csv_keeps_negative_numbers_numeric():
    from accuracy.compare.writers import _csv_cell

    assert _csv_cell(-1.5) == -1.5 and _csv_cell(-3) == -3
    assert _csv_cell("-1+1") == "'-1+1" and _csv_cell("\tx") == "'\tx"
    assert _csv_cell("aten.add") == "aten.add"


# -- disk filled by another program while the dump is open --------------------------------

_FILL_DURING_DUMP = """
import os, sys
from accuracy import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm
model, batch = tiny_lm(), lm_batch()
path = sys.argv[1]
with dumper(dump_path=path):
    lm_step(model, batch)
    try:  # another program takes every free byte of the disk
        with open(os.path.join(os.path.dirname(path), "filler"), "wb") as f:
            while True:
                f.write(bytes(1 << 16))
    except OSError:
        pass
    for _ in range(2):
        loss = lm_step(model, batch)
print("training finished", float(loss.detach()))
"""


def test_disk_filled_under_a_running_dump_training_exits_0(tmp_path):
    from tests.dumpfile.test_writer_reliability import _mount_tmpfs

    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "64m"):
        pytest.skip("needs root to mount a small tmpfs as a disk that fills up")
    try:
        script = tmp_path / "train.py"
        script.write_text(_FILL_DURING_DUMP)
        env = dict(os.environ, PYTHONPATH=str(REPO))
        p = subprocess.run([sys.executable, str(script), str(disk / "run.h5")],
                           capture_output=True, text=True, timeout=240, env=env,
                           start_new_session=True)
        assert p.returncode == 0, p.stderr[-2000:]  # was 139: a segfault at exit
        assert "training finished" in p.stdout
        assert "No space left on device" in p.stderr  # the real ENOSPC path was taken
        (disk / "filler").unlink()
        with load_dump(disk / "run.h5") as d:
            assert not d.attrs["complete"] and d.records
            assert d.verify() == []
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
