"""Checks on the three dumps before comparing: what cannot be right is refused or said first.

- a replay made from another dump than `-m` gives local errors of other tensors: refused;
- a replay given as `-m` or `-g` holds no run's values: refused;
- the reference backend on the `-m` side and a device on the `-g` side: the sides are
  swapped, refused saying so;
- two dumps of different models (no root module in common once wrappers are seen through and
  fewer than half of my run's tensors pairing, or fewer than one in ten of an unfiltered run
  pairing): refused, since a verdict over a handful of look-alike ops is no verdict;
- an incomplete dump (the run stopped before the dumper closed) explains missing rows: said
  before anything else;
- compiled kernels that drew random numbers with Inductor's own generator
  (`ACCURACY_COMPILED_RANDOM=inductor`): their dropout masks are no other run's, so every value
  after them differs by the mask, not by numerics: said before the counts.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any

from accuracy.aten import AMP_UPDATE_OP
from accuracy.dumpfile import Dump
from accuracy.dumpfile import compiled as compiled_attrs
from accuracy.errors import NotComparableError, UsageError

log = logging.getLogger(__name__)
# Backends a golden run is normally recorded on.
REFERENCE_BACKENDS = ("cpu",)


LOSS_SCALES_DIFFER = "loss scales differ"  # a WARNING line said before the counts


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_replay(my: Dump, replay: Dump) -> None:
    """Raise ValueError when `replay` was not replayed from `my` (naming both files).

    A dump moved or copied after its replay is accepted when every replayed op is the same op
    at the same position of `my`."""
    src = replay.attrs.get("replayed_from")
    if not src:
        raise UsageError(f"{replay.path} is not a replay (no replayed_from attribute); -r takes "
                         "the output of `accuracy replay` on the -m dump")
    if _same_file(src, my.path):
        return
    mine = {r.seq: r.op for r in my.records}
    theirs = [(r.seq, r.op) for r in replay.records]
    if theirs and all(mine.get(seq) == op for seq, op in theirs) and \
            Path(src).name == Path(my.path).name:
        log.info("replay %s was made from %s, a copy of %s with the same ops", replay.path, src,
                 my.path)
        return
    raise UsageError(f"replay {replay.path} was replayed from {src}, not from the -m dump "
                     f"{my.path}: its local errors belong to other tensors. Replay {my.path} "
                     f"(`accuracy replay {my.path} -o replay.h5`) or pass the matching -m")


def incomplete(d: Dump, side: str) -> str | None:
    """A sentence when the dump did not close cleanly (crash, kill, disk full), else None."""
    done = bool(d.attrs.get("complete")) and getattr(d, "closed_cleanly", True)
    if done:
        return None
    return (f"{side} dump {d.path} is incomplete (the run stopped before the dumper closed: "
            f"a crash, a kill or a full disk); it holds {len(d.records)} ops, and rows after "
            "its last op are unmatched for that reason")


def loss_scales(d: Dump) -> list[float]:
    """The loss scale of each GradScaler step in the dump: its update's scale input, recorded
    before the update. (Not the unscale's inv_scale: with a fused optimizer it is 1 and the
    optimizer unscales.) Empty without GradScaler."""
    out = []
    for r in d.records:
        if r.op == AMP_UPDATE_OP and r.inputs:
            top = (r.inputs[0].stats or {}).get("max")
            if top is not None:
                out.append(float(top))
    return out


def loss_scales_differ(my: Dump, golden: Dump) -> str | None:
    """A sentence when the two runs scaled their loss differently (GradScaler on one side
    only, or other scales), else None: every gradient before the unscale then differs from
    golden's by the ratio, and the backward's accumulated figures measure the scale."""
    a, b = loss_scales(my), loss_scales(golden)
    if (a or [1.0]) == (b or [1.0]):
        return None

    def said(scales: list[float]) -> str:
        if not scales:
            return "1 (no GradScaler)"
        return ", ".join(f"{v:g}" for v in dict.fromkeys(scales))

    return (f"{LOSS_SCALES_DIFFER}: my run's GradScaler scaled the loss by {said(a)}, golden's "
            f"by {said(b)}: gradients before the unscale differ from golden's by that factor, "
            "so the backward's accumulated figures and first divergence show the scale, not "
            "numerics; scale both runs alike (the same GradScaler init_scale, or none on "
            "either side) or compare with -r (each op judged on its own inputs)")


def _run_name(d: Dump) -> str:
    """How a dump's root attributes name the run: "a sim run (profile fp16-cube)", "a CPU run"."""
    backend = str(d.attrs.get("backend") or "")
    name = "CPU" if backend == "cpu" else backend
    profile = d.attrs.get("profile")
    return f"a {name} run" + (f" (profile {profile})" if profile else "")


