"""What the preflight guesses of a job's arguments without running it: which name files it reads
(checked on every node: absolute, present, the same content) and which name directories it
writes (they need only be creatable).
"""

from __future__ import annotations

import posixpath
from typing import Any

from ..config.inventory import Inventory
from ..config.trainer import (
    AUTO,
    INPUT_FLAGS,
    OUTPUT_FLAGS,
    file_setting,
    parse_device,
    setting_name,
    value_setting,
)

PATH_KEYS = (*INPUT_FLAGS, "hyp", "tracker")
"""Args whose value is a file the job reads: checked for an absolute path, existence, the same
content on every node. The trainer's own (`config/trainer.py`), and other launchers' usual keys."""
OUTPUT_KEYS = (
    *OUTPUT_FLAGS,
    "save_dir",
    "output",
    "output_dir",
    "log_dir",
    "logdir",
    "runs_dir",
    "checkpoint_dir",
    "ckpt_dir",
)
"""Args whose value is a folder the job writes: it need not exist yet, only be creatable."""


def raw_setting(inv: Inventory, name: str) -> Any:
    """The value `job.args` (the mapping) gives setting `name`: for the trainer by any of its
    spellings (`batch-size: 64` is the batch, `config/trainer.setting_name`), for another job by
    that key only. None when not given."""
    trainer = inv.job.script is None and inv.job.module == "trainer"
    for key, value in inv.job.raw_args.items():
        if not trainer:
            if key == name:
                return value
            continue
        found = setting_name(f"--{key}")
        if found is not None and value_setting(found, value) == name:
            return value
    return None


def is_output_key(key: str) -> bool:
    return key.replace("-", "_") in OUTPUT_KEYS


def path_args(inv: Inventory) -> dict[str, str]:
    """The job args that name files (PATH_KEYS, or any value that looks like a path)."""
    out = {}
    for key, value in inv.job.raw_args.items():
        if not isinstance(value, str) or not value:
            continue
        norm = key.replace("-", "_")
        if norm == "resume" and value == AUTO:  # the trainer's own rule, not a file
            continue
        if norm == "cfg" and not file_setting(norm, value):  # --cfg KEY=VALUE: a setting, not a file
            continue
        if norm in PATH_KEYS or value.startswith(("/", "~/", "./", "../")):
            out[key] = value
    return out


def job_files(inv: Inventory) -> dict[str, str]:
    """Every path the `job` check looks at on each node: the path-like args, `job.script`
    (a relative one under `job.workdir`, where torchrun starts it), and each `job.sync` entry (files by size
    and sha256, directories by existence),
    each path once."""
    out = path_args(inv)
    script = inv.job.script
    if script and not script.startswith(("/", "~/")) and inv.job.workdir:
        script = posixpath.join(inv.job.workdir, script)  # torchrun starts it from job.workdir
    extra = [("script", script)] if script and script.startswith(("/", "~/")) else []
    extra += [(f"sync[{i}]", p) for i, p in enumerate(inv.job.sync)]
    for key, path in extra:
        if path not in out.values() and key not in out:
            out[key] = path
    return out


def device_ids(inv: Inventory) -> tuple[int, ...] | None:
    """The GPU indices the job's `--device` (or `device=`) names, as the trainer reads them
    (`parse_device`); None when it names none (auto, cpu, cuda) or is not a device at all (the
    trainer's own check refuses that one)."""
    value = raw_setting(inv, "device")
    args = list(inv.job.args)
    if value is None:
        for i, arg in enumerate(args):
            if arg == "--device" and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(("--device=", "device=")):
                value = arg.split("=", 1)[1]
    if value is None:
        return None
    try:
        device = parse_device(value)
    except ValueError:
        return None
    return tuple(int(x) for x in device[5:].split(",")) if device.startswith("cuda:") else None
