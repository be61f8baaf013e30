"""The dump file format: one writer, one lazy reader (see docs/dump-format.md).

The public face the other parts import (tests/structure/test_layering.py keeps them to it):
the reader (`load_dump`, `Dump`, its records and errors) and the modules that name the format
itself (`schema`, `dtypes`, `checksum`, ...), listed in `__all__`. The rest are this package's
own.
"""

from accuracy.dumpfile.errors import DamagedDataError, DumpError
from accuracy.dumpfile.opening import require_regular_file
from accuracy.dumpfile.reader import Dump, load_dump
from accuracy.dumpfile.records import OpRecord, TensorRecord, TensorRef
from accuracy.dumpfile.schema import SCHEMA_VERSION, address, parse_address

__all__ = [
    "Dump", "DumpError", "DamagedDataError", "OpRecord", "TensorRecord", "TensorRef",
    "load_dump", "require_regular_file", "SCHEMA_VERSION", "address", "parse_address",
    # modules: the format's vocabulary, the writer, and the readers of its parts
    "argcodec", "checksum", "compiled", "dtypes", "quant", "schema", "stats", "symsizes",
    "validate", "writer",
]
