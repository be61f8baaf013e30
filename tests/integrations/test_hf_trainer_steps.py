"""The monitor under a `transformers` Trainer, numbers checked against the Trainer's own: with
gradient accumulation a step is an optimizer step whose loss is the one the Trainer logs, a
flagged step's capture re-runs all its micro-batches, a run resumed from a checkpoint goes on
numbering its steps in the same series, and `report_to="tensorboard"` shows the monitor."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

import accuracy.monitor as am  # noqa: E402
from accuracy.integrations import AccuracyTrainerCallback  # noqa: E402
from accuracy.monitor.capture import same_bits  # noqa: E402


def _model():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32)
    return transformers.Qwen2ForCausalLM(cfg)


def _data(n: int = 64):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": (ids := torch.randint(0, 64, (12,), generator=g)), "labels": ids}
            for _ in range(n)]


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2,
                logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                learning_rate=1e-3, lr_scheduler_type="constant", disable_tqdm=True, seed=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def _train(tmp_path, args, monitor, resume=None, data=None):
    trainer = transformers.Trainer(model=_model(), args=args, train_dataset=data or _data())
    cb = AccuracyTrainerCallback(monitor=monitor, trainer=trainer)
    trainer.add_callback(cb)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, cb


def _logged(trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_accumulated_steps_have_the_trainers_loss_and_a_capture_reruns_every_micro_batch(
        tmp_path):
    path = tmp_path / "ga.monitor.h5"
    trainer, cb = _train(tmp_path, _args(tmp_path, max_steps=8, gradient_accumulation_steps=2),
                         {"path": path, "snapshot_every": 3,
                          "triggers": [am.Predicate(lambda f: f.step == 4, "step-4")]})
    s = am.read_series(path)
    assert list(s.step) == list(range(8))
    assert s.micro_steps.tolist() == [2.0] * 8
    np.testing.assert_allclose(s.loss, _logged(trainer), rtol=1e-4)  # the Trainer rounds
    caps = cb.monitor.captures
    assert [c.step for c in caps] == [4] and caps[0].snapshot_step == 3
    assert caps[0].exact is True and same_bits(caps[0].rerun_loss, float(s.loss[4]))


def test_a_run_resumed_from_a_checkpoint_continues_its_series(tmp_path, caplog):
    path = tmp_path / "r.monitor.h5"
    args = _args(tmp_path, max_steps=12, save_strategy="steps", save_steps=5)
    whole, _ = _train(tmp_path / "whole", _args(tmp_path / "whole", max_steps=12),
                      {"path": tmp_path / "whole.monitor.h5"})
    _train(tmp_path, _args(tmp_path, max_steps=8, save_strategy="steps", save_steps=5),
           {"path": path})
    with caplog.at_level(logging.ERROR):
        _train(tmp_path, args, {"path": path}, resume=str(tmp_path / "out" / "checkpoint-5"))
    assert not [r for r in caplog.records if "monitor" in r.getMessage()]
    s = am.read_series(path)
    assert list(s.step) == list(range(12))  # 0-4 before the checkpoint, 5-11 resumed
    assert len(s.segments) == 1
    np.testing.assert_allclose(s.loss, am.read_series(tmp_path / "whole.monitor.h5").loss,
                               rtol=1e-5)


def test_report_to_tensorboard_shows_the_monitors_scalars_and_trigger_events(tmp_path,
                                                                             monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = tmp_path / "tb"
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(logs))
    _train(tmp_path, _args(tmp_path, max_steps=6, report_to=["tensorboard"]),
           {"path": tmp_path / "tb.monitor.h5", "snapshot_every": None,
            "triggers": [am.Predicate(lambda f: f.step == 3, "step-3")]})
    ea = EventAccumulator(str(logs))
    ea.Reload()
    tags = ea.Tags()
    assert "train/monitor/loss" in tags["scalars"] and "train/monitor/grad_norm" in tags["scalars"]
    s = am.read_series(tmp_path / "tb.monitor.h5")
    got = [e.value for e in ea.Scalars("train/monitor/loss")]
    np.testing.assert_allclose(got, s.loss, rtol=1e-6)
    # the Trainer's own step count: the monitor's step N is the Trainer's global step N + 1
    assert [e.step for e in ea.Scalars("train/monitor/loss")] == list(range(1, 7))
    assert any("monitor/trigger" in t for t in tags["tensors"])
