"""Compiled programs (`torch.compile`, regional compilation) seen from the dumper and the live
check: which compiled regions a recorded block entered and how they ran (`watch`)."""
