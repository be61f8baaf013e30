import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("ACCURACY_SLOW"):
        skip = pytest.mark.skip(reason="long soak/fuzz run: set ACCURACY_SLOW=1")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="no CUDA device on this machine")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
