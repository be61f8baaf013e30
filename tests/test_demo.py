"""`accuracy demo --no-serve` tells the whole story: the injected op is the culprit."""

import inspect
import re
from pathlib import Path

from accuracy import examples
from accuracy.cli import main


def _user_line() -> str:
    """`file:line` of the model code that calls the encoder (where the faulty GELU runs)."""
    lines, start = inspect.getsourcelines(examples.TinyTransformerLM.forward)
    n = start + next(i for i, ln in enumerate(lines) if "self.encoder(" in ln)
    return f"{Path(examples.__file__).resolve()}:{n}"


def test_demo_names_the_injected_culprit_and_the_overflow_birth(tmp_path, capsys):
    assert main(["demo", "--no-serve", "--out", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    for step in range(1, 6):
        assert f"[{step}/5]" in out
    culprit = re.search(r"CULPRIT: (\S+)\s+\[(\w+)\]\s+(\S+)\s*\n\s+at (\S+)", out)
    assert culprit, out
    assert culprit.group(1) == "aten.gelu.default" and culprit.group(2) == "forward"
    assert culprit.group(3).endswith("encoder.layers.2")
    path, _, line = culprit.group(4).rpartition(":")
    assert f"{Path(path).resolve()}:{line}" == _user_line(), culprit.group(4)
    counts = dict(re.findall(r"(pass|warning|error|unmatched|skipped) (\d+)",
                             out.split("verdicts:")[1].splitlines()[0]))
    assert counts["error"] == "1", counts  # fp16-cube rounding elsewhere: pass or warning
    birth = re.search(r"overflow: inf/nan born in (\S+)\s+\[(\w+)\]\s+(\S+)", out)
    assert birth, out
    assert birth.groups() == ("aten.addmm.default", "forward", "OverflowingMLP.down")
    assert (tmp_path / "demo" / "report" / "index.html").exists()


def test_demo_with_another_fault(tmp_path, capsys):
    args = ["demo", "--no-serve", "--out", str(tmp_path / "d2"), "--fault-op",
            "aten.native_layer_norm.default", "--fault-module", "encoder.layers.1.norm2",
            "--fault-kind", "bias", "--fault-value", "0.05"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"CULPRIT: aten.native_layer_norm.default\s+\[forward\]\s+\S+layers.1.norm2",
                     out), out
