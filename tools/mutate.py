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
    python tools/mutate.py -j 2           # two mutants at once, each in its own copy
    python tools/mutate.py --ci           # what CI runs: the mutants of what changed since
                                          # .ci/mutate-baseline + a rotating quarter of the rest
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
BASELINE = ROOT / ".ci" / "mutate-baseline"  # the commit of the last full run, all killed
COPY = ("accuracy", "tests", "benchmarks", "pyproject.toml",  # tests import benchmarks/ too
        "README.md", "docs", "Makefile")  # tests that read the examples and make targets


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


def _git(*args: str) -> str | None:
    import subprocess

    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def changed_since_baseline() -> set[str] | None:
    """Files changed since the commit of the last full run that killed every mutant
    (`.ci/mutate-baseline`), committed or not; None when that commit is unknown here."""
    if not BASELINE.exists():
        return None
    commit = BASELINE.read_text().strip()
    diff = _git("diff", "--name-only", commit)
    return None if diff is None else {line for line in diff.splitlines() if line}


def ci_selection(mutants: list[Mutant], changed: set[str] | None, share: int,
                 day: int) -> tuple[list[Mutant], str]:
    """The mutants CI runs: every one whose file or tests changed since the baseline, then a
    rotating 1/`share` of the rest (which share follows the day), so each mutant runs in CI at
    least every `share` days while a change's own rules always run. (selected, why)"""
    if changed is None:
        return mutants, "no known baseline: every mutant"
    def touched(m: Mutant) -> bool:
        return m.file in changed or any(t.split("::")[0] in changed for t in m.tests)
    own = [m for m in mutants if touched(m)]
    rest = [m for i, m in enumerate(mutants) if not touched(m) and i % share == day % share]
    return own + rest, (f"{len(own)} whose file or tests changed since the baseline + "
                        f"{len(rest)} of the rest (share {day % share + 1} of {share})")


def _copy_tree(dest: Path) -> None:
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.h5", ".msprobe-venv", "out"))
        else:
            shutil.copy2(src, dest / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only mutants whose name contains this")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test run")
    ap.add_argument("-j", "--jobs", type=int, default=1,
                    help="mutants run at once, each in its own copy of the tree")
    ap.add_argument("--ci", action="store_true",
                    help="only the mutants of what changed since .ci/mutate-baseline, plus a "
                         "rotating share of the rest")
    ap.add_argument("--share", type=int, default=4, help="with --ci: 1/N of the rest runs")
    ap.add_argument("--record-baseline", action="store_true",
                    help="after a full run that kills every mutant on a clean tree, write HEAD "
                         "to .ci/mutate-baseline")
    args = ap.parse_args(argv)
    mutants = [m for m in load_mutants() if args.k in m.name]
    if not mutants:
        print(f"no mutant matches {args.k!r}", file=sys.stderr)
        return 2
    full = not args.k and not args.ci
    if args.ci:
        mutants, why = ci_selection(mutants, changed_since_baseline(), max(1, args.share),
                                    time.gmtime().tm_yday)
        print(f"CI selection: {why}", flush=True)
    _preload()
    for m in mutants:  # fail before any run when the list is out of step with the code
        check_applies(m, ROOT)
    jobs = max(1, min(args.jobs, len(mutants)))
    trees = [Path(tempfile.mkdtemp(prefix="accuracy-mutate-")) for _ in range(jobs)]
    try:
        for tree in trees:
            _copy_tree(tree)
        selected = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
        rc, secs, last = run_tests(trees[0], selected, args.timeout * 2)
        print(f"baseline: {len(selected)} test selections, rc={rc}, {secs:.0f} s: {last}",
              flush=True)
        if rc != 0:
            print("the selected tests fail without any mutant: fix them first", file=sys.stderr)
            return 2
        results = _run_all(mutants, trees, args.timeout)
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    print()
    print(f"{'mutant':<34} {'result':<16} tests")
    for m, state, _, _ in results:
        print(f"{m.name:<34} {state:<16} {' '.join(m.tests)}")
    bad = [m.name for m, state, _, _ in results if state != "killed"]
    print(f"\n{len(results) - len(bad)} of {len(results)} mutants killed")
    if bad:
        print(f"not killed: {', '.join(bad)}", file=sys.stderr)
        return 1
    if args.record_baseline:
        _record_baseline(full)
    return 0


def _run_all(mutants: list[Mutant], trees: list[Path],
             timeout: int) -> list[tuple[Mutant, str, float, str]]:
    """Each mutant applied in one of `trees` (one thread per tree; the tests run in forked
    children, so the threads only wait), in the list's order."""
    import queue
    import threading

    todo: queue.Queue[tuple[int, Mutant]] = queue.Queue()
    for i, m in enumerate(mutants):
        todo.put((i, m))
    done: dict[int, tuple[Mutant, str, float, str]] = {}
    lock = threading.Lock()

    def worker(tree: Path) -> None:
        while True:
            try:
                i, m = todo.get_nowait()
            except queue.Empty:
                return
            path = tree / m.file
            text = check_applies(m, tree)
            path.write_text(text.replace(m.original, m.replacement))
            try:
                rc, secs, last = run_tests(tree, m.tests, timeout)
            finally:
                path.write_text(text)
            # pytest exit 1 = tests failed: killed. 0 = survived. Anything else (collection
            # error, no tests, timeout) is not a clean kill and needs a look.
            state = {0: "SURVIVED", 1: "killed"}.get(rc, f"broken (rc={rc})")
            with lock:
                done[i] = (m, state, secs, last)
                print(f"{m.name:<34} {state:<16} {secs:5.0f} s  {last[:70]}", flush=True)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in trees]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [done[i] for i in sorted(done)]


def _record_baseline(full: bool) -> None:
    if not full:
        print("not recorded as the baseline: only a full run (no -k, no --ci) is one")
        return
    if (_git("status", "--porcelain", "--", *COPY, "tools") or "").strip():
        print("not recorded as the baseline: the tree has uncommitted changes")
        return
    head = (_git("rev-parse", "HEAD") or "").strip()
    if head:
        BASELINE.write_text(head + "\n")
        print(f"recorded {head[:12]} in {BASELINE.relative_to(ROOT)}: commit it")


if __name__ == "__main__":
    sys.exit(main())
