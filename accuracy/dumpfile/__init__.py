"""The dump file format: one writer, one lazy reader (see docs/dump-format.md)."""

from accuracy.dumpfile.reader import Dump, DumpError, OpRecord, TensorRecord, load_dump
from accuracy.dumpfile.schema import SCHEMA_VERSION, address, parse_address

__all__ = [
    "Dump", "DumpError", "OpRecord", "TensorRecord", "load_dump", "SCHEMA_VERSION", "address",
    "parse_address",
]
