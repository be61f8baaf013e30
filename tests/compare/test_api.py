"""accuracy compare: alignment, bad input, verdicts, culprit, report files, CLI (issue 5)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from accuracy.cli import main
from accuracy.compare import compare, load_report
from accuracy.dumper.core import dumper
from accuracy.dumpfile import DumpError, load_dump
from accuracy.examples import lm_batch, lm_step, tiny_lm
from tests._support.lm_dumps import faulty_lm_pair


class Block(nn.Module):
    """Linear + relu, written out so a test can fuse, insert or remove an op."""

    def __init__(self, fused: bool = False, extra: bool = False) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16) / 4)
        self.b = nn.Parameter(torch.randn(16) / 4)
        self.fused, self.extra = fused, extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            h = torch.addmm(self.b, x, self.w.t())
        else:
            h = torch.mm(x, self.w.t()) + self.b
        if self.extra:
            h = h * 1.0
        return torch.relu(h)


class Net(nn.Module):
    def __init__(self, mid: Block | None = None, name: str = "blk1") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blk0 = Block()
        setattr(self, name, mid or Block())
        self.blk2 = Block()
        self.mid = name
        torch.manual_seed(0)  # same weights whatever the variant
        for blk in (self.blk0, getattr(self, name), self.blk2):
            with torch.no_grad():
                blk.w.copy_(torch.randn(16, 16) / 4)
                blk.b.copy_(torch.randn(16) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blk2(getattr(self, self.mid)(self.blk0(x)))


def dump_net(path, net: Net, *, batch: int = 4, dtype=torch.float32, mode: str = "tensor"):
    x = torch.randn(batch, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    net = net.to(dtype)
    with torch.no_grad(), dumper(str(path), mode=mode):
        net(x)
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmp")
    return {
        "base": dump_net(d / "base.h5", Net()),
        "extra": dump_net(d / "extra.h5", Net(Block(extra=True))),
        "fused": dump_net(d / "fused.h5", Net(Block(fused=True))),
        "renamed": dump_net(d / "renamed.h5", Net(name="other")),
        "bf16": dump_net(d / "bf16.h5", Net(), dtype=torch.bfloat16),
        "batch3": dump_net(d / "batch3.h5", Net(), batch=3),
        "stats": dump_net(d / "stats.h5", Net(), mode="statistics"),
        "stats_extra": dump_net(d / "stats_extra.h5", Net(Block(extra=True)),
                                mode="statistics"),
        "dir": d,
    }


@pytest.fixture(scope="module")
def lm_dumps(tmp_path_factory):
    """Tiny transformer: golden on CPU fp32, device on sim fp16-cube with a layer-norm fault."""
    return faulty_lm_pair(tmp_path_factory.mktemp("lm"))


def op_rows(rep, verdict=None):
    return [r for r in rep.rows if r["kind"] == "op" and (verdict is None or r["verdict"] ==
                                                           verdict)]


def test_self_compare_passes(dumps):
    with load_dump(dumps["base"]) as opened:  # a Dump works as well as a path
        rep = compare(opened, dumps["base"])
    c = rep.summary["counts"]
    assert c["pass"] == len(rep.rows) > 0
    assert all(r["bit_exact"] for r in rep.rows if r["bit_exact"] is not None)
    assert rep.summary["culprit"] is None and rep.summary["first_divergence"] is None
    assert rep.exit_code("warning") == 0


@pytest.mark.parametrize("my,golden", [("extra", "base"), ("base", "extra")])
def test_inserted_or_removed_op_does_not_shift(dumps, my, golden):
    rep = compare(dumps[my], dumps[golden])
    unmatched = [r for r in op_rows(rep) if r["verdict"] == "unmatched"]
    assert unmatched and {r["op"] for r in unmatched} == {"aten.mul.Tensor"}
    assert all(r["module"].endswith("blk1") for r in unmatched)
    later = [r for r in op_rows(rep) if r["module"].endswith("blk2")]
    assert later and all(r["verdict"] == "pass" for r in later)
    assert rep.summary["counts"]["error"] == 0
    side = "only in my run" if my == "extra" else "only in golden run"
    assert all(side in r["message"] for r in unmatched)


def test_fused_op_compares_at_module_boundary(dumps):
    rep = compare(dumps["fused"], dumps["base"])
    unmatched = {r["op"] for r in op_rows(rep, "unmatched")}
    assert "aten.addmm.default" in unmatched
    mods = [r for r in rep.rows if r["kind"] == "module" and r["module"].endswith("blk1")]
    assert mods and all(r["verdict"] == "pass" for r in mods)
    assert all(r["verdict"] == "pass" for r in op_rows(rep) if r["module"].endswith("blk2"))
    assert rep.summary["counts"]["error"] == 0


def test_mapping_pairs_renamed_modules(dumps, tmp_path):
    plain = compare(dumps["renamed"], dumps["base"])
    assert any(r["kind"] == "module" and r["verdict"] == "unmatched" for r in plain.rows)
    mp = tmp_path / "map.json"
    mp.write_text(json.dumps({"modules": {"Net.other": "Net.blk1"}}))
    rep = compare(dumps["renamed"], dumps["base"], mapping=mp)
    assert rep.summary["counts"]["unmatched"] == 0
    assert rep.summary["counts"]["pass"] == len(rep.rows)
    with pytest.raises(ValueError, match="unknown sections"):
        compare(dumps["base"], dumps["base"], mapping={"opz": {}})


def test_mismatched_dtypes_and_shapes_reported_per_row(dumps):
    rep = compare(dumps["bf16"], dumps["base"])
    rows = [r for r in op_rows(rep) if r["dtype_my"] == "bfloat16"]
    assert rows and all("dtype differs" in r["message"] for r in rows)
    assert all(r["cosine"] is not None for r in rows if r["dtype_golden"] == "float32")
    rep = compare(dumps["batch3"], dumps["base"])
    shaped = [r for r in rep.rows if "shape differs" in r["message"]]
    # element counts differ: not the same computation, so nothing to judge a kernel by
    assert shaped and all(r["verdict"] == "unmatched" for r in shaped)


def test_different_models_and_empty_dumps(dumps, lm_dumps, tmp_path):
    from accuracy.errors import NotComparableError

    with pytest.raises(NotComparableError, match="record different models"):
        compare(lm_dumps[1], dumps["base"])  # more in tests/compare/test_checks.py
    empty = tmp_path / "empty.h5"
    with dumper(str(empty)):
        pass
    rep = compare(empty, empty)
    assert rep.rows == [] and rep.summary["culprit"] is None
    rep.write(tmp_path / "r")
    rep = compare(empty, dumps["base"])
    assert rep.summary["counts"]["unmatched"] == len(rep.rows) > 0


def test_statistics_dumps_compare_on_statistics(dumps):
    rep = compare(dumps["stats_extra"], dumps["stats"])
    assert all("statistics only" in r["message"] for r in op_rows(rep, "pass"))
    assert rep.summary["counts"]["error"] == 0
    rep = compare(dumps["stats"], dumps["base"])  # one side without data
    assert rep.summary["counts"]["pass"] > 0


def test_corrupt_file_gives_clear_error(dumps, tmp_path, capsys):
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not a dump at all" * 10)
    with pytest.raises(DumpError, match="bad.h5"):
        compare(bad, dumps["base"])
    assert main(["compare", "-m", str(bad), "-g", str(dumps["base"])]) == 2
    assert "bad.h5" in capsys.readouterr().err


def test_fail_on_exit_codes(dumps, lm_dumps, tmp_path, capsys):
    base = str(dumps["base"])
    assert main(["compare", "-m", base, "-g", base, "--fail-on", "warning"]) == 0
    dev, gold = map(str, lm_dumps)
    assert main(["compare", "-m", dev, "-g", gold]) == 0
    assert main(["compare", "-m", dev, "-g", gold, "--fail-on", "error"]) == 1
    cfg = tmp_path / "lenient.toml"
    cfg.write_text("[float32]\ncosine_error = -2.0\nrel_euc_error = 1e9\n"
                   "[float16]\ncosine_error = -2.0\nrel_euc_error = 1e9\n"
                   "[integer]\nmax_abs_error = 1e9\n")
    args = ["compare", "-m", dev, "-g", gold, "--config", str(cfg), "--fail-on"]
    assert main(args + ["error"]) == 0
    assert main(args + ["warning"]) == 1
    out = capsys.readouterr().out
    assert "culprit" in out and "top suspects" in out


def test_culprit_for_injected_sim_fault(lm_dumps, tmp_path):
    dev, gold = lm_dumps
    rep = compare(dev, gold)
    c = rep.summary["culprit"]
    assert c is not None, rep.summary["counts"]
    assert c["op"] == "aten.native_layer_norm.default" and c["phase"] == "forward"
    assert c["module"].endswith("encoder.layers.1.norm1")
    assert c["source"] and c["verdict"] == "error"
    assert rep.suspects[0]["index"] == c["index"]
    # every op before the culprit is within the error threshold
    assert all(r["verdict"] != "error" for r in rep.rows if r["index"] < c["index"])


def test_report_files_html_chart_and_table(lm_dumps, tmp_path):
    rep = compare(*lm_dumps, algorithms="all")
    paths = rep.write(tmp_path / "rep")
    assert {"json", "csv", "html"} <= set(paths)
    page = paths["html"].read_text()
    assert '<svg id="chart"' in page and '<table id="rows"' in page and "culprit" in page
    assert "<script src" not in page and "cdn" not in page.lower()
    header = paths["csv"].read_text().splitlines()[0]
    for col in ("NPU Name", "Bench Name", "Cosine", "MaxAbsErr", "One Thousandth Err Ratio",
                "Result", "Err_message"):
        assert col in header
    back = load_report(tmp_path / "rep")
    assert back["summary"]["counts"] == rep.summary["counts"]
    assert back["summary"]["culprit"]["index"] == rep.summary["culprit"]["index"]
    row = back["rows"][0]
    for key in ("index", "my_address", "golden_address", "op", "phase", "module", "source",
                "dtype_my", "dtype_golden", "shape_my", "shape_golden", "cosine", "kl_div",
                "local_error_ratio", "verdict", "message"):
        assert key in row
    if "xlsx" in paths:
        assert paths["xlsx"].stat().st_size > 0


def test_parallel_jobs_give_same_rows(lm_dumps, monkeypatch):
    import accuracy.compare.batches as batches

    monkeypatch.setattr(batches, "BATCH_BYTES", 1 << 20)  # several batches on a small dump
    one = compare(*lm_dumps)
    two = compare(*lm_dumps, jobs=2)
    assert [r["verdict"] for r in one.rows] == [r["verdict"] for r in two.rows]
    assert [r["cosine"] for r in one.rows] == [r["cosine"] for r in two.rows]


def test_compare_command_uses_every_usable_core_unless_told(monkeypatch, capsys):
    """`accuracy compare` runs one worker per core by default, at most OMP_NUM_THREADS: a
    user who limits a job to one thread gets one process."""
    from accuracy.cli import build_parser
    from accuracy.cliargs import usable_cores

    def jobs(*extra: str) -> int:
        argv = ["compare", "-m", "a.h5", "-g", "b.h5", *extra]
        return build_parser(argv).parse_args(argv).jobs

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert usable_cores() == 4 and jobs() == 4 and jobs("-j", "auto") == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert jobs() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # more threads than cores: the cores
    assert jobs() == 4 and jobs("-j", "3") == 3
    with pytest.raises(SystemExit):
        jobs("-j", "0")
    with pytest.raises(SystemExit):
        jobs("-j", "many")
    assert "'many' is neither a whole number nor 'auto'" in capsys.readouterr().err


def _divide_near_zero(path, shift: float) -> None:
    with dumper(str(path)):
        d = torch.linspace(-1, 1, 1000) + shift  # entries down to 0.001
        y = torch.ones(1000) * 2.0 / d
        (y * y).sum()


def test_a_division_amplifying_its_divisors_deviation_is_no_culprit_without_replay(tmp_path):
    """1/d turns a 1e-4 shift of d into a 10% change where d is 0.001: an exact kernel
    amplifies 500x. Without a replay that is at most a warning that says compare -r judges
    the kernel (Adam's update divides the same way: a clean bf16 GPT-2 named it the culprit)."""
    _divide_near_zero(tmp_path / "g.h5", 0.0)
    _divide_near_zero(tmp_path / "d.h5", 1e-4)
    rep = compare(tmp_path / "d.h5", tmp_path / "g.h5")
    div = next(r for r in op_rows(rep) if r.op == "aten.div.Tensor" and r.io == "output")
    assert div.amplification > 100 and div.accumulated_verdict == "error"
    assert div.verdict == "warning" and "compare -r judges its own error" in div.message
    assert rep.summary["culprit"] is None and rep.summary["counts"]["error"] == 0


def _shard_of_flat_buffer(path, scale: float) -> None:
    """FSDP2's reduce-scatter pattern: gradients packed in one flat buffer, each cut out again
    with as_strided; `scale` != 1 makes the small one wrong where it is made."""
    with dumper(str(path)):
        grads = [torch.ones(10_000) * 3.0] + [torch.linspace(1, 2, 100) * (k + 1)
                                              for k in range(4)]
        grads[-1] = grads[-1] * scale
        flat = torch.cat(grads)
        for k in range(5):
            start = 10_000 + 100 * (k - 1) if k else 0
            shard = torch.as_strided(flat, grads[k].shape, (1,), start)
            (shard * shard).sum()


def test_a_view_of_part_of_its_input_is_no_culprit_without_replay(tmp_path):
    """The wrong shard holds all of the buffer's deviation in 1% of its elements: 5x the
    buffer's relative deviation, from a view that computes nothing. The op that made it wrong
    is the culprit (a faulty FSDP2 GPT-2 gradient named as_strided before)."""
    _shard_of_flat_buffer(tmp_path / "g.h5", 1.0)
    _shard_of_flat_buffer(tmp_path / "d.h5", 1.1)
    rep = compare(tmp_path / "d.h5", tmp_path / "g.h5")
    view = max((r for r in op_rows(rep) if r.op == "aten.as_strided.default"
                and r.io == "output"), key=lambda r: r.amplification or 0)
    assert view.amplification > 3 and view.accumulated_verdict == "error"
    assert view.verdict == "warning" and "takes part of its input" in view.message
    assert rep.summary["culprit"]["op"] == "aten.mul.Tensor"


def test_suspects_rank_an_honest_divisions_amplification_after_other_warnings():
    """Without a replay, Adam's 130x on a clean parameter (a division of noise by noise) comes
    after a GEMM's 8.6x, which a fault made; a replay's local excess ranks by score alone."""
    from accuracy.compare.report import analyse
    from accuracy.compare.row import Row
    from accuracy.compare.row import Verdict as V
    from accuracy.compare.verdict import load_config

    def out(i: int, op: str, amplification: float, local: float | None = None) -> Row:
        return Row(index=i, kind="op", op=op, io="output", seq_my=i, seq_golden=i,
                   verdict=V.WARNING, accumulated_verdict=V.WARNING,
                   amplification=amplification, local_excess=local)

    rows = [out(0, "aten.addcdiv_.default", 130.0), out(1, "aten.addmm.default", 8.6),
            out(2, "aten.threshold_backward.default", 50.0), out(3, "aten.mul.Tensor", 5.0)]
    s = analyse(rows, load_config(), {})
    assert [x["op"] for x in s["suspects"]] == [
        "aten.addmm.default", "aten.mul.Tensor", "aten.addcdiv_.default",
        "aten.threshold_backward.default"]
    replayed = [out(0, "aten.addcdiv_.default", 130.0, local=40.0),
                out(1, "aten.addmm.default", 8.6, local=3.0)]
    s = analyse(replayed, load_config(), {})
    assert [x["op"] for x in s["suspects"]] == ["aten.addcdiv_.default", "aten.addmm.default"]


def test_compare_of_two_ranks_files_is_refused_unless_any_rank(tmp_path, monkeypatch, capsys):
    """Rank 0's file against rank 1's compares two data shards: refused before any metric,
    naming both ranks and the way to compare every rank; --any-rank compares them anyway."""
    import importlib

    core = importlib.import_module("accuracy.dumper.core")
    for name, rank in (("r0.h5", 0), ("r1.h5", 1)):
        monkeypatch.setattr(core, "current_rank", lambda rank=rank: (rank, 2))
        dump_net(tmp_path / name, Net())
    argv = ["compare", "-m", str(tmp_path / "r0.h5"), "-g", str(tmp_path / "r1.h5"), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "r0.h5 is rank 0 (of 2) but" in err and "r1.h5 is rank 1 (of 2)" in err
    assert "-m 'dev/run_{rank}.h5'" in err
    assert main([*argv, "--any-rank"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_rows_json_spells_non_finite_figures_as_strings(lm_dumps, tmp_path):
    """rows.json stays strict JSON when a figure is NaN or infinite (Python's NaN token
    breaks every other JSON reader); finite figures are written as numbers."""
    rep = compare(*lm_dumps)
    rep.rows[0].cosine = float("nan")
    rep.rows[0].max_rel_err = float("inf")
    rep.rows[1].max_rel_err = -float("inf")
    rep.write(tmp_path / "rep", ("json",))

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} in rows.json")

    rows = json.loads((tmp_path / "rep" / "rows.json").read_text(), parse_constant=refuse)
    assert (rows[0]["cosine"], rows[0]["max_rel_err"], rows[1]["max_rel_err"]) == (
        "nan", "inf", "-inf")
    assert rows[2]["cosine"] == rep.rows[2].cosine
    assert [r["index"] for r in rows] == [r.index for r in rep.rows]


def test_replay_local_error_drives_verdict(tmp_path):
    device_backend = pytest.importorskip("accuracy.device_backend")
    replay_mod = pytest.importorskip("accuracy.replay")
    sim = device_backend.sim
    dump_net(tmp_path / "g.h5", Net())
    fault = sim.fault("aten.relu.default", module="blk1", kind="bias", value=0.5)
    with sim(profile="fp16-cube", faults=[fault]):
        dump_net(tmp_path / "d.h5", Net())
    replay_mod.replay(tmp_path / "d.h5", tmp_path / "r.h5")
    rep = compare(tmp_path / "d.h5", tmp_path / "g.h5", replay=tmp_path / "r.h5")
    outs = [r for r in op_rows(rep) if r["io"] == "output" and r["local_error_ratio"] is not None]
    assert outs
    c = rep.summary["culprit"]
    assert c["op"] == "aten.relu.default" and c["module"].endswith("blk1")
    assert c["local_verdict"] == "error"


def test_empty_dumps_fail_a_pipeline_and_reports_are_not_overwritten(tmp_path, capsys):
    empty = tmp_path / "empty.h5"
    with dumper(str(empty)):
        pass
    out = tmp_path / "rep"
    assert main(["compare", "-m", str(empty), "-g", str(empty), "-o", str(out),
                 "--fail-on", "error"]) == 1
    assert "nothing was compared" in capsys.readouterr().out
    assert main(["compare", "-m", str(empty), "-g", str(empty), "-o", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["compare", "-m", str(empty), "-g", str(empty), "-o", str(out),
                 "--overwrite"]) == 0


def test_a_run_mostly_without_golden_counterpart_does_not_pass_a_pipeline(tmp_path, capsys):
    """A whole LM step against a golden dump of one encoder layer: most tensors of my run
    were never compared, which is said first, and a pipeline fails (another model's dump,
    once read 'rows 1391: pass 6 -> PASS', is refused: tests/compare/test_checks.py)."""
    batch = lm_batch()
    with dumper(str(tmp_path / "lm.h5")):
        lm_step(tiny_lm(), batch)
    with dumper(str(tmp_path / "layer.h5"), modules="encoder.layers.0.*"):
        lm_step(tiny_lm(), batch)
    same = compare(tmp_path / "lm.h5", tmp_path / "lm.h5")
    assert same.exit_code("error") == 0 and not same.summary.get("blind")
    assert main(["compare", "-m", str(tmp_path / "lm.h5"), "-g", str(tmp_path / "layer.h5"),
                 "--fail-on", "error"]) == 1
    text = capsys.readouterr().out
    blind = next(line for line in text.splitlines() if "BLIND" in line)
    assert "tensors of my run have no golden counterpart" in blind
    assert "over what was recorded only" in text and "of my run not compared" in text
    assert text.index("BLIND") < text.index("rows ")


def test_compiled_kernels_left_unpaired_are_said_first():
    """Per-block `block.compile()` named every kernel of a Llama without its layer index: 0 of
    52 kernel outputs paired, while the eager rows around them did, and compare said a bare
    PASS. Whatever pairs the eager rows, the compiled code itself must have been compared."""
    from accuracy.compare.report import Report, analyse
    from accuracy.compare.row import Row
    from accuracy.compare.terminal import format_summary

    def row(i: int, op: str, paired: bool) -> Row:
        return Row(index=i, kind="op", op=op, seq_my=i, io="output", my_address=f"/{op}/{i}",
                   golden_address=f"/{op}/{i}" if paired else None,
                   verdict="pass" if paired else "unmatched", accumulated_verdict="pass")

    eager = [row(i, "aten.detach.default", True) for i in range(40)]
    meta = {"my": "m", "golden": "g", "bytes_compared": 0, "seconds": 0.0}
    for paired, blind in ((3, True), (8, False)):
        kernels = [row(100 + i, "inductor.cpp_fused_gelu_0", i < paired) for i in range(10)]
        s = analyse(eager + kernels, {}, meta)
        rep = Report(eager + kernels, s)
        assert rep.exit_code("error") == (1 if blind else 0), s.get("coverage")
        text = format_summary(s)
        assert ("7 of 10 outputs of compiled kernels have no eager counterpart" in text) == blind
        if blind:
            assert "7 of 10 compiled kernel outputs not compared" in text
            assert text.index("BLIND") < text.index("rows ")


def test_terminal_names_the_first_divergence_when_it_is_not_the_culprit():
    """The README's promise: the terminal shows where the run starts to differ as well as
    the op that broke it, when those are two ops."""
    from accuracy.compare.terminal import format_summary

    def row(seq: int, op: str) -> dict:
        return {"seq_my": seq, "op": op, "phase": "forward", "module": "Net.fc", "source": "m.py:3",
                "my_address": f"/{op}/{seq}/output/0", "golden_address": f"/{op}/{seq}/output/0",
                "verdict": "error", "message": "x"}

    s = {"my": "a.h5", "golden": "b.h5", "rows": 2, "counts": {"pass": 0, "error": 2},
         "verdict": "error", "bytes_compared": 0, "seconds": 0.1,
         "culprit": row(7, "aten.mm.default"), "first_divergence": row(3, "aten.add.Tensor")}
    text = format_summary(s)
    assert "first divergence (where the run starts to differ, whoever caused it): seq 3 " \
           "aten.add.Tensor" in text
    s["first_divergence"] = s["culprit"]
    assert "first divergence" not in format_summary(s)


def test_a_destination_filled_without_being_read_is_skipped_for_that_reason(tmp_path):
    """T5's _shift_right: slices of a new_zeros tensor are copy_/fill_ destinations. What they
    held is not used (not compared), and the row says so, not 'uninitialised memory'."""
    def step(path):
        ids = torch.arange(1, 13).reshape(2, 6)
        with dumper(path):
            shifted = ids.new_zeros(ids.shape)
            shifted[..., 1:] = ids[..., :-1].clone()
            shifted[..., 0] = 0
        return path

    rep = compare(step(tmp_path / "m.h5"), step(tmp_path / "g.h5"))
    dest = [r for r in rep.rows if r["op"] in ("aten.copy_.default", "aten.fill_.Tensor")
            and r["io"] == "input" and r["tensor_index"] == 0]
    assert len(dest) == 2
    for r in dest:
        assert r["verdict"] == "skipped" and "overwritten by this op" in r["message"]
        assert "uninitialised" not in r["message"]
