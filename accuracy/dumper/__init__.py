"""Record every ATen op of a training step (see `dumper`)."""

from accuracy.dumper.core import dumper

__all__ = ["dumper"]