def check_swapped(my: Dump, golden: Dump) -> None:
    """Refuse -m recorded on the reference backend with -g recorded on a device (or `sim`):
    the device under test goes in -m, and every verdict would be read backwards."""
    bm, bg = my.attrs.get("backend"), golden.attrs.get("backend")
    if bm in REFERENCE_BACKENDS and bg and bg not in REFERENCE_BACKENDS:
        raise NotComparableError(
            f"-g {golden.path} is {_run_name(golden)} and -m {my.path} {_run_name(my)}: -m "
            "takes the device under test and -g the reference run; swap them")


def check_not_replay(d: Dump, flag: str) -> None:
    """Refuse a replay (`accuracy replay`'s output) where a recorded run is wanted: it holds
    the reference's figures of another dump's ops, not a run's values."""
    src = d.attrs.get("replayed_from")
    if src:
        raise NotComparableError(
            f"{flag} {d.path} is a replay of {src} (written by `accuracy replay`), not a dump "
            f"of a run: give the dump itself as {flag}"
            + (" and its replay as -r" if flag == "-m" else ""))


# Wrappers that hold the user's model under one attribute: the root is theirs, the model's
# own class is not in the path (`DistributedDataParallel.module.layers.0`).
WRAPPER_ROOTS = frozenset({"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel",
                           "OptimizedModule"})
# Wrapper attributes seen through wherever they are (FSDP1 per layer, compiled or
# checkpointed blocks).
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})
FSDP2_PREFIX = "FSDP"  # fully_shard(model) makes the model's class `FSDP<class>`
# Fewer than one tensor in ten of my run pairing with golden: not the same model and step
# (another model's dump pairs 0-5% of its tensors, the same model filtered to a part 29%).
MIN_PAIRED_SHARE = 0.1
# With no root module in common, fewer than half: the line `mostly_uncompared` draws too.
MIN_SHARE_OTHER_ROOT = 0.5


def model_root(module: str) -> str | None:
    """The class name at the root of a recorded module path, wrappers seen through (DDP's,
    DataParallel's `module`, FSDP's, `torch.compile`'s `_orig_mod`, fully_shard's `FSDP`
    prefix); None when the path has none or a wrapper hides the model's own class."""
    parts = [p for p in module.split(".") if p and p not in WRAPPER_SEGMENTS]
    if not parts or parts[0] in WRAPPER_ROOTS:
        return None
    root = parts[0]
    if root.startswith(FSDP2_PREFIX) and len(root) > len(FSDP2_PREFIX):
        root = root[len(FSDP2_PREFIX):]
    return root


def model_roots(modules: Any) -> set[str] | None:
    """The root classes of some module paths (`model_root`); None when a wrapper hides the
    model's class in any of them (its other roots, a loss module's, tell nothing alone)."""
    roots: set[str] = set()
    for m in set(modules):
        r = model_root(m or "")
        if r is None and (m or "").split(".")[0] in WRAPPER_ROOTS:
            return None
        if r is not None:
            roots.add(r)
    return roots


def check_same_model(my: Dump, golden: Dump, specs: Any, rename: Any = None) -> None:
    """Refuse two dumps whose module paths share no root class (`model_root`) when fewer than
    half of my run's tensors pair (`paired_share`): another model's dump. A part of the model
    run on its own (`model.fc1(x)`, root `Linear`) pairs well, and one model's class renamed
    too: those are compared. `rename`: the user's module mapping (my name -> golden name),
    applied to my run's paths first; a side whose roots a wrapper hides is not judged here."""
    rename = rename or (lambda m: m)
    mine = model_roots(rename(r.module) for r in my.records)
    theirs = model_roots(r.module for r in golden.records)
    if not (mine and theirs) or mine & theirs:
        return
    n, paired = paired_share(specs)
    if paired < MIN_SHARE_OTHER_ROOT * n:
        a, b = sorted(mine)[0], sorted(theirs)[0]
        raise NotComparableError(
            f"-m {my.path} and -g {golden.path} record different models (root modules "
            f"{', '.join(sorted(mine))} against {', '.join(sorted(theirs))}, and {paired} of "
            f"{n} tensors of my run pair): compare two dumps of the same model and step; if "
            "they are one model under two names, pair them with --mapping (a JSON file: "
            f"{{\"modules\": {{\"{a}\": \"{b}\"}}}})")


