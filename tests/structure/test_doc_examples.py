"""Every `accuracy ...` command a user is shown (in `accuracy --help`, the README and docs/) is
one the command line accepts as written (#50: the help suggested `accuracy serve --report
report/`, which argparse refused for a missing `--data`).

The check is the parser's, not a run: the examples name the user's own files (npu.h5, a Dask
scheduler, a PostgreSQL server, a server that runs until Ctrl-C), so running them here would
test the fixtures, not the text. Parsing catches what goes stale in an example: a required
option left out, an option renamed or removed, a bad choice or value. Command lines in code
blocks must parse whole; a command quoted inside a sentence (`accuracy compare -r`) is a
reference, so only its subcommand and the options it names must exist.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from accuracy.cli import DESCRIPTION, build_parser

REPO = Path(__file__).resolve().parents[2]
TEXTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_COMMAND = re.compile(r"^\s*(?:\$ )?(accuracy\s.*)$")
_INLINE = re.compile(r"`(accuracy [a-z][^`]*)`")


def _words(line: str) -> list[str]:
    return shlex.split(line, comments=True)[1:]


def _block_commands(text: str) -> list[str]:
    """`accuracy ...` lines inside fenced code blocks, continuation lines joined."""
    found, fenced, pending = [], False, None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        if not fenced:
            continue
        if pending is not None:
            pending += " " + line.strip()
        else:
            m = _COMMAND.match(line)
            if not m:
                continue
            pending = m.group(1).strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
        else:
            found.append(pending)
            pending = None
    return found


def _help_commands() -> list[str]:
    return [m.group(1).split("  ")[0].strip() for line in DESCRIPTION.splitlines()
            if (m := _COMMAND.match(line))]


def _examples() -> list[tuple[str, str]]:
    cases = [("accuracy --help", cmd) for cmd in _help_commands()]
    for path in TEXTS:
        cases += [(path.relative_to(REPO).as_posix(), cmd)
                  for cmd in _block_commands(path.read_text(encoding="utf-8"))]
    return cases


def _mentions() -> list[tuple[str, str]]:
    return [(path.relative_to(REPO).as_posix(), m.group(1))
            for path in TEXTS for m in _INLINE.finditer(path.read_text(encoding="utf-8"))]


def _parse(argv: list[str]) -> str:
    """argparse's complaint about argv ('' when it is accepted)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser(argv).parse_args(argv)
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if e.code else ""
    return ""


def test_the_examples_are_found():
    """The extraction itself: the help's three commands and the README's quick start."""
    cases = _examples()
    assert [c for w, c in cases if w == "accuracy --help"] == [
        "accuracy replay npu.h5 -o replay.h5",
        "accuracy compare -m npu.h5 -g gpu.h5 -r replay.h5 -o report/",
        "accuracy serve --report report/"]
    readme = [c for w, c in cases if w == "README.md"]
    assert any(c.startswith("accuracy prove ") and "--golden-step" in c for c in readme), \
        "a continued line (ending in \\) is one command"
    assert len(cases) > 40 and len(_mentions()) > 60


@pytest.mark.parametrize(("where", "command"), _examples())
def test_example_parses_as_written(where, command):
    problem = _parse(_words(command))
    assert not problem, f"{where}: `{command}` is refused: {problem}"


def _subparser(parser: argparse.ArgumentParser, words: list[str]
               ) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub)parser the leading subcommand words select, and the words after them."""
    while words:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or words[0] not in subs[0].choices:
            break
        parser, words = subs[0].choices[words[0]], words[1:]
    return parser, words


@pytest.mark.parametrize(("where", "mention"), _mentions())
def test_command_named_in_a_sentence_exists(where, mention):
    words = mention.replace("[", " ").replace("]", " ").split()[1:]
    parser, rest = _subparser(build_parser(words[:1]), words)
    assert parser.prog != "accuracy", f"{where}: `{mention}` names no accuracy command"
    options = parser._option_string_actions
    unknown = [w.split("=")[0] for w in rest
               if w.startswith("-") and w != "-" and w.split("=")[0] not in options]
    assert not unknown, f"{where}: `{mention}`: {parser.prog} has no option {unknown}"


def test_help_serve_example_runs_without_data(tmp_path):
    """`accuracy serve --report report/` (the help's last step) serves the report; its index
    lives in a temporary folder the server names and removes when it stops."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    import torch

    from accuracy import dumper
    from accuracy.compare import compare

    model = torch.nn.Linear(4, 3)
    for side in ("my", "golden"):
        with dumper(tmp_path / f"{side}.h5"):
            model(torch.ones(2, 4)).sum().backward()
    compare(tmp_path / "my.h5", tmp_path / "golden.h5").write(tmp_path / "report",
                                                              formats=("json",))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "accuracy.cli", "serve", "--report",
                             str(tmp_path / "report"), "--port", "0"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any(ln.startswith("accuracy serve: http") for ln in lines):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(lines)
            lines.append(line)
        url = lines[-1].split()[2]
        temporary = next(ln for ln in lines if "no --data" in ln).split(" in ")[1].split()[0]
        assert Path(temporary, "index.sqlite").exists() or any(Path(temporary).iterdir())
        while True:  # the URL is printed once the port is bound, before uvicorn listens
            try:
                page = urllib.request.urlopen(url, timeout=30).read().decode()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
                time.sleep(0.3)
        assert "report" in page
        report_id = next(ln for ln in lines if ln.startswith("report ")).split()[1].rstrip(":")
        assert urllib.request.urlopen(f"{url}ui/reports/{report_id}", timeout=30).status == 200
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode in (0, 130), "".join(lines) + proc.stdout.read()  # 130: Ctrl-C
    assert not Path(temporary).exists(), "the temporary index outlived the server"
    assert not list(tmp_path.glob("*.sqlite")), "nothing is written into the working folder"
