"""msprobe's config.json, read into what the dumper needs; every field checked by name.

The mapping (also in docs/long-runs.md):
- task: statistics -> mode "statistics"; tensor -> mode "tensor"; overflow_check -> the
  overflow watcher (records the ops where inf/nan is born). Other msprobe tasks are refused.
- level: we record ATen ops (below msprobe's L1 APIs) with the module each runs in, so the
  report has op rows and module rows at every level. `level` says how `list` is read:
  L0 module names, L1 API names, mix either (names starting "Module." are modules).
- rank, step: lists with ranges ("4-6"), kept as ranges (`steps.IdRanges`); empty means all.
  `schedule` (ours): torch.profiler's. The file is read by `configfile.read_json`.
- data_mode: the dumper's data_mode words (all, forward, backward, input, output).
- summary_mode: statistics or md5 (our statistics always carry a checksum per tensor).
- async_dump: accepted either way; our writes always run on a background thread.
- dump_enable: msprobe's switch: false records no step, true (or absent) the steps above. The
  debugger re-reads the file while training runs (debugger.core), so a job can be steered.
- overwrite (ours): replace the dumps an earlier run left in dump_path (else those steps are
  not recorded, and the debugger says so when it starts).
- list at L0 (and `Module.` names at mix): msprobe's `Module.<path>.<Class>.forward.<n>`;
  a name whose segment before `forward` is no class name (`Module.layers.0.forward.0`) is
  refused, since its path cannot be told from it (it was read as the parent, `layers`).
Imports no torch.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accuracy.configfile import check_list, read_json
from accuracy.errors import UsageError
from accuracy.steps import IdRanges, Schedule, parse_ids

log = logging.getLogger(__name__)

TASKS = ("statistics", "tensor", "overflow_check")
LEVELS = ("L0", "L1", "mix")
# msprobe tasks we do not do: their sections may sit in a config (msprobe ships one with
# acc_check filled in) and are skipped; choosing one as `task` is refused
OTHER_TASKS = ("acc_check", "run_ut", "free_benchmark", "grad_probe", "structure",
               "exception_dump", "nan_check", "kernel_dump")
TOP_FIELDS = ("task", "dump_path", "rank", "step", "level", "async_dump", "schedule",
              "dump_enable", "overwrite")
# msprobe fields that change nothing here (said once in the log)
TOP_NO_EFFECT = ("extra_info", "seed", "is_deterministic", "enable_dataloader", "framework",
                 "acl_config", "precision")
TASK_FIELDS = ("scope", "list", "data_mode", "summary_mode", "overflow_nums")
TASK_NO_EFFECT = ("tensor_list", "bench_path", "diff_nums", "file_format", "check_mode",
                  "online_run_ut", "nfs_path", "host", "port", "save_by_rank")
SUMMARY_MODES = ("statistics", "md5")
DATA_MODES = ("all", "forward", "backward", "input", "output")
_API_PREFIXES = ("Functional.", "Torch.", "Tensor.", "Aten.", "NPU.", "Distributed.",
                 "VF.", "Jit.")
SCHEDULE_FIELDS = ("wait", "warmup", "active", "repeat", "skip_first")


@dataclass
class DebugConfig:
    """What the debugger records, after checking."""

    task: str = "statistics"
    dump_path: Path = Path("./dump_path")
    level: str = "L1"
    ranks: IdRanges | None = None
    steps: IdRanges | Schedule | None = None
    ops: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    data_mode: tuple[str, ...] = ("all",)
    summary_mode: str = "statistics"
    async_dump: bool = False
    overflow_nums: int = 1
    dump_enable: bool = True
    overwrite: bool = False
    ignored: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "tensor" if self.task == "tensor" else "statistics"

    def steps_text(self) -> str:
        """Which steps record, in words: "every step", "steps 0, 4-6", "schedule(...)"."""
        if self.steps is None:
            return "every step"
        if isinstance(self.steps, Schedule):
            return f"steps by {self.steps.describe()}"
        return "steps " + ", ".join(map(str, self.steps.describe()))

    def wants(self, step: int, rank: int) -> bool:
        return (self.dump_enable and (self.steps is None or step in self.steps)
                and (self.ranks is None or rank in self.ranks))

    def describe(self) -> str:
        """The fields in force, in one line."""
        def ids(x: IdRanges | Schedule | None) -> str:
            if x is None:
                return "all"
            return x.describe() if isinstance(x, Schedule) else json.dumps(x.describe())
        sel = (f" list: ops {list(self.ops)} modules {list(self.modules)}"
               if self.ops or self.modules else "")
        return (f"dump_enable={str(self.dump_enable).lower()} task={self.task} "
                f"level={self.level} dump_path={self.dump_path} step={ids(self.steps)} "
                f"rank={ids(self.ranks)} data_mode={','.join(self.data_mode)}"
                f"{sel}" + (f" overflow_nums={self.overflow_nums}"
                            if self.task == "overflow_check" else "")
                + (" overwrite=true" if self.overwrite else ""))


def _fail(where: str, msg: str) -> UsageError:
    return UsageError(f"{where}: {msg}")


def _check_keys(data: dict[str, Any], allowed: tuple[str, ...], no_effect: tuple[str, ...],
                skipped: tuple[str, ...], where: str, ignored: list[str]) -> None:
    for k in data:
        if k in allowed or k in skipped:
            continue
        if k in no_effect:
            ignored.append(k)
            continue
        raise _fail(where, f"unknown field {k!r}; allowed: {', '.join(allowed + no_effect)}")


def _str_list(v: Any, name: str, where: str) -> list[str]:
    return check_list(v, name, where)


_PASSES = ("forward", "backward")


def module_name(name: str, where: str = "config") -> str:
    """An msprobe `Module.` list name -> the module path the dumper's `modules=` takes:
    `Module.layers.0.Linear.forward.0` -> `layers.0`, `Module.TinyLM.forward.0` (the root)
    -> `TinyLM`, `Module.layers.0` -> `layers.0`. A name ending `.forward.<n>` whose segment
    before it is no class name is refused: which of its segments is the path is unknown."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[-2] in _PASSES and parts[-1].isdigit():
        cls, path = parts[-3], parts[1:-3]
        if not (cls.isidentifier() and cls[:1].isupper()):
            alone = ".".join(parts[1:-2])
            raise _fail(where, f"list entry {name!r}: {cls!r} before '.{parts[-2]}."
                               f"{parts[-1]}' is not a class name, so the module is unclear: "
                               "msprobe's L0 names are Module.<path>.<Class>.forward.<n> (e.g. "
                               f"Module.layers.0.Linear.forward.0); add the class, or give the "
                               f"module path alone ({alone!r})")
        return ".".join(path) or cls
    path = ".".join(parts[1:])
    if not path:
        raise _fail(where, f"list entry {name!r} names no module")
    return path


