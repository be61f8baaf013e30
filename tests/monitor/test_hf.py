"""The monitor through a `transformers` Trainer: one added callback, a device fault at one step
captured by re-running it from a snapshot, bit for bit, with the faulted op named."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

import accuracy.monitor as am  # noqa: E402
from accuracy.device_backend import sim  # noqa: E402
from accuracy.integrations import AccuracyTrainerCallback  # noqa: E402
from accuracy.monitor.capture import same_bits  # noqa: E402


def test_trainer_callback_captures_the_faulted_step(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)  # dropout 0.1: the snapshot keeps the RNG
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": (ids := torch.randint(0, 64, (8,), generator=g)), "labels": ids}
            for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=12, per_device_train_batch_size=2,
        logging_steps=1000, save_strategy="no", report_to=[], use_cpu=True, learning_rate=1e-3,
        disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    path = tmp_path / "hf.monitor.h5"
    cb = AccuracyTrainerCallback(monitor={"path": path, "snapshot_every": 4}, trainer=trainer)
    trainer.add_callback(cb)  # the added call
    # lm_head's mm runs 3 times a step (forward, two in backward): call 27 is step 9's forward
    fault = sim.fault("aten.mm.default", module="lm_head", kind="bias", value=20.0,
                      start=27, stop=28)
    with sim(faults=[fault]):
        trainer.train()
    s = am.read_series(path)
    assert list(s.step) == list(range(12))
    assert int(s.loss.argmax()) == 9
    caps = cb.monitor.captures
    assert [c.step for c in caps] == [9] and caps[0].snapshot_step == 8
    assert caps[0].exact is True and same_bits(caps[0].rerun_loss, float(s.loss[9]))
    assert caps[0].culprit["op"] == "aten.mm.default"
    assert caps[0].culprit["module"].endswith("lm_head")



def test_the_old_import_path_says_what_to_write_instead():
    with pytest.raises(ImportError, match="AccuracyTrainerCallback\\(monitor="):
        import accuracy.monitor.hf  # noqa: F401
