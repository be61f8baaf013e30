"""Ops a device computes at a coarser precision on purpose are judged at that precision."""

import pytest

from accuracy import dumper
from accuracy.compare import compare
from accuracy.compare.precision import ComputePrecision
from accuracy.device_backend import sim
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.replay import replay


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("cp")
    gold, dev, rep = d / "gold.h5", d / "dev.h5", d / "replay.h5"
    with dumper(dump_path=gold):
        lm_step(tiny_lm(), lm_batch())
    fault = sim.fault("aten.gelu.default", module="encoder.layers.1", kind="replace",
                      value="gelu-tanh")
    with sim(profile="fp16-cube", faults=[fault]):
        with dumper(dump_path=dev):
            lm_step(tiny_lm(), lm_batch())
    replay(dev, rep)
    return dev, gold, rep


def test_fp16_cube_matmuls_pass_and_only_the_fault_is_an_error(runs):
    dev, gold, rep = runs
    report = compare(dev, gold, replay=rep)
    # One verdict per tensor: the GELU output is the one tensor judged an error; the rows that
    # read it inherit that verdict and the modules around it summarise it.
    judged = [r for r in report.rows if r["verdict"] == "error" and r["kind"] == "op"
              and not r["produced_by"]]
    assert [(r["op"], r["io"]) for r in judged] == [("aten.gelu.default", "output")]
    gelu = judged[0]["my_address"]
    assert all(r["produced_by"] == gelu or (r["kind"] == "module" and gelu in r["message"])
               for r in report.rows if r["verdict"] == "error" and r is not judged[0])
    assert report.summary["judged_counts"]["error"] == 1
    assert report.summary["culprit"]["op"] == "aten.gelu.default"
    mm = [r for r in report.rows if r["op"] == "aten.mm.default" and r["io"] == "output"
          and r["kind"] == "op"]
    assert mm and all(r["compute_precision"] == "float16" for r in mm)
    assert all(r["verdict"] in ("pass", "warning") for r in mm)
    # the replay measured these matmuls far less precise than fp32 kernels...
    assert min(r["local_error_ratio"] for r in mm) > 100


def test_without_compute_precision_every_fp16_matmul_is_an_error(runs):
    dev, gold, rep = runs
    # user rules come first: a catch-all fp32 rule overrides the sim profile's own
    report = compare(dev, gold, replay=rep, config={"compute_precision": {"*": "float32"}})
    mm_errors = [r for r in report.rows if r["op"] == "aten.mm.default" and r["io"] == "output"
                 and r["kind"] == "op" and r["verdict"] == "error"]
    assert len(mm_errors) > 5


def test_user_rules_and_bad_dtype():
    cp = ComputePrecision.from_sources({"compute_precision": {"aten.*mm*": "tf32"}}, {})
    assert cp.coarser("aten.addmm.default", "float32") == "tf32"
    assert cp.coarser("aten.addmm.default", "float16") is None  # tf32 is not coarser
    assert cp.coarser("aten.add.Tensor", "float32") is None
    assert ComputePrecision.ratio_scale("float16", "float32") == 2.0 ** 13
    with pytest.raises(ValueError, match="unknown dtype"):
        ComputePrecision.from_sources({"compute_precision": {"aten.mm": "fp16"}}, {})


def test_a_view_of_a_coarse_output_is_judged_at_the_same_precision(runs):
    """`_unsafe_view` of an fp16-computed matmul holds the same values: judged at fp16 too,
    not at fp32 thresholds that made the view an error where its matmul was not."""
    dev, gold, rep = runs
    report = compare(dev, gold, replay=rep)
    rows = [r for r in report.rows if r["kind"] == "op" and r["io"] == "output"]
    coarse = {r["seq_my"] for r in rows if r["op"] in ("aten.mm.default", "aten.addmm.default")
              and r["compute_precision"] == "float16"}
    views = [r for r in rows if r["op"] == "aten._unsafe_view.default"
             and r["seq_my"] - 1 in coarse]
    assert views and all(r["compute_precision"] == "float16" for r in views)
    assert not [r for r in views if r["verdict"] == "error" or r["accumulated_verdict"] == "error"]
