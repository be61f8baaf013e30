"""`accuracy --help` and argument errors answer without importing torch (#19).

Each case runs in a fresh interpreter and reports which torch modules it imported; timings
live in benchmarks, not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_PROBE = """
import json, sys
from accuracy.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as e:
    code = e.code
sys.stdout.flush()
print(json.dumps({"code": code, "torch": sorted(m for m in sys.modules
                                               if m == "torch" or m.startswith("torch."))}),
      file=sys.stderr)
"""


def _probe(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(argv)], capture_output=True,
                       text=True, env=env, timeout=120, start_new_session=True)
    return json.loads(r.stderr.strip().splitlines()[-1]) | {"out": r.stdout,
                                                             "err": r.stderr}


@pytest.mark.parametrize("argv", [
    ["--help"],
    [],  # no command: usage error
    ["nope"],  # unknown command
    ["info"],  # missing argument
    ["info", "--help"],
    ["convert", "--help"],
    ["extract", "x.h5"],  # missing -o
    ["replay", "--help"],
    ["serve", "--help"],
])
def test_help_and_argument_errors_import_no_torch(argv):
    r = _probe(argv)
    assert r["torch"] == [], r
    assert r["code"] == (0 if "--help" in argv else 2)


def test_top_level_help_lists_every_command():
    r = _probe(["--help"])
    for command in ("info", "ls", "extract", "convert", "backends", "replay", "compare",
                    "overflow", "serve", "demo"):
        assert command in r["out"]


def test_import_accuracy_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = ("import sys, accuracy; print(sorted(m for m in sys.modules if m.split('.')[0] "
            "== 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert out.strip() == "[]"


def test_a_dumper_does_not_import_the_distributed_module_tracker(tmp_path):
    """The dumper names modules with torch.utils.module_tracker; the distributed ModTracker's
    package (DTensor, FSDP memory tracker, inductor: about 1 s) stays unimported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = ("import sys, torch\nfrom accuracy import dumper\n"
            "with dumper(sys.argv[1]):\n    torch.nn.Linear(2, 2)(torch.ones(2)).sum()\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch.distributed._tools')))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d.h5")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr
    from accuracy import load_dump

    with load_dump(tmp_path / "d.h5") as d:
        assert {r.module for r in d.records} == {"Linear", ""}


def test_part_help_table_matches_the_parts():
    """_PART_COMMANDS (what --help lists without importing) says what the parts register."""
    from accuracy import cli

    parser = cli.build_parser()  # no argv: every part imported and registered
    sub = next(a for a in parser._actions if a.dest == "command")
    registered = {a.dest: a.help for a in sub._choices_actions}
    for name, (module, text) in cli._PART_COMMANDS.items():
        assert module in cli._PART_CLIS
        assert registered[name] == text, name
    builtin = {"info", "ls", "extract", "convert", "backends"}
    unlisted = set(registered) - builtin - set(cli._PART_COMMANDS)
    assert not unlisted, f"add {sorted(unlisted)} to accuracy/cli.py _PART_COMMANDS"


def test_dumper_name_stays_the_context_manager():
    import accuracy
    import accuracy.dumper.core  # noqa: F401 - binds the subpackage name, as imports do
    from accuracy import dumper

    assert dumper is sys.modules["accuracy.dumper.core"].dumper
    assert accuracy.dumper is dumper


def test_a_dumper_hooks_inductor_only_when_dynamo_runs_inside_it(tmp_path):
    """Hooking Inductor imports it (1.2-1.5 s, paid by every dumper start, and by every
    forked or fresh process that opened one): a dumper over eager code leaves it unimported;
    the first compiled call inside the block hooks it, before dynamo compiles anything."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = ("import sys, torch\nfrom accuracy import dumper\n"
            "def hooked():\n"
            "    w = sys.modules.get('torch._inductor.codegen.wrapper')\n"
            "    return w is not None and 'install' in "
            "w.PythonWrapperCodegen.generate_kernel_call.__qualname__\n"
            "with dumper(sys.argv[1], mode='statistics'):\n"
            "    torch.ones(4).add(1)\n"
            "    print('torch._inductor.compile_fx' in sys.modules, hooked())\n"
            "    torch.compile(lambda x: (x * 2).sin(), backend='eager')(torch.ones(8))\n"
            "    print(hooked())\n"
            "print(hooked())\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d.h5")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.split() == ["False", "False", "True", "False"], out.stdout + out.stderr
