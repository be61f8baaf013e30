"""Module paths as dynamo spells them in `nn_module_stack`, turned into the dumper's names.

One rule for every reader of FX node metadata: Inductor kernel rows (compiled/inductor.py),
the ATen ops of an aot_eager/eager compiled graph (compiled/graphs.py) and FX GraphModules run
op by op (dumper/fxnames.py). A row named otherwise than the eager row of the same module
pairs with nothing.

Dynamo names a module by the variable of the traced frame it was reached from, then the path
inside it: `L['self'].layers[0]` (the compiled module itself), `L['model'].blocks[0]` (an
argument of a compiled function), `G['net'].fc` (a global it reads), `L['n2']` (a closed-over
cell). The eager dump names the same module by its root class and path (`Net.blocks.0`), so the
traced variable must be named as the eager dump names the module object it holds: the region's
own path for the compiled module itself, the scope's name of the object where the dumper saw
it, else its class (ModuleTracker names a root module by its class).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# the traced variable as dynamo names it: L['self'], L['args'][0] / L['kwargs']['model']
# (a decorator wrapping forward, as transformers' models do), G['net']; the path follows
_ROOT = re.compile(r"^[LG]\['[^']*'\](?:\[\d+\]|\['[^']*'\])*")


def split_root(text: str) -> tuple[str, str]:
    """(the traced variable, the module path inside it as the dumper spells paths) of a path
    as `nn_module_stack` spells it: `L['model']._modules['h'][1].attn` -> (`L['model']`,
    `h.1.attn`)."""
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", text)
    m = _ROOT.match(path)
    root = m.group(0) if m else ""
    rest = path[len(root):]
    return root, re.sub(r"\[(\d+)\]", r".\1", rest).strip(".")


def module_path(text: str) -> str:
    """A module path as `nn_module_stack` spells it (`L['self'].layers[0]`,
    `L['args'][0].model._modules['h']`) as the dumper names modules (`layers.0`, `model.h`),
    relative to the traced variable ('' for the module itself)."""
    return split_root(text)[1]


def join_module(base: str, rel: str) -> str:
    """A path `rel` under module path `base`."""
    if not rel:
        return base
    return f"{base}.{rel}" if base else rel


@dataclass
class RegionCall:
    """One call of a compiled region, as the names of its rows need it.

    base: the module path of the region (a compiled module's own path as the eager dump names
    it; for a function, the module it was called from). kind: "module" or "function".
    roots: traced variables holding modules (`L['model']`, `G['net']`) -> the name the eager
    dump gives that module object, where known at the call. classes: the same variables ->
    the class of the module each holds.

    A program Inductor's caches serve was described by the frame that compiled it: a
    function reading the model from a global (`G['net']`) is served the program compiled for
    `step(model, x)` (the cache keys its graph after AOTAutograd renamed the inputs), whose
    rows spell the model `L['model']`. Such a variable, unknown at this call, is rebound to
    the call's one variable holding a module of the same class.
    """

    base: str
    kind: str = "module"
    roots: dict[str, str] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)

    def module(self, root: str, rel: str, root_cls: str = "") -> str:
        """The eager name of module `rel` inside traced variable `root` (of class
        `root_cls`)."""
        head = self.roots.get(root)
        if head is None:
            head = self._same_class(root_cls)
        if head is None:
            if self.kind == "module" and (not root or root.startswith("L[")):
                head = self.base  # the compiled module itself (L['self'], L['args'][0])
            else:  # a module the compiled code reached from outside, never entered eagerly
                head = root_cls or self.base
        return join_module(head, rel)

    def _same_class(self, root_cls: str) -> str | None:
        """The eager name of the call's one module of class `root_cls` (None if none, or if
        several hold different modules: a guess between them would misname rows)."""
        names = {self.roots[k] for k, c in self.classes.items()
                 if c == root_cls and k in self.roots} if root_cls else set()
        return names.pop() if len(names) == 1 else None
