"""accuracy: find which op broke the numbers when a PyTorch model moves to another backend.

Names load on first use, so `import accuracy` and `accuracy --help` stay fast and import no
torch; `from accuracy import dumper` imports the dumper (and torch) at that point.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from accuracy._lazy import lazy_getattr

__version__ = "0.1.0"

if TYPE_CHECKING:
    from accuracy.debugger import PrecisionDebugger
    from accuracy.dumper import dumper
    from accuracy.dumper.compiled.standing import watch_compiled
    from accuracy.dumpfile import Dump, DumpError, load_dump
    from accuracy.live import LiveCheckError, live_check, substitute
    from accuracy.steps import Schedule, schedule

_LAZY = {"load_dump": "accuracy.dumpfile", "Dump": "accuracy.dumpfile",
         "DumpError": "accuracy.dumpfile",
         "live_check": "accuracy.live", "substitute": "accuracy.live",
         "LiveCheckError": "accuracy.live",
         "PrecisionDebugger": "accuracy.debugger", "schedule": "accuracy.steps",
         "Schedule": "accuracy.steps",
         "watch_compiled": "accuracy.dumper.compiled.standing"}

__all__ = ["dumper", "load_dump", "Dump", "DumpError", "live_check", "LiveCheckError",
           "substitute",
           "PrecisionDebugger", "schedule", "Schedule", "watch_compiled", "__version__"]


__getattr__ = lazy_getattr(__name__, _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"dumper"})


class _Package(types.ModuleType):
    """`accuracy.dumper` is the context manager, also once its subpackage is imported.

    Importing the subpackage `accuracy.dumper` binds the module to this name; the setter keeps
    the name meaning the class, as it did when this package imported it eagerly.
    """

    @property
    def dumper(self) -> Any:
        from accuracy.dumper.core import dumper

        return dumper

    @dumper.setter
    def dumper(self, _value: Any) -> None:
        pass


sys.modules[__name__].__class__ = _Package