def filtered(d: Dump) -> bool:
    """Whether the dump holds a chosen part of its run (ops, modules, phases, a selection,
    overflow births, an extract): it pairs with only that part of a full one."""
    f = d.attrs.get("filter")
    if isinstance(f, dict) and (f.get("ops") or f.get("exclude_ops") or f.get("modules")
                                or ("phases" in f and len(f["phases"] or ()) < 3)):
        return True
    return bool(d.attrs.get("select") or d.attrs.get("check_overflow")
                or d.attrs.get("format") == "accuracy-extract")


def paired_share(specs: Any) -> tuple[int, int]:
    """(my run's op tensors of more than one element, those paired with a golden tensor of
    as many elements). Scalars are left out: the loss's `sum` and `ones_like` pair in any
    two steps, and a tensor paired by op name alone with another shape pairs nothing."""
    mine = [s for s in specs if s.kind == "op" and s.my is not None and s.my.numel > 1]
    return len(mine), sum(s.golden is not None and s.golden.numel == s.my.numel for s in mine)


def check_pairing(my: Dump, golden: Dump, specs: Any) -> None:
    """Refuse two whole runs of which fewer than one tensor of my run in ten pairs with a
    golden tensor of its size (`paired_share`): whatever their module names, they are not
    the same step of the same model. A filtered dump on either side pairs with part of the
    other by design, and so does a compiled run (its fused kernels pair with few eager
    values, on either side): neither is refused."""
    mine, paired = paired_share(specs)
    if mine and paired < MIN_PAIRED_SHARE * mine and golden.records \
            and not (filtered(my) or filtered(golden)) \
            and not (compiled_attrs.regions(my.attrs) or compiled_attrs.regions(golden.attrs)):
        raise NotComparableError(
            f"-m {my.path} and -g {golden.path} hardly pair: {paired} of {mine} tensors of my "
            "run have a golden counterpart of their size (fewer than 1 in 10), so they are "
            "not dumps of the same model and step: compare two dumps of the same step "
            "(--mapping pairs ops or modules named otherwise)")


OWN_RANDOM = "drew random numbers with Inductor's own generator"
# random ops as a kernel's origin nodes or its reference graph name them
_RANDOM_OP = re.compile(r"dropout|bernoulli|\brand|inductor_random|multinomial|normal|"
                        r"exponential|geometric|cauchy|log_normal|uniform")


def _random_kernels(d: Dump) -> list[Any]:
    """Kernel rows whose outputs or reference graph hold a random op."""
    out = []
    for r in d.records:
        if not r.extra.get("compiled"):
            continue
        ref = r.extra.get("reference")
        ops = [str(o.get("orig", "")) + " " + str(o.get("op", ""))
               for o in r.extra.get("outputs") or [] if isinstance(o, dict)]
        ops += [str(n.get("op", "")) for n in (ref.get("nodes") or [] if isinstance(ref, dict)
                                             else []) if isinstance(n, dict)]
        if any(_RANDOM_OP.search(o) for o in ops):
            out.append(r)
    return out


def own_random(d: Dump, side: str) -> str | None:
    """A sentence when the dump's compiled kernels drew random numbers with Inductor's own
    generator and some kernel holds a random op, else None."""
    if d.attrs.get("compiled_random") != "inductor":
        return None
    kernels = _random_kernels(d)
    if not kernels:
        return None
    first = kernels[0]
    return (f"{side} dump {d.path}: {len(kernels)} compiled kernel(s) {OWN_RANDOM} (first: "
            f"{first.op} in {first.module or 'the root'}): their masks are no other run's, so "
            "their outputs and everything after them differ by the masks, not by numerics; "
            "record again without ACCURACY_COMPILED_RANDOM=inductor to draw eager's masks")
