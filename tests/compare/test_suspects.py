"""accuracy suspects: which ops a selection names around a suspect (no dumps needed)."""

import json

from accuracy.compare.suspects import select_suspects


def _op(seq, op, module, phase):
    return {"kind": "op", "seq_my": seq, "seq_golden": seq, "op": op, "module": module,
            "phase": phase}


def _end(seq, op, module, phase):
    return {**_op(seq, op, module, phase), "kind": "module"}


def test_module_end_is_the_end_of_the_call_the_suspect_runs_in(tmp_path):
    # block.norm runs twice in forward (seq 3-4, 7-8); its parameters are updated by the
    # optimizer at 12, a module row of the same module in another phase.
    rows = [_op(s, f"aten.op{s}", "net.block.norm" if s in (3, 4, 7, 8) else "net.block",
                "forward") for s in range(1, 10)]
    rows += [_op(s, "aten.mm", "net.block", "backward") for s in (10, 11)]
    rows += [_op(12, "aten.addcdiv_", "net.block.norm", "optimizer")]
    rows += [_end(4, "aten.op4", "net.block.norm", "forward"),
             _end(8, "aten.op8", "net.block.norm", "forward"),
             _end(9, "aten.op9", "net.block", "forward"),
             _end(11, "aten.mm", "net.block", "backward"),
             _end(12, "aten.addcdiv_", "net.block.norm", "optimizer")]
    summary = {"suspects": [{"seq_my": 3, "seq_golden": 3}], "culprit": None,
               "first_divergence": None, "my": "m.h5", "golden": "g.h5"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    sel = select_suspects(tmp_path, before=1, after=0)
    assert [(x["seq"], x["why"]) for x in sel["my"]] == [
        (2, "around suspect 1"), (3, "around suspect 1"),
        (4, "end of module net.block.norm"), (9, "end of module net.block")]
    assert [x["seq"] for x in sel["golden"]] == [2, 3, 4, 9]
