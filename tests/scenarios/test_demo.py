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
    # the op as users type it (issue 50: `--fault-op aten.gelu` met no call and the demo ended
    # "no culprit"); the report names the overload
    assert main(["demo", "--no-serve", "--out", str(tmp_path / "demo"),
                 "--fault-op", "aten.gelu"]) == 0
    out = capsys.readouterr().out
    for step in range(1, 7):
        assert f"[{step}/6]" in out
    culprit = re.search(r"CULPRIT: (\S+)\s+\[(\w+)\]\s+(\S+)\s*\n\s+at (\S+)", out)
    assert culprit, out
    assert culprit.group(1) == "aten.gelu.default" and culprit.group(2) == "forward"
    assert culprit.group(3).endswith("encoder.layers.2")
    figures = re.search(r"cosine (\S+), max abs err (\S+)", out[culprit.end():])
    assert figures and len(figures.group(1)) <= 10 and len(figures.group(2)) <= 9, out
    path, _, line = culprit.group(4).rpartition(":")
    assert f"{Path(path).resolve()}:{line}" == _user_line(), culprit.group(4)
    # One verdict per tensor, judged where produced: the GELU output is the only error, and
    # the fp16-cube matmuls (a documented precision choice) raise no warning either. (The
    # row counts also hold the rows that read the GELU output and the modules around it.)
    judged = dict(re.findall(r"(pass|warning|error) (\d+)",
                             out.split("tensors judged where produced:")[1].splitlines()[0]))
    assert judged["error"] == "1" and judged["warning"] == "0", judged
    counts = dict(re.findall(r"(pass|warning|error|unmatched|skipped) (\d+)",
                             out.split("verdicts:")[1].splitlines()[0]))
    assert counts["warning"] == "0", counts
    birth = re.search(r"overflow: inf/nan born in (\S+)\s+\[(\w+)\]\s+(\S+)", out)
    assert birth, out
    # on the demo's own LM (its causal mask's -inf is intended, not a birth)
    assert birth.groups() == ("aten.addmm.default", "forward",
                              "TinyTransformerLM.encoder.layers.1.linear2")
    # the live check stops at the injected op, and substituting it closes the gap; the control
    # does not
    live = re.search(r"live check stopped at (\S+) \(call \d+, (\w+)\) in (\S+)", out)
    assert live and live.group(1) == "aten.gelu.default", out
    assert live.group(3).endswith("encoder.layers.2")
    proof = re.search(r"closes (\d+)% of the loss gap.*control .*closes (\d+)%", out)
    assert proof and int(proof.group(1)) >= 90 and int(proof.group(2)) <= 10, out
    assert (tmp_path / "demo" / "report" / "proof" / "proof.html").exists()
    assert (tmp_path / "demo" / "report" / "index.html").exists()


def test_demo_with_another_fault(tmp_path, capsys):
    args = ["demo", "--no-serve", "--out", str(tmp_path / "d2"), "--fault-op",
            "aten.native_layer_norm.default", "--fault-module", "encoder.layers.1.norm2",
            "--fault-kind", "bias", "--fault-value", "0.05"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"CULPRIT: aten.native_layer_norm.default\s+\[forward\]\s+\S+layers.1.norm2",
                     out), out
