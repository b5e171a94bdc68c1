"""What the preflight guesses of a job's arguments without running it: which name files it reads
(checked on every node: absolute, present, the same content) and which name directories it
writes (they need only be creatable).
"""

from __future__ import annotations

from ..config.inventory import Inventory
from ..config.trainer import AUTO, INPUT_FLAGS, OUTPUT_FLAGS

PATH_KEYS = (*INPUT_FLAGS, "hyp", "tracker")
"""Args whose value is a file the job reads: checked for an absolute path, existence, the same
content on every node. The trainer's own (`config/trainer.py`), and other launchers' usual keys."""
OUTPUT_KEYS = (*OUTPUT_FLAGS, "save_dir", "output", "output_dir", "log_dir", "logdir", "runs_dir",
               "checkpoint_dir", "ckpt_dir")
"""Args whose value is a folder the job writes: it need not exist yet, only be creatable."""


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
        if norm in PATH_KEYS or value.startswith(("/", "~/", "./", "../")):
            out[key] = value
    return out


def job_files(inv: Inventory) -> dict[str, str]:
    """Every path the `job` check looks at on each node: the path-like args, an absolute
    `job.script`, and each `job.sync` entry (files by size and sha256, directories by existence),
    each path once."""
    out = path_args(inv)
    extra = [("script", inv.job.script)] if inv.job.script and inv.job.script.startswith(("/", "~/")) else []
    extra += [(f"sync[{i}]", p) for i, p in enumerate(inv.job.sync)]
    for key, path in extra:
        if path not in out.values() and key not in out:
            out[key] = path
    return out
