"""Two PrecisionDebugger trees compared step by step (`accuracy/compare/steps.py`): what the
summary says of each step, of the steps only one tree holds, and of a step that started from
parameters an earlier faulty step had already changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accuracy import PrecisionDebugger
from accuracy.compare.steps import compare_steps
from accuracy.device_backend import sim
from accuracy.examples import lm_batch, lm_step, tiny_lm

REPO = Path(__file__).resolve().parents[2]
GELU = "aten.gelu.default [forward] in TinyTransformerLM.encoder.layers.1"


def _train(root: Path, steps: list[int], faulty: bool) -> None:
    """Three SGD steps of the tiny LM, `steps` recorded; with `faulty`, every step's gelu in
    encoder layer 1 is 0.05 off, so the weights differ from golden after step 0."""
    model, batch = tiny_lm(), lm_batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    dbg = PrecisionDebugger(dump_path=str(root), step=steps)
    faults = [sim.fault("aten.gelu.default", module="encoder.layers.1", kind="bias",
                        value=0.05)] if faulty else []
    for _ in range(3):
        with sim(profile="exact", faults=faults):
            dbg.start(model)
            lm_step(model, batch)
            dbg.stop()
        opt.step()
        opt.zero_grad()
        dbg.step()


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("trees")
    _train(root / "dev", [0, 2], True)
    _train(root / "gold", [0, 1, 2], False)
    return root / "dev", root / "gold"


def test_the_summary_names_each_steps_culprit_by_module_and_step(trees, tmp_path):
    rep = compare_steps(*trees)
    text = rep.format()
    step0 = text[text.index("== step 0 =="):text.index("== step 2 ==")]
    assert "culprit #" in step0 and GELU in step0, step0
    assert "epoch" not in text  # one rank: no collective epoch read as a training epoch
    assert text.rstrip().endswith(f"first faulty step: step 0, {GELU} (rank 0)"), text
    page = rep.write(tmp_path / "rep", ("json", "html"))["step0 html"].read_text()
    assert "encoder.layers.1</code>" in page and "epoch 0" not in page


def test_a_step_starting_from_weights_that_already_differ_is_said(trees):
    """Step 2 starts from the weights the faulty steps 0 and 1 changed: its culprit may only
    have met them. Step 0 started from golden's weights and says nothing of the kind."""
    rep = compare_steps(*trees)
    assert not rep.start[0] and rep.start[2]
    assert {r.module for r in rep.start[2]} >= {"TinyTransformerLM.embed",
                                               "TinyTransformerLM.encoder.layers.0.linear1"}
    text = rep.format()
    said = [ln for ln in text.splitlines() if "parameters differ at the start" in ln]
    assert len(said) == 1 and said[0].lstrip().startswith(
        "parameters differ at the start of step 2 (")
    assert said[0].endswith("compare the first faulty step, step 0"), said[0]
    assert text.index(said[0]) > text.index("== step 2 ==")


def test_steps_in_only_one_tree_are_said_once(trees):
    """The CLI once printed the line on stdout and logged it as a warning on stderr."""
    r = subprocess.run([sys.executable, "-m", "accuracy.cli", "compare", "-m", str(trees[0]),
                        "-g", str(trees[1])], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count("steps in only one tree") == 1, r.stdout + r.stderr
    assert "steps in only one tree (not compared): [1]" in r.stdout
