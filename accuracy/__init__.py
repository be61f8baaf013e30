"""accuracy: find which op broke the numbers when a PyTorch model moves to another backend."""

__version__ = "0.1.0"

from accuracy.dumper import dumper  # noqa: E402
from accuracy.dumpfile import Dump, DumpError, load_dump  # noqa: E402

__all__ = ["dumper", "load_dump", "Dump", "DumpError", "__version__"]

_LIVE = {"live_check", "substitute"}  # accuracy.live, imported on first use


def __getattr__(name: str):
    if name in _LIVE:
        from accuracy import live
        return getattr(live, name)
    raise AttributeError(f"module 'accuracy' has no attribute {name!r}")
