"""The user's source line of an op: the first frame outside torch, accuracy and the stdlib."""

from __future__ import annotations

from accuracy.dumper import source


def _functions(n: int, filename: str) -> list:
    """`n` functions, each its own code object, calling `user_source` from `filename`."""
    made = []
    for i in range(n):
        ns: dict = {"user_source": source.user_source}
        exec(compile(f"def f{i}():\n    return user_source(True)\n", filename, "exec"), ns)
        made.append(ns[f"f{i}"])
    return made


def test_the_innermost_user_frame_and_the_stack_above_it():
    def caller():
        return source.user_source(True)

    line, stack = caller()
    assert line.startswith(__file__ + ":")
    assert "in caller" in stack and "in test_the_innermost_user_frame_and_the_stack_above_it" \
        in stack


def test_the_cache_of_code_objects_stays_bounded(monkeypatch):
    # code made at run time (FX graph modules, exec) must not be kept alive forever by the
    # walk's cache: a long job that makes code every step would grow without end
    monkeypatch.setattr(source, "_MAX_CODES", 8)
    monkeypatch.setattr(source, "_internal_code", {})
    for f in _functions(40, "/work/user/model.py"):
        line, _ = f()
        assert line == "/work/user/model.py:2"  # still the right line after each clear
        assert len(source._internal_code) <= 8
