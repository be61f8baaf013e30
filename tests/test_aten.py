"""accuracy.aten: the one registry of op knowledge the dumper, replay, compare and overflow read."""

from __future__ import annotations

import pytest
import torch

from accuracy import aten, load_dump
from accuracy.dumper.core import dumper

ops = torch.ops.aten


def test_plans_answer_what_the_dump_loop_asks():
    mm, add_, view = aten.plan_of(ops.mm.default), aten.plan_of(ops.add_.Tensor), aten.plan_of(
        ops.view.default)
    assert (mm.name, mm.mutable, mm.view, mm.rng, mm.collective) == (
        "aten.mm.default", False, False, False, None)
    assert add_.mutable and add_.writes == ((0, "self", False),)
    assert view.view and view.same_elements and view.same_bytes
    assert aten.plan_of(ops.t.default).same_elements and not aten.plan_of(ops.t.default).same_bytes
    assert aten.plan_of(ops.empty_like.default).uninitialised
    assert aten.plan_of(ops.bernoulli.p).rng
    assert aten.plan_of(ops._amp_update_scale_.default).amp
    assert aten.plan_of(ops.mm.default) is mm  # computed once per overload


def test_written_ids_names_in_place_and_out_arguments():
    a, b, out = torch.ones(2), torch.ones(2), torch.empty(2)
    assert aten.written_ids(ops.add_.Tensor, (a, b), {}) == {id(a)}
    assert aten.written_ids(ops.add.out, (a, b), {"out": out}) == {id(out)}
    assert aten.written_ids(ops.add.Tensor, (a, b), {}) == set()


def test_resolve_op_and_collective_names():
    assert aten.resolve_op("aten.mm.default") is ops.mm.default
    assert aten.resolve_op("aten.no_such_op.default") is None
    assert aten.resolve_op("mm") is None
    assert aten.is_collective("c10d.allreduce_.default")
    assert aten.is_collective("_c10d_functional.wait_tensor.default")
    assert not aten.is_collective("aten.add.Tensor")
    assert aten.amp_label(aten.AMP_UPDATE_OP) == aten.AMP_UPDATE
    assert aten.amp_label("aten.add.Tensor") == ""


def test_register_rejects_unknown_facts():
    with pytest.raises(ValueError, match="unknown op fact"):
        aten.register("aten.mm.default", fast=True)


@pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")
def test_an_uninitialised_factory_is_no_overflow_birth(tmp_path):
    """Whatever an empty* op's memory held is not inf/nan born there. `register` makes `full`
    an 'uninitialised factory' here so its NaN is deterministic; unregistered, it is a birth."""
    def step():
        return torch.full((4,), float("nan")) + 1

    with dumper(tmp_path / "plain.h5", check_overflow=True, overflow_nums=-1):
        step()
    aten.register("aten.full.default", uninitialised=True)
    try:
        assert aten.plan_of(ops.full.default).uninitialised
        with dumper(tmp_path / "uninit.h5", check_overflow=True, overflow_nums=-1):
            step()
    finally:
        aten.register("aten.full.default", uninitialised=False)
    assert not aten.plan_of(ops.full.default).uninitialised
    with load_dump(tmp_path / "plain.h5") as d:
        assert [r.op for r in d.records] == ["aten.full.default"]
    with load_dump(tmp_path / "uninit.h5") as d:
        # the add inherits the NaN: not born there either
        assert [r.op for r in d.records] == []


def test_partly_filled_outputs_are_a_registry_fact_users_extend():
    assert aten.PARTLY_FILLED_OUTPUTS["fsdp.all_gather_copy_in.default"] == (1,)
    aten.register("mylib.pack.default", partly_filled=(0, 2))
    try:
        assert aten.PARTLY_FILLED_OUTPUTS["mylib.pack.default"] == (0, 2)
    finally:
        aten.register("mylib.pack.default", partly_filled=())
    assert "mylib.pack.default" not in aten.PARTLY_FILLED_OUTPUTS

