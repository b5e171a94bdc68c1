"""`orch status` and `orch down` of a run that is already launched (attached or detached).

Both ask every node's agent now (never trust run.json alone), bring run.json up to date, and
return what they found for the CLI to show: a `StatusReport` (the contract's status JSON) and a
`DownReport`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..config.inventory import Inventory
from ..contract import FINAL_STATES, NodeState, RunState
from ..errors import OrchError
from ..store import NodeRecord, RunDir, RunStore, clock_offsets, recorded_nodes
from ..transport import Cluster, GroupResult, transport_of
from .agents import NodeStatus, StopResult, status_all, status_node, stop_all
from .cause import consequence
from .records import RunRecord, trusted_records
from .supervise import NodeSpec, Supervisor, blame, corrected, run_state


@dataclass(frozen=True)
class NodeReport:
    """One node's line of `orch status`."""

    node: str
    node_rank: int
    host: str | None
    state: str
    exit_code: int | None
    pid: int | None
    pgid: int | None
    uptime_s: float | None
    last_log: str | None
    """When the node's log was last written (UTC, ISO 8601)."""
    last_log_age_s: float | None
    agent_alive: bool | None
    error: str | None
    disk_full: str | None = None
    """The node's run root refused a write (`run_root DIR is full (...)`); None when it did not."""
    reason: str | None = None
    """The node agent's own word on why its job ended so (state.json `reason`: the lease's expiry,
    a job that could not start); None when it gave none."""

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StatusReport:
    """`orch status`: the run's state and every node's, with the first failure of a failed run."""

    run: str
    state: str
    nodes: list[NodeReport]
    first_failure: dict[str, Any] | None = None
    attempt: int = 1
    """Which launch of the run this is: 2, 3... after automatic retries (`job.retries`)."""
    max_attempts: int = 1
    replaced: dict[str, str] | None = None
    """Nodes a spare replaced on a retry ({node: spare})."""
    stragglers: list[dict[str, Any]] = field(default_factory=list)
    """The ranks the straggler detector of an attached `orch up` named (run.json `stragglers`)."""
    master_tail: tuple[str, ...] = ()
    """The last node.log lines of the node holding rank 0, asked now while it runs (not in the
    JSON: the CLI reads the trainer's progress from them, `logs.progress.run_progress`)."""
    reason: str | None = None
    """Why a stopped run stopped, as its nodes said it (run.json `reason`, `stopped_reason`)."""

    @property
    def master(self) -> str | None:
        """The node of node rank 0."""
        return next((n.node for n in self.nodes if n.node_rank == 0), None)

    def to_json(self) -> dict[str, Any]:
        """docs/CONTRACT.md's status JSON, with pid, uptime and last log time per node, and the attempt."""
        out: dict[str, Any] = {"run": self.run, "state": self.state, "nodes": [n.to_json() for n in self.nodes]}
        if self.first_failure:
            out["first_failure"] = self.first_failure
        out["attempt"], out["max_attempts"] = self.attempt, self.max_attempts
        if self.replaced:
            out["replaced"] = dict(self.replaced)
        out["stragglers"] = list(self.stragglers)
        out["reason"] = self.reason
        return out


@dataclass(frozen=True)
class DownReport:
    """`orch down`: what each node's agent stopped, or why a node could not be stopped."""

    run: str
    state: str
    results: GroupResult[StopResult]
    """Each node's stop (in node order), or why it could not be asked."""
    elapsed_s: float
    released: str | None = None
    """What held the run's nodes and was given back (the Slurm allocation orch made), else None."""

    @property
    def complete(self) -> bool:
        """Every node answered and nothing of the run is left running."""
        return not self.results.failed and not any(r.remaining for r in self.results.succeeded.values())


def _cluster_for(run: RunDir) -> tuple[Inventory, list[NodeRecord]]:
    data = run.read()
    inv = run.inventory()
    return inv, trusted_records(run, inv, recorded_nodes(data))


def offsets_s(run: RunDir, inv: Inventory) -> dict[str, float]:
    """The clock offsets (s) the run's preflight (else the last `orch check`) measured."""
    return {node: ms / 1000.0 for node, ms in clock_offsets(run, inv.name)[0].items()}


def status(run_id: str | None) -> StatusReport:
    """Per-node state of a run, asked of every node's agent now; run.json is brought up to date."""
    run = RunStore().get(run_id)
    inv, records = _cluster_for(run)
    with Cluster(inv) as cluster:
        answers = status_all(cluster, records)
        ok, failed = answers.succeeded, answers.failed
        statuses = {n: ok[n] if n in ok else NodeStatus(NodeState.UNREACHABLE, error=str(failed[n])) for n in answers}
        data = run.read()
        state = run_state(
            [s.state or NodeState.UNKNOWN for s in statuses.values()], data.get("state", RunState.STARTING)
        )
        fields: dict[str, Any] = {"state": state}
        why = stopped_reason(state, records, statuses)
        if why and not data.get("reason"):
            fields["reason"] = why  # the nodes stopped on their own (a killed controller's lease): why, in the record
        if state == RunState.FAILED and not data.get("first_failure"):
            # a detached run failed with nobody watching: name its first failure now
            fields["first_failure"] = detached_failure(cluster, records, statuses, offsets_s(run, inv))
        tail = _master_tail(cluster, records, statuses)
    RunRecord(run).update_nodes(ok, **fields)
    return replace(status_report(run.read(), statuses), master_tail=tail)


