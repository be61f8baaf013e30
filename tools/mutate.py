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
    python tools/mutate.py --ci           # what CI runs: every mutant not killed on what it
                                          # covers today (.ci/mutants-killed.json) + a rotating
                                          # sixth of the rest
    python tools/mutate.py -k x --record  # note in .ci/mutants-killed.json what was killed

Why a record per mutant and not one baseline commit: a full run takes hours on a 2-core machine
beside other work, and any run of some mutants (a change's own, a helper's) is evidence too. A
mutant's entry is the digest of what its kill depended on (its definition, its file and its
test files); CI runs it again as soon as one of them changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
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
RECORD = ROOT / ".ci" / "mutants-killed.json"  # mutant name -> digest of what it was killed on
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


def digest(m: Mutant, root: Path = ROOT) -> str:
    """What a kill of `m` depended on: its definition, its file and its test files' bytes."""
    h = hashlib.sha256()
    for part in (m.file, m.original, m.replacement, *m.tests):
        h.update(part.encode() + b"\0")
    for path in sorted({m.file, *(t.split("::")[0] for t in m.tests)}):
        f = root / path
        h.update(path.encode() + b"\0" + (f.read_bytes() if f.is_file() else b"<missing>"))
    return h.hexdigest()


def load_record(path: Path = RECORD) -> dict[str, str]:
    """Mutant name -> digest at its last kill; {} when there is none or it is unreadable."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        logging.warning("%s unreadable (%s): every mutant counts as not yet killed", path, e)
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)}


def ci_selection(mutants: list[Mutant], killed: dict[str, str], share: int, day: int,
                 root: Path = ROOT) -> tuple[list[Mutant], str]:
    """The mutants CI runs: every one not killed on what it covers today (no entry in the
    record, or its file, tests or definition changed since), then a rotating 1/`share` of the
    rest (which share follows the day), so each mutant runs in CI at least every `share` days
    while a change's own rules always run. (selected, why)"""
    own = [m for m in mutants if killed.get(m.name) != digest(m, root)]
    rest = [m for i, m in enumerate(mutants)
            if m not in own and i % share == day % share]
    return own + rest, (f"{len(own)} not killed on what they cover today + "
                        f"{len(rest)} of the rest (share {day % share + 1} of {share})")


def record_kills(results: list[tuple[Mutant, str]], path: Path = RECORD,
                 root: Path = ROOT) -> int:
    """Note each killed mutant's digest and forget each one that was not; entries of mutants
    no longer in the list are dropped. Returns the number of kills noted."""
    known = {m.name for m in load_mutants()} if root == ROOT else None
    record = load_record(path)
    noted = 0
    for m, state in results:
        if state == "killed":
            record[m.name] = digest(m, root)
            noted += 1
        else:
            record.pop(m.name, None)
    if known is not None:
        record = {k: v for k, v in record.items() if k in known}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(record.items())), indent=0) + "\n")
    tmp.replace(path)
    return noted


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
                    help="only the mutants not killed on what they cover today "
                         "(.ci/mutants-killed.json), plus a rotating share of the rest")
    ap.add_argument("--share", type=int, default=6, help="with --ci: 1/N of the rest runs")
    ap.add_argument("--record", action="store_true",
                    help="note the killed mutants in .ci/mutants-killed.json (a clean tree "
                         "only: commit the file)")
    args = ap.parse_args(argv)
    mutants = [m for m in load_mutants() if args.k in m.name]
    if not mutants:
        print(f"no mutant matches {args.k!r}", file=sys.stderr)
        return 2
    if args.ci:
        mutants, why = ci_selection(mutants, load_record(), max(1, args.share),
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
    if args.record:
        if (_git("status", "--porcelain", "--", *COPY, "tools") or "").strip():
            print("not recorded: the tree has uncommitted changes")
        else:
            n = record_kills([(m, state) for m, state, _, _ in results])
            print(f"{n} kills noted in {RECORD.relative_to(ROOT)}: commit it")
    if bad:
        print(f"not killed: {', '.join(bad)}", file=sys.stderr)
        return 1
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


if __name__ == "__main__":
    sys.exit(main())
