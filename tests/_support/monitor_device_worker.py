"""Run the monitor on the npu test device in a fresh process (the device must be registered
before the process's first backward) and print, as JSON, the host reads of three monitored
steps and the last row's figures; `unavailable` where the device cannot be built here.

    python -m tests._support.monitor_device_worker FOLDER
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import accuracy.testdevice as td
    from accuracy.errors import ExtensionUnavailableError

    try:
        td.load()
    except ExtensionUnavailableError as e:
        print(json.dumps({"unavailable": str(e)}))
        return
    import torch
    from torch import nn

    import accuracy.monitor as am

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).to("npu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16).to("npu"), torch.randn(8, 4).to("npu")
    path = Path(sys.argv[1]) / "npu.monitor.h5"
    mon = am.Monitor(model, opt, path=path, snapshot_every=None, triggers=None)

    def step() -> None:
        mon.begin_step()
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        mon.end_step()

    for _ in range(2):
        step()
    with td.counting() as c:
        for _ in range(3):
            step()
    mon.close()
    s = am.read_series(path)
    print(json.dumps({"d2h_copies": c["d2h_copies"], "steps": 3,
                      "act_norm": s.module["act_norm"][-1].tolist(),
                      "grad_norm": float(s.grad_norm[-1])}))


if __name__ == "__main__":
    main()