MASTER_TAIL = 400
"""How many of the rank-0 node's latest log lines `orch status` asks for (the trainer's progress)."""


def _master_tail(cluster: Cluster, records: list[NodeRecord], statuses: Mapping[str, NodeStatus]) -> tuple[str, ...]:
    """The rank-0 node's latest lines while it runs (one more agent call), else none."""
    master = next((r for r in records if r.node_rank == 0), None)
    if master is None or statuses.get(master.node, NodeStatus(NodeState.UNKNOWN)).state != NodeState.RUNNING:
        return ()
    try:
        return status_node(cluster[master.node], master.python, master.remote_dir, tail=MASTER_TAIL).tail
    except OrchError:
        return ()


def detached_failure(
    cluster: Cluster,
    records: list[NodeRecord],
    statuses: Mapping[str, NodeStatus],
    offsets: Mapping[str, float] | None = None,
) -> dict[str, Any] | None:
    """The earliest failed node of a run (on the reference clock), with its excerpt, judged after
    the fact."""
    specs = {r.node: NodeSpec(r.node, r.node_rank, r.base_rank or 0, r.nproc or 1) for r in records}
    failures = [
        f
        for n, s in statuses.items()
        if n in specs and s.state == NodeState.FAILED
        for f in [corrected(Supervisor.node_failure(specs[n], s), offsets or {})]
        if f is not None
    ]
    if not failures:
        return None
    first = min(failures, key=lambda f: f.order)

    def tail_of(node: str) -> list[str]:
        rec = next(r for r in records if r.node == node)
        try:
            return list(status_node(cluster[node], rec.python, rec.remote_dir, tail=200, nonce=rec.nonce).tail)
        except OrchError:
            return []

    tail = tail_of(first.node)
    first.explain(tail)
    if consequence(first.cause):  # a lost peer: the rank that raised is named instead
        logs = {first.node: tail, **{n: tail_of(n) for n in specs if n != first.node}}
        first = blame(first, logs, specs, offsets)
    return first.to_json()


def stopped_reason(state: str, records: list[NodeRecord], statuses: Mapping[str, NodeStatus]) -> str | None:
    """Why a stopped run stopped where its nodes said it themselves (state.json `reason`, e.g. the
    lease's expiry after its controller was killed): the first such node by node rank, named; None
    for another state, or nodes stopped without a word (`orch down`, Ctrl-C of `orch up`)."""
    if state != RunState.STOPPED:
        return None
    for r in sorted(records, key=lambda r: r.node_rank):
        s = statuses.get(r.node)
        if s is not None and s.state == NodeState.STOPPED and s.reason:
            return f"{r.node}: {s.reason}"
    return None


def status_report(data: Mapping[str, Any], statuses: Mapping[str, NodeStatus]) -> StatusReport:
    """run.json's nodes with what their agents just said (pid, uptime, last log time)."""
    nodes = []
    for r in recorded_nodes(data):
        s = statuses.get(r.node, NodeStatus(NodeState.UNKNOWN))
        now = s.now or time.time()
        started, finished = s.started_at or r.started_at, s.finished_at or r.finished_at
        uptime = None if not started else round((finished or now) - started, 1)
        nodes.append(
            NodeReport(
                node=r.node,
                node_rank=r.node_rank,
                host=r.host,
                state=s.state or r.state,
                exit_code=s.exit_code if r.node in statuses and s.exit_code is not None else r.exit_code,
                pid=s.pid or r.pid,
                pgid=s.pgid or r.pgid,
                uptime_s=uptime,
                last_log=_iso(s.log_mtime),
                last_log_age_s=None if not s.log_mtime else round(now - s.log_mtime, 1),
                agent_alive=s.agent_alive,
                error=s.error,
                disk_full=s.disk_full,
                reason=s.reason if r.node in statuses else _text(r.more.get("reason")),
            )
        )
    return StatusReport(
        data.get("run") or "",
        data.get("state") or RunState.STARTING,
        nodes,
        data.get("first_failure") or None,
        int(data.get("attempt") or 1),
        int(data.get("max_attempts") or 1),
        dict(data.get("replaced") or {}) or None,
        [s for s in data.get("stragglers") or [] if isinstance(s, dict)],
        reason=_text(data.get("reason")),
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _iso(ts: float | None) -> str | None:
    if not ts:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def down(run_id: str | None) -> DownReport:
    """Stop every process of a run on every node by its recorded process group; idempotent.

    The request is recorded first (run.json `down_requested`): an `orch up` supervising the run
    reads it, relaunches nothing (`job.retries` notwithstanding) and ends the run `stopped`."""
    run = RunStore().get(run_id)
    run.modify(lambda data: data.setdefault("down_requested", time.time()))
    inv, records = _cluster_for(run)
    t = time.monotonic()
    with Cluster(inv) as cluster:
        results = stop_all(cluster, records, inv.job.stop_grace_s)
    released = transport_of(inv).release(inv)  # the Slurm allocation orch made for the run
    done = results.succeeded
    after = {n: r.status for n, r in done.items() if r.status is not None}
    # a node that had already failed makes the run failed, whoever stopped the rest
    state = run_state([s.state for s in after.values() if s.state], run.read().get("state"))
    state = state if state in FINAL_STATES else RunState.STOPPED
    RunRecord(run).update_nodes(after, state=state)
    return DownReport(run.run_id, state, results, time.monotonic() - t, released)
