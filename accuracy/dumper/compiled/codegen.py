"""The code-generation side of the kernel hooks: Inductor's wrapper code, with our lines.

Why this mechanism: Inductor's own `config.generate_intermediate_hooks` is emitted only by the
SIMD (Triton) scheduling and for extern kernels, so a CPU step gets none for its C++ kernels;
AOTInductor's value printer covers extern calls only. Every kernel launch, C++ or Triton, goes
through one method of the Python wrapper code generator,
`PythonWrapperCodegen.generate_kernel_call`. While a dumper records, that method is wrapped:
after each launch line it emits one line calling `after_launch(kernel_id, [buffers])`
(accuracy/dumper/compiled/launches.py), and at code generation time it describes the launch
site (accuracy/dumper/compiled/kernels.py): what the buffers are (inputs or materialised
outputs), and for each output the FX nodes it came from. At run time the hook hands the live
buffers to the recording source (accuracy/dumper/compiled/source.py), which emits one
`KernelCall` into the dumper's loop. Extern kernels (mm, addmm, convolution...) are ATen calls
the dumper's dispatch mode already sees at run time (it ignores compile internals only while
compiling): their lines are marked with the FX node they compute.

What a hook line needs at run time (the kernel's description) is written into the generated
module itself, as one registration line per launch site at its top (`register_kernel`), so a
program Inductor's FX-graph or AOTAutograd cache hands back describes itself exactly as a
fresh one: the caches stay on while the wrapper is installed. Hooked and plain programs must
never be served for each other, so while installed the wrapper adds a tag to torch's cache
keys (`torch.compiler.config.cache_key_tag`), one per version of the code that writes the
lines.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any

from accuracy.dumper.compiled import launches, verify
from accuracy.dumper.compiled.kernels import (
    describe_extern,
    describe_launch,
    extern_text,
    kernel_text,
    next_site_id,
)

log = logging.getLogger(__name__)

_lock = threading.Lock()
_users = 0
_saved: dict[str, Any] = {}


def _kernel_writes(call_args: Any, arg_types: Any) -> set[str] | None:
    """The buffers the kernel being launched writes: its `KernelArgs`' output and in-place
    buffers (under the names the call passes: a mutated graph input by its own name), found
    on the code generator's `call_kernel` frame; else the non-const pointers of a C++ call's
    `arg_types`. None when neither is there (then only fresh buffers count as written)."""
    try:
        from torch._inductor.codegen.common import KernelArgs, RemovedArg
    except Exception:  # noqa: BLE001 - torch moved it: fall back on the argument types
        KernelArgs = RemovedArg = None  # noqa: N806
    frame = sys._getframe(1)
    for _ in range(8):
        frame = frame.f_back
        if frame is None or KernelArgs is None:
            break
        args = getattr(frame.f_locals.get("self"), "args", None)
        if isinstance(args, KernelArgs):
            out = {k for k, v in args.output_buffers.items() if not isinstance(v, RemovedArg)}
            for v in args.inplace_buffers.values():
                if not isinstance(v, RemovedArg) and v.other_names:
                    out.add(v.other_names[-1])
            return out
    if isinstance(arg_types, list | tuple) and len(arg_types) == len(call_args):
        return {a for a, t in zip(call_args, arg_types, strict=True) if isinstance(a, str)
                and isinstance(t, str) and t.endswith("*") and not t.startswith("const")}
    return None


def _launch_ops() -> set[str] | None:
    """The scheduler operations (`op17`...) the kernel being launched computes, found on the
    code generator's frames: a C++ kernel group's `scheduled_nodes` (one C++ function runs
    the loops of several scheduler nodes), a SIMD kernel's `node_schedule`. None when neither
    is there. A mutation among them (a scatter into the buffer a loop before it zero-fills:
    the lowering of `scatter_add` when Inductor does not fall back to ATen's, e.g. with one
    CPU thread) is finished by this very launch, not by a later one."""
    try:
        from torch._inductor.scheduler import BaseSchedulerNode
    except Exception:  # noqa: BLE001 - torch moved it: no launch is known to finish a buffer
        return None
    frame = sys._getframe(1)
    for _ in range(10):
        frame = frame.f_back
        if frame is None:
            break
        nodes = getattr(frame.f_locals.get("self"), "scheduled_nodes", None)
        if nodes is None:
            nodes = frame.f_locals.get("node_schedule")
        if isinstance(nodes, list | tuple):
            ops = {o for n in nodes if isinstance(n, BaseSchedulerNode)
                   for o in n.get_operation_names()}
            if ops:
                return ops
    return None


def install() -> None:
    """Wrap the wrapper code generator (refcounted) and turn the compile caches off."""
    global _users
    with _lock:
        _users += 1
        if _users > 1:
            return
        try:
            from torch._functorch import config as fconfig
            from torch._inductor import config
            from torch._inductor.codegen.wrapper import PythonWrapperCodegen
        except Exception as e:  # noqa: BLE001 - no Inductor here: nothing to wrap
            log.info("Inductor not available (%s): its kernels cannot be recorded", e)
            return
        orig = PythonWrapperCodegen.generate_kernel_call

        def generate_kernel_call(self: Any, kernel_name: str, call_args: Any,
                                 *args: Any, **kwargs: Any) -> Any:
            var = ""
            try:
                seen = self.__dict__.setdefault("_accuracy_seen", set())
                info = describe_launch(kernel_name, call_args, seen, getattr(self, "reuses", {}),
                                 _kernel_writes(call_args, kwargs.get("arg_types")),
                                 _launch_ops())
                if info is None:
                    _unhooked_line(self, kernel_name, "it writes no buffer Inductor names as "
                                   "its output or as mutated")
                else:
                    info.src = _sources(self).get(kernel_name, "")
                    var = f"_acc_k{info.kid}"
                    _module_line(self, f"{var} = _acc_register({kernel_text(info)!r})")
                    if info.before:
                        self.writeline(f"_acc_pre({var}, [{', '.join(info.before)}])")
            except Exception as e:  # noqa: BLE001 - codegen goes on without our line
                log.exception("cannot hook kernel %s", kernel_name)
                _unhooked_line(self, kernel_name,
                               f"describing it failed ({type(e).__name__}: {e})")
                var = ""
            out = orig(self, kernel_name, call_args, *args, **kwargs)
            if var:
                self.writeline(f"_acc_hook({var}, [{', '.join(info.buffers)}])")
            return out

        def wrap_extern(name: str) -> None:
            """Mark the lines of extern kernel calls with the FX node they compute: their
            rows take its module and source line, as fused kernels' do."""
            orig_ext = getattr(PythonWrapperCodegen, name, None)
            if orig_ext is None:
                return

            def generate(self: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
                var = ""
                try:
                    site = describe_extern(node)
                    if site is not None:
                        var = f"_acc_e{next_site_id()}"
                        _module_line(self, f"{var} = _acc_register_extern("
                                           f"{extern_text(site)!r})")
                        self.writeline(f"_acc_extern({var})")
                except Exception:  # noqa: BLE001 - codegen goes on without our line
                    log.debug("cannot mark extern kernel", exc_info=True)
                    var = ""
                out = orig_ext(self, node, *args, **kwargs)
                if var:
                    self.writeline("_acc_extern(0)")
                return out

            _saved["ext_" + name] = orig_ext
            setattr(PythonWrapperCodegen, name, generate)

        for name in ("generate_extern_kernel_out", "generate_extern_kernel_alloc",
                     "generate_fallback_kernel"):
            wrap_extern(name)
        orig_define = PythonWrapperCodegen.define_kernel

        def define_kernel(self: Any, kernel_name: str, kernel_body: str, *args: Any,
                          **kwargs: Any) -> Any:
            try:  # what the kernel's launches are checked against before they are recorded
                _sources(self)[kernel_name] = verify.digest(kernel_body)
            except Exception:  # noqa: BLE001 - codegen goes on; its launches read BLIND
                log.debug("cannot digest kernel %s", kernel_name, exc_info=True)
            return orig_define(self, kernel_name, kernel_body, *args, **kwargs)

        _saved["define"] = orig_define
        PythonWrapperCodegen.define_kernel = define_kernel
        _saved["gkc"] = (PythonWrapperCodegen, orig)
        PythonWrapperCodegen.generate_kernel_call = generate_kernel_call
        _tag_cache_keys(config, fconfig)
        _saved["random"] = config.fallback_random
        config.fallback_random = random_mode() == EAGER_RANDOM
        from accuracy.dumper.compiled import reference
        reference.install()


def uninstall() -> None:
    global _users
    with _lock:
        _users = max(0, _users - 1)
        if _users or "gkc" not in _saved:
            return
        cls, orig = _saved.pop("gkc")
        cls.generate_kernel_call = orig
        for key in [k for k in _saved if k.startswith("ext_")]:
            setattr(cls, key[4:], _saved.pop(key))
        if "define" in _saved:
            cls.define_kernel = _saved.pop("define")
        launches.clear_extern()
        from accuracy.dumper.compiled import reference
        reference.uninstall()
        _untag_cache_keys()
        if "random" in _saved:
            from torch._inductor import config

            config.fallback_random = _saved.pop("random")


def installed() -> bool:
    """Whether programs generated now get the hook lines."""
    return "gkc" in _saved


def _sources(wrapper: Any) -> dict[str, str]:
    """Kernel name -> digest of its definition, kept on the root wrapper of the graph being
    generated (a subgraph's kernels are defined in the module its root writes)."""
    root = wrapper.get_root_graph() if hasattr(wrapper, "get_root_graph") else wrapper
    return root.__dict__.setdefault("_accuracy_sources", {})


EAGER_RANDOM, INDUCTOR_RANDOM = "eager", "inductor"
RANDOM_ENV = "ACCURACY_COMPILED_RANDOM"


def random_mode() -> str:
    """Whose generator programs compiled while a dumper records draw random numbers with.
    "eager" (the default): Inductor's `fallback_random`, so a compiled dropout draws the masks
    an eager run with the same seed draws, and compiled against eager compares like with like
    (Inductor's own generator gives other masks: every value after a dropout differs, and the
    compare blamed an honest matmul). "inductor" (`ACCURACY_COMPILED_RANDOM=inductor`): the
    program's own generator, as it runs outside the dumper."""
    import os

    mode = os.environ.get(RANDOM_ENV, EAGER_RANDOM).strip().lower()
    return mode if mode in (EAGER_RANDOM, INDUCTOR_RANDOM) else EAGER_RANDOM


def hooks_tag() -> str:
    """The cache-key tag of hooked programs: a digest of the code that writes the hook lines
    and the descriptions they register, so a program cached by another version of it is
    never served (its descriptions could be read wrongly)."""
    if "tag" not in _TAG:
        h = hashlib.sha256()
        here = Path(__file__).resolve().parent
        package = here.parents[1]  # accuracy/
        for f in sorted([*here.glob("*.py"), package / "dumpfile" / "argcodec.py"]):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
        _TAG["tag"] = f"accuracy-kernel-hooks-{h.hexdigest()[:16]}"
    return _TAG["tag"]


_TAG: dict[str, str] = {}


def _tag_cache_keys(config: Any, fconfig: Any) -> None:
    """Tag torch's compile cache keys while programs are generated with hook lines (the
    user's own tag kept in front); a torch without the tag turns the two caches off instead,
    as a cached plain program has no hook lines."""
    try:
        from torch.compiler import config as cconfig

        old = cconfig.cache_key_tag
        cconfig.cache_key_tag = f"{old}|{hooks_tag()}" if old else hooks_tag()
        _saved["tag"] = (cconfig, old)
    except Exception as e:  # noqa: BLE001 - torch moved it: no cache is safe then
        log.info("cannot tag torch's compile cache keys (%s): FX-graph and AOTAutograd "
                 "caches off while recording", e)
        _saved["caches"] = (config, fconfig, config.fx_graph_cache,
                            fconfig.enable_autograd_cache)
        config.fx_graph_cache = False
        fconfig.enable_autograd_cache = False


def _untag_cache_keys() -> None:
    if "tag" in _saved:
        cconfig, old = _saved.pop("tag")
        cconfig.cache_key_tag = old
    if "caches" in _saved:
        config, fconfig, fx, aot = _saved.pop("caches")
        config.fx_graph_cache, fconfig.enable_autograd_cache = fx, aot


_IMPORT = ("from accuracy.dumper.compiled.launches import register_kernel as _acc_register, "
           "register_extern as _acc_register_extern, unhooked as _acc_unhooked, "
           "after_launch as _acc_hook, before_launch as _acc_pre, extern_call as _acc_extern")


def _module_line(wrapper: Any, line: str) -> None:
    """Write `line` at the top level of the generated module: into the root wrapper's header
    (a subgraph's wrapper emits none of its own), after our import, written once."""
    root = wrapper.get_root_graph() if hasattr(wrapper, "get_root_graph") else wrapper
    if not root.__dict__.get("_accuracy_import"):
        root.imports.writeline(_IMPORT)
        root._accuracy_import = True
    root.header.writeline(line)


def _unhooked_line(wrapper: Any, kernel: str, why: str) -> None:
    """Have the generated module report a launch site without a hook each time it is loaded
    (a cached program too); reported now when the line cannot be written."""
    try:
        _module_line(wrapper, f"_acc_unhooked({kernel!r}, {why!r})")
    except Exception:  # noqa: BLE001 - never silently blind: say it now
        log.debug("cannot write the unhooked line", exc_info=True)
        launches.unhooked(kernel, why)
