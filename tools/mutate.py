"""Mutation check: apply each curated bug in tools/mutants.toml to a copy of the tree, one at a
time, run the tests that cover it, and require that they fail (the mutant is "killed").

Why a curated list and not mutmut: each mutant is a bug in a rule a user relies on (culprit
choice, verdict thresholds, decodes, checksums, dedupe, alignment, overflow births, uploads),
the run is deterministic and takes minutes, and a mutant whose original snippet no longer
exists fails loudly so the list is kept in step with the code.

The working tree is never modified: the tracked files are copied to a temporary directory and
mutated there (removed on exit, Ctrl-C included).

    python tools/mutate.py                # every mutant
    python tools/mutate.py -k culprit     # mutants whose name contains "culprit"
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = Path(__file__).with_name("mutants.toml")
COPY = ("accuracy", "tests", "benchmarks", "pyproject.toml")  # tests import benchmarks/ too


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str


def load_mutants(path: Path = LIST) -> list[Mutant]:
    data = tomllib.loads(path.read_text())
    out = []
    for m in data["mutant"]:
        out.append(Mutant(m["name"], m["file"], m["original"], m["replacement"],
                          tuple(m["tests"]), m.get("why", "")))
    names = [m.name for m in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit(f"{path}: duplicate mutant names {sorted(dup)}")
    return out


def check_applies(m: Mutant, root: Path) -> str:
    """The file's text; exits if the original snippet is missing or ambiguous."""
    text = (root / m.file).read_text()
    n = text.count(m.original)
    if n != 1:
        what = "no longer applies" if n == 0 else f"is ambiguous ({n} matches)"
        raise SystemExit(f"mutant {m.name!r} {what} in {m.file}: update tools/mutants.toml "
                         "(the 'original' snippet must occur exactly once)")
    return text


def _preload() -> None:
    """Import the heavy third-party libraries once; each test run forks from this process.

    Never `accuracy` itself: every child imports it fresh from the mutated copy.
    """
    import importlib

    for mod in ("numpy", "torch", "h5py", "pytest", "hypothesis", "fastapi", "httpx",
                "sqlalchemy", "jinja2", "fastapi.testclient"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass


def run_tests(tree: Path, tests: tuple[str, ...], timeout: int) -> tuple[int, float, str]:
    """pytest on `tests` inside `tree`, in a forked child (its own session); (rc, s, last line).

    rc is pytest's exit status, or -1 when the run took longer than `timeout`.
    """
    log = tree / ".mutate-log"
    args = ["-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", *tests]
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child: run pytest against the copy, never return into the parent's code
        rc = 3
        try:
            os.setsid()
            os.chdir(tree)
            os.environ["PYTHONPATH"] = str(tree)  # subprocesses of tests use the copy too
            os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
            sys.path.insert(0, str(tree))
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import pytest

            rc = int(pytest.main(args))
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - t0 > timeout:
                _kill_group(pid)
                os.waitpid(pid, 0)
                rc = -1
                break
            time.sleep(0.05)
    except BaseException:
        _kill_group(pid)
        os.waitpid(pid, 0)
        raise
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return rc, time.monotonic() - t0, "timed out" if rc == -1 else (lines[-1] if lines else "")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only mutants whose name contains this")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test run")
    args = ap.parse_args(argv)
    mutants = [m for m in load_mutants() if args.k in m.name]
    if not mutants:
        print(f"no mutant matches {args.k!r}", file=sys.stderr)
        return 2
    _preload()
    for m in mutants:  # fail before any run when the list is out of step with the code
        check_applies(m, ROOT)
    tmp = Path(tempfile.mkdtemp(prefix="accuracy-mutate-"))
    try:
        for name in COPY:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, tmp / name, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.h5", ".msprobe-venv", "out"))
            else:
                shutil.copy2(src, tmp / name)
        selected = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        rc, secs, last = run_tests(tmp, selected, args.timeout * 2)
        print(f"baseline: {len(selected)} test selections, rc={rc}, {secs:.0f} s: {last}")
        if rc != 0:
            print("the selected tests fail without any mutant: fix them first", file=sys.stderr)
            return 2
        results = []
        for m in mutants:
            path = tmp / m.file
            text = check_applies(m, tmp)
            path.write_text(text.replace(m.original, m.replacement))
            try:
                rc, secs, last = run_tests(tmp, m.tests, args.timeout)
            finally:
                path.write_text(text)
            # pytest exit 1 = tests failed: killed. 0 = survived. Anything else (collection
            # error, no tests, timeout) is not a clean kill and needs a look.
            state = {0: "SURVIVED", 1: "killed"}.get(rc, f"broken (rc={rc})")
            results.append((m, state, secs, last))
            print(f"{m.name:<34} {state:<16} {secs:5.0f} s  {last[:70]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(f"{'mutant':<34} {'result':<16} tests")
    for m, state, _, _ in results:
        print(f"{m.name:<34} {state:<16} {' '.join(m.tests)}")
    bad = [m.name for m, state, _, _ in results if state != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants killed")
    if bad:
        print(f"not killed: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
