"""Module paths as dynamo spells them in `nn_module_stack`, turned into the dumper's names.

One rule for both readers of FX node metadata: Inductor kernel rows (compiled/inductor.py) and
FX GraphModules run op by op (dumper/fxnames.py). A kernel row named otherwise than the eager
row of the same module pairs with nothing.
"""

from __future__ import annotations

import re

# the traced callable as dynamo names it: L['self'], or L['args'][0] / L['kwargs']['model']
# where a decorator wraps forward (transformers' models); the path inside it follows
_KEY = re.compile(r"^L\['[^']*'\](?:\[\d+\]|\['[^']*'\])*\.?")


def module_path(text: str) -> str:
    """A module path as `nn_module_stack` spells it (`L['self'].layers[0]`,
    `L['args'][0].model._modules['h']`) as the dumper names modules (`layers.0`, `model.h`),
    relative to the traced module ('' for the module itself)."""
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", text)
    path = _KEY.sub("", path)
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")
