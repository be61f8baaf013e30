"""No false alarm on a clean run, whatever mix of autocast dtype and device precision, and a
5% fault on one call named in every cell (issue 50): autocast {none, fp16 + GradScaler, bf16}
x `sim` profile {bf16, fp16-cube, fp8} x {a depthwise-separable CNN with GroupNorm and SiLU, a
random-init `transformers` Llama, a GRU}, each one AdamW step dumped on CPU and on `sim`,
replayed and compared (tests/_support/amp_matrix.py).

`make test` runs FAST: three cells covering every autocast dtype, every profile and every
model once, the issue's own cell (fp16 autocast on a bf16 device, the CNN) among them; the full
27 cells run with ACCURACY_SLOW=1 (11.6 minutes on the 2-core machine at load 13; the
fast three: 2.4 minutes there, 33 s of CPU)."""

from __future__ import annotations

import itertools

import pytest

from tests._support.amp_matrix import AUTOCASTS, MODELS, PROFILES, run_cell

FAST = [("cnn", "fp16", "bf16"), ("llama", "bf16", "fp8"), ("rnn", "none", "fp16-cube")]
FULL = [c for c in itertools.product(MODELS, AUTOCASTS, PROFILES) if c not in FAST]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("amp")  # goldens shared by a model's cells


def _check(model: str, autocast: str, profile: str, work) -> None:
    clean = run_cell(model, autocast, profile, False, work)
    assert clean.errors == 0, (clean.culprit, clean.suspects)
    assert clean.culprit is None
    faulty = run_cell(model, autocast, profile, True, work)
    op, module = MODELS[model].fault
    assert faulty.culprit is not None, faulty.suspects
    assert faulty.culprit[0].startswith(op + ".") and faulty.culprit[1].endswith("." + module), \
        (faulty.culprit, faulty.suspects)


@pytest.mark.parametrize("model,autocast,profile", FAST, ids=["-".join(c) for c in FAST])
def test_clean_runs_pass_and_the_fault_is_named(model, autocast, profile, work):
    pytest.importorskip("transformers")
    _check(model, autocast, profile, work)


@pytest.mark.slow
@pytest.mark.parametrize("model,autocast,profile", FULL, ids=["-".join(c) for c in FULL])
def test_every_cell_of_the_matrix(model, autocast, profile, work):
    pytest.importorskip("transformers")
    _check(model, autocast, profile, work)
