"""accuracy: find which op broke the numbers when a PyTorch model moves to another backend."""

__version__ = "0.1.0"

from accuracy.dumper import dumper  # noqa: E402
from accuracy.dumpfile import Dump, DumpError, load_dump  # noqa: E402

__all__ = ["dumper", "load_dump", "Dump", "DumpError", "__version__"]
