"""Relaunching a run after a failure: what the trainer needs to continue where it stopped.

`orch up` retries a failed run under the same run id (`job.retries`); a job that is this
repository's trainer (`job.module: trainer`) then gets `--resume` when its rank 0 has written
`weights/last.pt`, so it continues from its last finished epoch instead of starting again (and
instead of refusing an `--out` that already holds a run). Where the trainer writes is derived here
exactly as `trainer/config.py` derives it: `--out`, else `--project`/`--name`, with `--name`
defaulting to the orch run id, which a retry keeps. Pure, but for `has_checkpoint`, which asks the
master node over its transport.
"""

from __future__ import annotations

import argparse
import posixpath

from ..config.inventory import Job
from ..config.nodes import Node
from ..config.trainer import DEFAULT_PROJECT, LAST
from ..transport import Transport

TRAINER = "trainer"


def is_trainer(job: Job) -> bool:
    """Is the job this repository's trainer (`python -m trainer`)?"""
    return job.script is None and job.module == TRAINER


def trainer_out_dir(job: Job, run_id: str) -> str:
    """The trainer's run directory on the nodes as its argv makes it: `--out`, else
    `--project`/`--name` (`--name` defaults to the run id, which orch passes as ORCH_RUN_ID);
    a relative path is relative to `job.workdir` (the job's cwd; the login's home without one)."""
    ns = _trainer_args(job.args)
    out = ns.out or posixpath.join(ns.project or DEFAULT_PROJECT, ns.name or run_id)
    if out.startswith("/") or out.startswith("~"):
        return out
    return posixpath.join(job.workdir or "~", out)


def checkpoint_path(job: Job, run_id: str) -> str:
    """Where the trainer's rank 0 keeps `last.pt` for this run."""
    return posixpath.join(trainer_out_dir(job, run_id), LAST)


def with_resume(args: tuple[str, ...]) -> tuple[str, ...]:
    """The job's args with a bare `--resume` (OUT/weights/last.pt) instead of any `--resume [PATH]`
    they had: a retry continues from the checkpoint this run wrote, not from the one it began with."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--resume":
            skip = i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        if arg.startswith("--resume="):
            continue
        out.append(arg)
    return (*out, "--resume")


def has_checkpoint(t: Transport, node: Node, path: str, timeout: float = 30.0) -> bool:
    """Does `path` (a leading `~` is the login's home there) exist as a file on the node?

    Raises:
        OrchError / TransportError: the node could not be asked (a retry then cannot know).
    """
    res = t.run([node.python, "-c", "import os,sys;print(os.path.isfile(os.path.expanduser(sys.argv[1])))", path],
                timeout=timeout).check()
    return res.stdout.strip().splitlines()[-1:] == ["True"]


def _trainer_args(args: tuple[str, ...]) -> argparse.Namespace:
    """The flags of the trainer's argv that place its run directory (the others are ignored)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--out", "--project", "--name"):
        p.add_argument(flag)
    ns, _rest = p.parse_known_args(list(args))
    return ns
