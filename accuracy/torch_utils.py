"""`import accuracy.torch_utils`: Ascend's spelling, `torch.utils.dumper(...)`, runs as written.

The Ascend training guide's snippets call `torch.utils.dumper(use_dump=True, ...)`. This
import (one line, at the top of the training script) sets `torch.utils.dumper` to
`accuracy.dumper`, so those snippets run unchanged. Nothing else touches torch: `import
accuracy` does not set it, so no one who did not ask gets an attribute added to torch.
"""

from __future__ import annotations

import logging

import torch.utils

from accuracy.dumper import dumper

log = logging.getLogger(__name__)


def register() -> None:
    """Set `torch.utils.dumper` to `accuracy.dumper` (done once, on import)."""
    current = getattr(torch.utils, "dumper", None)
    if current is not None and current is not dumper:  # e.g. a vendor fork's own dumper
        log.warning("torch.utils.dumper (%r) replaced by accuracy.dumper, as "
                    "`import accuracy.torch_utils` asks", current)
    torch.utils.dumper = dumper  # type: ignore[attr-defined]


register()
