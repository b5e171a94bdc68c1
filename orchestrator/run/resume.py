"""Relaunching a run after a failure: what the trainer needs to continue where it stopped.

`orch up` retries a failed run under the same run id (`job.retries`); a job that is this
repository's trainer (`job.module: trainer`) then gets `--resume auto`: the trainer continues
this run's own `weights/last.pt` when it wrote one, and otherwise starts the run over in the same
directory. Where that directory is (`--out`, `--project`/`--name` as flags or `key=value`, the
numbering of an existing name, the run id as the default name) is the trainer's rule alone
(`trainer/output.py`); orch keeps no copy of it. Pure.
"""

from __future__ import annotations

import re

from ..config.inventory import Job
from ..config.trainer import AUTO, PREEMPTED_EXIT

TRAINER = "trainer"

_SETTING = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def is_trainer(job: Job) -> bool:
    """Is the job this repository's trainer (`python -m trainer`)?"""
    return job.script is None and job.module == TRAINER


PREEMPTED_LINE = re.compile(r"\bpreempted \(SIGUSR2\): checkpoint ")
"""What a rank says once its preemption checkpoint is written (`trainer/preempt.py`)."""
PREEMPTED = re.compile(rf"\bexited with code {PREEMPTED_EXIT}\b|{PREEMPTED_LINE.pattern}")
"""What says a node's job ended because the trainer was preempted: its ranks' exit code (torchrun's
summary, `run/cause.py`'s line) or the trainer's own line."""


def preempted(cause: str | None, excerpt: list[str] | tuple[str, ...] = ()) -> bool:
    """Whether a failure is the trainer's preemption (`trainer/preempt.py`): a warning signal made it
    write its checkpoint and exit `PREEMPTED_EXIT`; `--resume auto` continues from there."""
    return any(PREEMPTED.search(text or "") for text in (cause, *excerpt))


def with_resume(args: tuple[str, ...]) -> tuple[str, ...]:
    """The job's args for a retry: `--resume auto` instead of a bare `--resume` (or `resume=True`,
    `--resume=`), so the trainer continues this run's own checkpoint, whatever its directory.

    An explicit checkpoint (`--resume PATH`, `resume=PATH`) stays as it is: the run trains in
    PATH's run directory, and `PATH/../last.pt` is then this run's own checkpoint too."""
    out: list[str] = []
    explicit = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--resume":
            value = args[i + 1] if i + 1 < len(args) else None
            if value is not None and not value.startswith("-") and not _SETTING.match(value):
                if value != AUTO:
                    explicit = True
                    out += [arg, value]
                i += 2
                continue
            i += 1
            continue
        if arg.startswith("--resume="):
            value = arg.split("=", 1)[1]
            if value not in ("", AUTO):
                explicit = True
                out.append(arg)
            i += 1
            continue
        if arg.startswith("resume="):
            value = arg.split("=", 1)[1]
            if value.lower() not in ("", "true", "false", "yes", "no", "1", "0", "on", "off", AUTO):
                explicit = True
                out.append(arg)
            i += 1
            continue
        out.append(arg)
        i += 1
    return tuple(out) if explicit else (*out, "--resume", AUTO)
