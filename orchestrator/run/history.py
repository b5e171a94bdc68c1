"""`orch runs`: every run in `$ORCH_HOME`, newest first, from what run.json recorded (as
`sky status` lists clusters without asking them: `orch status RUN` asks the nodes).

Pure but for reading the store; `RunsReport` is the outcome the CLI renders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..contract import FINAL_STATES
from ..store import RunDir, RunStore, recorded_nodes, recorded_wall_s, recorded_world_size

DEFAULT_LIMIT = 20
"""How many runs `orch runs` lists without `--all` (`-n N` for another count)."""


@dataclass(frozen=True)
class RunSummary:
    """One line of `orch runs`: a run as its run.json last recorded it."""

    run: str
    inventory: str | None
    """The inventory's `name`."""
    state: str
    attempt: int
    max_attempts: int
    started: float | None
    """run.json `created` (epoch seconds)."""
    wall_s: float | None
    """The recorded wall time of a finished run (`store.recorded_wall_s`: also one whose controller
    was killed, once `orch status` recorded its nodes' ends); for one still running, the time since it started."""
    running: bool
    """Not in a final state as last recorded (`wall_s` then counts up to now)."""
    nodes: int
    procs: int
    """Processes (ranks) in all: the world size."""
    procs_per_node: list[int]
    failure: str | None
    """The first failure in a few words: its cause when known, else node, rank and exit code."""
    reason: str | None = None
    """Why a stopped run stopped, as its nodes said it (run.json `reason`: a lease that ran out)."""
    slurm_job: str | None = None
    """The Slurm job id of the allocation the run ran in (run.json `slurm.job_id`), else None."""

    @property
    def shape(self) -> str:
        """`4×8` (nodes × processes per node), `3 nodes, 20 procs` when nodes differ, `-` when unknown."""
        if not self.nodes:
            return "-"
        if len(set(self.procs_per_node)) == 1:
            return f"{self.nodes}×{self.procs_per_node[0]}"
        return f"{self.nodes} nodes, {self.procs} procs"

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "inventory": self.inventory,
            "state": self.state,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "started": self.started,
            "wall_s": self.wall_s,
            "running": self.running,
            "nodes": self.nodes,
            "procs": self.procs,
            "procs_per_node": list(self.procs_per_node),
            "failure": self.failure,
            "reason": self.reason,
            "slurm_job": self.slurm_job,
        }


@dataclass(frozen=True)
class RunsReport:
    """The runs `orch runs` shows (newest first) and how many older ones it left out."""

    home: str
    runs: list[RunSummary]
    left_out: int

    def to_json(self) -> dict[str, Any]:
        return {"home": self.home, "runs": [r.to_json() for r in self.runs], "left_out": self.left_out}


def failure_words(first: Any, limit: int = 60) -> str | None:
    """run.json `first_failure` in a few words: `node2 rank 3: CUDA out of memory` (its `cause`
    when the failure has one), else `node2 rank 3: exit 1`."""
    if not isinstance(first, dict):
        return None
    where = str(first.get("node") or "?")
    if first.get("rank") is not None:
        where += f" rank {first['rank']}"
    cause = first.get("cause") or first.get("reason")
    if not cause and first.get("exit_code") is not None:
        cause = f"exit {first['exit_code']}"
    text = f"{where}: {' '.join(str(cause).split())}" if cause else where
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summarize(run: RunDir, now: float | None = None) -> RunSummary:
    """A run as its run.json says (a broken or missing run.json: state `unknown`)."""
    try:
        data = run.read()
    except (OSError, ValueError):
        data = {}
    now = time.time() if now is None else now
    state = str(data.get("state") or "unknown")
    running = state not in {str(s) for s in FINAL_STATES} and state != "unknown"
    created = _number(data.get("created"))
    wall = None if running else recorded_wall_s(data)
    if running and created is not None:
        wall = max(0.0, now - created)
    nodes = recorded_nodes(data)
    per_node = [n.nproc_per_node for n in nodes]
    attempt = int(_number(data.get("attempt")) or 1)
    return RunSummary(
        run=run.run_id,
        inventory=data.get("name"),
        state=state,
        attempt=attempt,
        max_attempts=int(_number(data.get("max_attempts")) or attempt),
        started=created,
        wall_s=None if wall is None else round(wall, 1),
        running=running,
        nodes=len(nodes),
        procs=recorded_world_size(data) or 0,
        procs_per_node=per_node,
        failure=failure_words(data.get("first_failure")),
        reason=data.get("reason") if isinstance(data.get("reason"), str) else None,
        slurm_job=_slurm_job(data.get("slurm")),
    )


def _slurm_job(record: Any) -> str | None:
    job = record.get("job_id") if isinstance(record, dict) else None
    return str(job) if isinstance(job, (str, int)) and not isinstance(job, bool) else None


def list_runs(limit: int | None = DEFAULT_LIMIT, store: RunStore | None = None, now: float | None = None) -> RunsReport:
    """The newest `limit` runs (every run with None), newest first."""
    store = store or RunStore()
    runs = list(store.runs())[::-1]
    shown = runs if limit is None else runs[:limit]
    return RunsReport(str(store.root.parent), [summarize(r, now) for r in shown], len(runs) - len(shown))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