def split_list(names: list[str], level: str, where: str = "config"
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """msprobe `list` entries -> (op patterns, module patterns) for the dumper."""
    ops: list[str] = []
    modules: list[str] = []
    for name in names:
        if name.startswith("Module."):  # Module.<path>.<Class>.forward.<n>
            modules.append(module_name(name, where))
        elif level == "L0":
            modules.append(name)
        else:
            for p in _API_PREFIXES:
                if name.startswith(p):
                    name = name[len(p):].split(".")[0]
                    break
            else:
                if "." in name or "::" in name:  # `aten.gelu`, `aten::gelu`: as every option
                    ops.append(name)
                    continue
            ops.append(f"aten.*{name}*")
    return tuple(ops), tuple(modules)


def _schedule(v: Any, where: str) -> Schedule:
    if not isinstance(v, dict):
        raise _fail(where, f"schedule must be an object with {', '.join(SCHEDULE_FIELDS)}")
    extra = sorted(set(v) - set(SCHEDULE_FIELDS))
    if extra:
        raise _fail(where, f"unknown schedule field {extra[0]!r}; allowed: "
                           f"{', '.join(SCHEDULE_FIELDS)}")
    return Schedule(**v)


def build(data: dict[str, Any], where: str = "config", **overrides: Any) -> DebugConfig:
    """A DebugConfig from msprobe's config dict; `overrides` are PrecisionDebugger's keywords
    (task, dump_path, level, step, schedule, overwrite), which win over the file as in
    msprobe."""
    if not isinstance(data, dict):
        raise _fail(where, "the top level must be a JSON object")
    data = dict(data)
    for k, v in overrides.items():
        if v is not None:
            data[k] = v
    ignored: list[str] = []
    _check_keys(data, TOP_FIELDS + TASKS, TOP_NO_EFFECT, OTHER_TASKS, where, ignored)
    task = data.get("task", "statistics")
    if task not in TASKS:
        raise _fail(where, f"task {task!r} is not one we do; allowed: {', '.join(TASKS)}")
    level = data.get("level", "L1")
    if level not in LEVELS:
        extra = " (L2 kernel dumps are Ascend-only)" if level == "L2" else ""
        raise _fail(where, f"level {level!r} is not one we do{extra}; allowed: "
                           f"{', '.join(LEVELS)}")
    dump_path = data.get("dump_path", "./dump_path")
    if not isinstance(dump_path, (str, os.PathLike)) or not str(dump_path):
        raise _fail(where, f"dump_path must be a folder name, not {dump_path!r}")
    cfg = DebugConfig(task=task, level=level, dump_path=Path(dump_path))
    try:
        cfg.ranks = parse_ids(data.get("rank"), "rank")
        if data.get("schedule") is not None:
            if data.get("step"):
                raise UsageError("give either a step list or a schedule, not both")
            cfg.steps = (data["schedule"] if isinstance(data["schedule"], Schedule)
                         else _schedule(data["schedule"], where))
        else:
            step = data.get("step")
            cfg.steps = step if isinstance(step, Schedule) else parse_ids(step, "step")
    except UsageError as e:
        msg = str(e)
        raise (e if msg.startswith(where) else _fail(where, msg)) from None
    async_dump = data.get("async_dump", False)
    if not isinstance(async_dump, bool):
        raise _fail(where, f"async_dump must be true or false, not {async_dump!r}")
    cfg.async_dump = async_dump
    enable = data.get("dump_enable", True)
    if not isinstance(enable, bool):
        raise _fail(where, f"dump_enable must be true or false, not {enable!r:.40}")
    cfg.dump_enable = enable
    overwrite = data.get("overwrite", False)
    if not isinstance(overwrite, bool):
        raise _fail(where, f"overwrite must be true or false, not {overwrite!r:.40}")
    cfg.overwrite = overwrite
    section = data.get(task, {})
    if not isinstance(section, dict):
        raise _fail(where, f"{task} must be an object")
    _check_keys(section, TASK_FIELDS, TASK_NO_EFFECT, (), f"{where}: {task}", ignored)
    if section.get("scope"):
        raise _fail(where, f"{task}.scope (an interval between two names) is not supported; "
                           "name the modules or APIs to record in list instead")
    cfg.ops, cfg.modules = split_list(_str_list(section.get("list", []), "list", where), level,
                                      where)
    modes = tuple(_str_list(section.get("data_mode", ["all"]), "data_mode", where)) or ("all",)
    bad = [m for m in modes if m not in DATA_MODES]
    if bad:
        raise _fail(where, f"data_mode {bad[0]!r}; allowed: {', '.join(DATA_MODES)}")
    cfg.data_mode = modes
    summary = section.get("summary_mode", "statistics")
    if summary not in SUMMARY_MODES:
        raise _fail(where, f"summary_mode {summary!r}; allowed: {', '.join(SUMMARY_MODES)}")
    cfg.summary_mode = summary
    nums = section.get("overflow_nums", 1)
    if isinstance(nums, bool) or not isinstance(nums, int) or nums < -1 or nums == 0:
        raise _fail(where, f"overflow_nums {nums!r}; use a count >= 1, or -1 for all")
    cfg.overflow_nums = nums
    cfg.ignored = ignored
    return cfg


def load(path: str | os.PathLike[str], **overrides: Any) -> DebugConfig:
    """Read (configfile.read_json: size, depth, UTF-8 bounded) and check msprobe's
    config.json."""
    return build(read_json(path, "config"), f"config {Path(path)}", **overrides)
