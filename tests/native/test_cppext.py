"""The shared build cache of the C++ extensions (accuracy/native/cppext.py): built once per
machine, concurrent builders wait for one another, and nothing half-built or foreign is loaded.

A tiny extension (a C-API module, no torch headers) keeps each build under a second."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accuracy.errors import ExtensionUnavailableError
from accuracy.native import cppext

TINY = """
#include <Python.h>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
static PyModuleDef def = {PyModuleDef_HEAD_INIT, "tiny", nullptr, -1, nullptr};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* m = PyModule_Create(&def);
  PyModule_AddIntConstant(m, "answer", ANSWER);
  return m;
}
"""

# Loads the tiny extension in a fresh process (a module name is loaded once per process);
# waits for `go` first when given, so that two processes ask at the same moment.
RUN = """
import json, os, sys, time
from pathlib import Path
go = os.environ.get("GO")
if go:
    Path(go + "." + str(os.getpid())).touch()
    while not Path(go).exists():
        time.sleep(0.005)
from accuracy.native import cppext
m = cppext.load_extension("tiny", [sys.argv[1]])
print(json.dumps({"answer": m.answer, "built": cppext.built_here, "file": m.__file__}))
"""


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "tiny.cpp"
    src.parent.mkdir()
    src.write_text(TINY.replace("ANSWER", "42"))
    return src


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ACCURACY_CACHE_DIR", str(root))
    return root


def _start(source: Path, cache: Path, go: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "ACCURACY_CACHE_DIR": str(cache)}
    if go is not None:
        env["GO"] = str(go)
    return subprocess.Popen([sys.executable, "-c", RUN, str(source)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _run(source: Path, cache: Path) -> dict:
    return _result(_start(source, cache))


def test_built_once_then_loaded_and_never_trusted_blindly(source, cache):
    first = _run(source, cache)
    assert first == {**first, "answer": 42, "built": ["tiny"]}
    library = Path(first["file"])
    assert library.parent.parent == cache / "torch_extensions"
    assert not list(library.parent.glob("*.o"))  # only the library is kept
    before = library.stat().st_mtime_ns
    second = _run(source, cache)
    assert second["built"] == [] and second["answer"] == 42 and second["file"] == first["file"]
    assert library.stat().st_mtime_ns == before
    # the library's bytes no longer match the manifest (damaged since, or swapped)
    library.write_bytes(library.read_bytes() + b"\0")
    again = _run(source, cache)
    assert again["built"] == ["tiny"] and again["answer"] == 42
    # a crash before the manifest was written: the folder holds a library no one vouches for
    (library.parent / "BUILT.json").unlink()
    library.write_bytes(b"half")
    again = _run(source, cache)
    assert again["built"] == ["tiny"] and again["answer"] == 42
    # a changed source is a new build beside the old one, never the old library
    source.write_text(TINY.replace("ANSWER", "43"))
    changed = _run(source, cache)
    assert changed["answer"] == 43 and changed["built"] == ["tiny"]
    assert changed["file"] != first["file"]


def test_two_processes_asking_at_once_build_it_once(source, cache, tmp_path):
    go = tmp_path / "go"
    procs = [_start(source, cache, go) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.*"))) < 2:  # both imported torch and wait at the line
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.01)
    go.touch()
    results = [_result(p) for p in procs]
    assert [r["answer"] for r in results] == [42, 42]
    assert sorted(len(r["built"]) for r in results) == [0, 1]


def test_a_cache_others_can_write_is_refused(source, cache, monkeypatch):
    name = "tiny_private"  # built here, in this process, once
    folder = Path(cppext.load_extension(name, [source]).__file__).parent
    monkeypatch.setattr(cppext, "_loaded", {})
    monkeypatch.delitem(sys.modules, f"{name}_{folder.name.rsplit('-', 1)[1]}")
    os.chmod(folder, 0o770)  # group-writable: someone else could swap the library
    with pytest.raises(ExtensionUnavailableError, match="writable by others"):
        cppext.load_extension(name, [source])
    os.chmod(folder, 0o700)
    os.chmod(folder.parent, folder.parent.stat().st_mode | stat.S_IWOTH)
    with pytest.raises(ExtensionUnavailableError, match="only you can write"):
        cppext.load_extension(name, [source])


def test_a_compiler_that_does_not_run_is_one_clear_line(source, cache, monkeypatch):
    # CXX names a program that exists but fails (`false`, a broken wrapper): torch's own check
    # of it raised CalledProcessError, which escaped as "Command '['false', '--version']'
    # returned non-zero exit status 1", saying neither what failed nor what to do
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(ExtensionUnavailableError) as caught:
        cppext.load_extension("tiny_brokencompiler", [source])
    message = str(caught.value)
    assert "\n" not in message and "'false'" in message and "set CXX" in message


def test_no_compiler_or_a_compile_error_is_one_clear_line(source, cache, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(ExtensionUnavailableError, match="no C\\+\\+ compiler"):
        cppext.load_extension("tiny_nocompiler", [source])
    monkeypatch.delenv("CXX")
    source.write_text("this is not C++;\n")
    with pytest.raises(ExtensionUnavailableError) as caught:
        cppext.load_extension("tiny_broken", [source])
    message = str(caught.value)
    assert "\n" not in message and ": error:" in message and "full log:" in message
    log_path = Path(message.rsplit("full log: ", 1)[1].rstrip(")"))
    assert "this is not C++" in log_path.read_text()
