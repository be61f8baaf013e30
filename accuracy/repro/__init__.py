"""`accuracy repro`: a standalone script reproducing one recorded Inductor kernel.

A tool downstream of the dump, beside compare and replay: it reads a dump (`accuracy.dumpfile`),
re-runs one kernel's reference as replay does (`accuracy.replay.kernels`) and pairs it with an
eager run's values as compare does (`accuracy.compare.compiled_align`). `script` writes the
script; `graphform` validates the kernel's fused subgraph read from the dump into a closed form
and prints it as the script's Python (no text of a dump becomes code).
"""
