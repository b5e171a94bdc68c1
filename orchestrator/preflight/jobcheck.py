"""The job's own verdict on its arguments, asked on the nodes before anything is launched. Pure.

What the `job` check cannot guess from the outside it asks the job: for this repository's trainer
`python -m trainer --check ARGS` (trainer/check.py: the same parse, topology, inputs and run
directory a start checks, nothing trained or written, one JSON line back), for another module
whether `job.python` can import it from `job.workdir` (`python -m MODULE` would fail otherwise);
a `job.script` is a file the `job` check finds on every node. The probe runs the command (the
job's python, workdir and environment, plus the torchrun variables of the node's first rank) and
sends back what it printed; `read` turns that into a finding.

Where: on the master (rank 0 decides the run directory), and on every node when the job's
inputs are per-node copies (`job.sync` lists paths): a copy that differs is found where it is.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.plan import first_ranks, job_command, job_python, node_env, world_size
from ..node import script as node_script
from ..transport import transport_of

TIMEOUT_S = 90.0
"""How long the job's check may take (a cold `import torch, ultralytics` on a busy node is most of it)."""
TRAINER = "trainer"


def is_trainer(inv: Inventory) -> bool:
    return inv.job.script is None and inv.job.module == TRAINER


def kind(inv: Inventory) -> str | None:
    """`trainer`, `module`, or None (a script: its file is checked like the other job files)."""
    if inv.job.script is not None:
        return None
    return TRAINER if is_trainer(inv) else "module"


def node_local(inv: Inventory) -> bool:
    """Whether the job's inputs are copies on each node (job.sync lists paths) rather than one shared copy."""
    return bool(inv.job.sync) and not transport_of(inv).same_host


def checks_on(inv: Inventory, node: Node) -> bool:
    return kind(inv) is not None and (node.name == inv.master.name or node_local(inv))


def request(inv: Inventory, node: Node, run_id: str) -> dict[str, Any] | None:
    """What the probe of `node` runs (the arguments after the job's interpreter, which the probe
    runs as the job's environment does: `probe_args`' `job_python`; the extra environment; the
    working directory), or None.

    The extra environment is what torchrun and orch give the node's first rank (`RANK`,
    `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `ORCH_RUN_ID`, ...): never the inventory's `env`, whose
    values travel on the probe's stdin, not its command line."""
    k = kind(inv)
    if k is None or not checks_on(inv, node):
        return None
    node_rank, base = [n.name for n in inv.nodes].index(node.name), first_ranks(inv.nodes)[node.name]
    world = world_size(inv.nodes)
    env = {key: value for key, value in node_env(inv, node, node_rank, run_id).items() if key not in node.env}
    env.update(
        {
            "RANK": str(base),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(world),
            "GROUP_RANK": str(node_rank),
            "LOCAL_WORLD_SIZE": str(node.nproc_per_node),
            "GROUP_WORLD_SIZE": str(len(inv.nodes)),
            "MASTER_ADDR": inv.master.addr,
            "MASTER_PORT": str(inv.master_port),
        }
    )
    inner = (
        ["-m", TRAINER, "--check", *inv.job.args]
        if k == TRAINER
        else ["-c", node_script("findmodule"), str(inv.job.module)]
    )
    return {"kind": k, "inner": inner, "env": env, "cwd": inv.job.workdir, "timeout": TIMEOUT_S}


@dataclass(frozen=True)
class JobAnswer:
    """One node's answer, as a finding of the `job` check."""

    status: str
    detail: str
    hint: str = ""
    answer: Mapping[str, Any] | None = None
    """The trainer's JSON, when it answered."""

    @property
    def answered(self) -> bool:
        """The trainer gave its verdict (accepted or refused)."""
        return self.answer is not None


def _last_json(text: str, key: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and key in value:
                return value
    return None


def _last_words(err: str) -> str:
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def read(inv: Inventory, node: Node, raw: Mapping[str, Any] | None) -> JobAnswer | None:
    """The finding for what the probe brought back (None: the node was not asked)."""
    if not raw:
        return None
    k = raw.get("kind") or kind(inv)
    where = job_python(inv, node) + (f" in {inv.job.workdir}" if inv.job.workdir else "")
    if raw.get("error") and raw.get("rc") is None:
        what = (
            "the trainer's own check (python -m trainer --check)"
            if k == TRAINER
            else f"the import test of module {inv.job.module}"
        )
        return JobAnswer(
            "warn",
            f"{what}: {raw['error']}: not verified",
            "run it by hand on the node to see why it is slow: "
            + " ".join(
                job_command(
                    inv, node, ["-m", "trainer", "--check"] if k == TRAINER else ["-c", f"'import {inv.job.module}'"]
                )
            ),
        )
    if k == TRAINER:
        return _read_trainer(inv, node, raw, where)
    return _read_module(inv, raw, where)


def _read_trainer(inv: Inventory, node: Node, raw: Mapping[str, Any], where: str) -> JobAnswer:
    answer = _last_json(str(raw.get("out") or ""), "trainer_check")
    if answer is None:
        said = _last_words(str(raw.get("err") or ""))
        hint = (
            "install this repository's trainer in that environment on every node (the same venv at the same "
            "path): pip install -e '.[trainer]' from a checkout, see the README's Bring your own cluster"
        )
        return JobAnswer("fail", f"`python -m trainer` cannot start with {where}: {said}", hint)
    if answer.get("ok"):
        parts = [
            f"{answer.get('model')} {answer.get('task')}",
            f"{answer.get('classes')} classes",
            f"on {answer.get('device')}",
        ]
        if answer.get("out"):
            parts.append(("resumes " if answer.get("resume") is not None else "writes ") + str(answer["out"]))
        return JobAnswer(
            "ok",
            "the trainer accepts the arguments (python -m trainer --check: " + ", ".join(parts) + ")",
            answer=answer,
        )
    return JobAnswer(
        "fail",
        f"the trainer refuses the arguments: {answer.get('error')}",
        f"fix job.args in {inv.path}: a start would print this on every rank and exit 2 "
        "(python -m trainer --help lists every flag)",
        answer=answer,
    )


def _read_module(inv: Inventory, raw: Mapping[str, Any], where: str) -> JobAnswer:
    module = str(inv.job.module)
    answer = _last_json(str(raw.get("out") or ""), "found")
    if answer is None:
        return JobAnswer(
            "fail",
            f"{where} cannot run Python: {_last_words(str(raw.get('err') or ''))}",
            "fix job.python (the software check says more)",
        )
    if answer.get("found"):
        return JobAnswer("ok", f"module {module} is importable ({answer.get('origin')})")
    why = f": {answer['error']}" if answer.get("error") else f": No module named '{module}'"
    close = difflib.get_close_matches(module, [TRAINER], n=1, cutoff=0.7)
    hint = (f"did you mean module: {close[0]}? " if close else "") + (
        f"python -m {module} must work with that python in job.workdir: fix job.module, or install the module there"
    )
    return JobAnswer("fail", f"module {module} is not importable by {where}{why}", hint)
