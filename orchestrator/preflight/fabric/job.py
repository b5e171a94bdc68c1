"""The `fabric` check's facts: a short torchrun job across every node, launched like `orch up`.

The job (`orchestrator/node/jobs/allreduce.py`, torch + stdlib) is shipped by source into each node's
run directory with the node agent and started through `run/agents.py` (`start_all`, `status_all`,
`stop_all`) with a plan from `config/plan.py`: the same agents, process groups and teardown as a
training run, torchrun's argv and env built the same way (the inventory's `env`, `nproc_per_node`,
`torchrun_args`, rendezvous). Only the script and its arguments differ, plus, with NCCL,
`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` so the log says which transport NCCL picked.

`measure` returns `FabricFacts`: every node's final status and log (read back; the node's run
directory is then removed, unless the job failed somewhere: then it stays for a person), the job's result
(rank 0's `ORCH_FABRIC_RESULT` line), and what went wrong
(a node that could not start, an `ORCH_FABRIC_ERROR`, a job that overran `timeout_s`). It never
raises for a node; the judging is `judge.check_fabric`, a pure function of these facts.

The job runs as `fabric-<time>-<random>` under `job.run_root`, on `master.port`: the check tests
the port, the interfaces and the environment the training will use. A node that fails stops the
others at once (they would wait in a collective until its timeout); whatever is still running
when `measure` returns, for any reason, is stopped in `finally`.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...config.inventory import Inventory
from ...config.plan import RUN_DIR, Plan, make_plan
from ...contract import FINAL_STATES, NodeState
from ...node.jobs import allreduce as job
from ...run.agents import NodeStatus, collect_node, status_node, stop_all
from ...run.agents import start_all as start_all_nodes
from ...run.records import node_records
from ...run.supervise import sigint_shielded, sigterm_as_interrupt
from ...store import NodeRecord, remote_dir
from ...transport import Cluster, Transport
from ...transport.base import Progress
from ..shapes import read_fabric_result

FABRIC_OPT_IN = (
    "opt-in: it launches a short job on every node, so it runs only when asked: "
    "orch check --only fabric, checks.fabric: true in the inventory, or orch up --fabric"
)
JOB_FILE = "allreduce_job.py"
"""The job's name in each node's run directory (torchrun's script)."""
MB = 1 << 20
POLL_S = 0.5
"""The first status poll comes this soon after the start (a node that cannot run the job fails
within a second or two); each later one 1.5 x later, up to POLL_MAX_S: every poll is an SSH
command and a Python start on every node, which would take CPU from the measurement."""
POLL_MAX_S = 4.0
STOP_GRACE_S = 5.0
LOG_LIMIT = 8 << 20
"""At most this many bytes of each node's log are read back (the end of it)."""
NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}


def backend_for(inv: Inventory) -> str:
    """The backend the training will use: nccl when the nodes declare GPUs, gloo on CPU."""
    return "nccl" if any(n.gpus for n in inv.nodes) else "gloo"


def job_args(inv: Inventory, backend: str) -> tuple[str, ...]:
    """The job's arguments from `checks.fabric`: the backend, the sweep's sizes, the time limits,
    and the share below which the job measures a node's (or a link's) pairs again before reporting."""
    f = inv.checks.fabric
    return (
        "--backend",
        backend,
        "--min-bytes",
        str(min(MB, f.max_bytes)),
        "--max-bytes",
        str(f.max_bytes),
        "--budget-s",
        f"{f.budget_s:g}",
        "--timeout",
        f"{f.timeout_s:g}",
        "--recheck-share",
        f"{f.share:g}",
    )


def fabric_plan(inv: Inventory, run_id: str, backend: str) -> Plan:
    """The training's plan with the fabric job in place of the training: same nodes, ranks,
    torchrun flags and env (plus NCCL's debug output with NCCL); the job file in the node's run
    directory, which is also its working directory; no restarts."""
    fabric_job = replace(
        inv.job,
        module=None,
        script=f"{RUN_DIR}/{JOB_FILE}",
        args=job_args(inv, backend),
        raw_args={},
        max_restarts=0,
        workdir=None,
    )
    plan = make_plan(replace(inv, job=fabric_job), run_id, extra_env=NCCL_DEBUG_ENV if backend == "nccl" else {})
    nodes = tuple(replace(p, workdir=remote_dir(inv, p.node, run_id)) for p in plan.nodes)
    return replace(plan, nodes=nodes)


@dataclass
class FabricNode:
    """One node's share of the fabric job."""

    name: str
    remote_dir: str = ""
    """The check's run directory on the node; removed after a clean run, kept (with node.log)
    when anything went wrong there."""
    status: NodeStatus | None = None
    """The agent's last answer (None: the node never started or could not be asked)."""
    log: str = ""
    """node.log as read back: `<UTC time>Z <out|err|orch> <text>` lines (torchrun's, NCCL's, the job's)."""
    error: str | None = None
    """Why this node's share failed, as far as the controller can tell (start, exit, read back)."""

    def text(self) -> str:
        """The log without the agent's time and stream columns: what torchrun and the job printed
        (and the agent's own lines), as a person would quote it."""
        return "\n".join(job_line(line) for line in self.log.splitlines())


def job_line(line: str) -> str:
    """A node.log line (`<UTC time>Z <out|err|orch> <text>`) without its first two columns."""
    parts = line.split(" ", 2)
    if len(parts) == 3 and parts[0].endswith("Z") and parts[1] in ("out", "err", "orch"):
        return parts[2]
    return line


@dataclass
class FabricFacts:
    """What the fabric job measured, or why it did not."""

    backend: str
    run_id: str = ""
    nodes: dict[str, FabricNode] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    """Rank 0's ORCH_FABRIC_RESULT JSON (sweep, links, topology); None when the job failed."""
    not_run: str | None = None
    """Why the job was not started at all (then every other field is empty)."""
    timed_out: bool = False
    wall_s: float = 0.0
    """Start of the launch to the last node's end, controller clock."""
    steps_s: dict[str, float] = field(default_factory=dict)
    """Where the controller's time went: `start` (every agent running), `run` (to every node
    final), `stop` (teardown of what still ran), `read` (the logs read back)."""
    not_stopped: dict[str, str] = field(default_factory=dict)
    """Nodes whose stop could not be confirmed, with why (`orch down` cannot reach them either)."""

    @classmethod
    def skipped(cls, inv: Inventory, reason: str) -> FabricFacts:
        return cls(backend_for(inv), not_run=reason)

    def job_errors(self) -> dict[str, dict[str, Any]]:
        """Every ORCH_FABRIC_ERROR line, by node: {rank, host, node, phase, error}."""
        out: dict[str, dict[str, Any]] = {}
        for name, fn in self.nodes.items():
            for found in marked(fn.log, job.ERROR_MARKER):
                out.setdefault(name, found)
        return out


def marked(log: str, marker: str) -> list[dict[str, Any]]:
    """The JSON objects of every `MARKER {json}` line of a log, wherever the line's prefix ends
    (the agent's time and stream, torchrun's `[default0]:`)."""
    out = []
    for line in log.splitlines():
        at = line.find(marker + " {")
        if at < 0:
            continue
        try:
            value = json.loads(line[at + len(marker) + 1 :])
        except (ValueError, RecursionError):  # RecursionError: nested deeper than json can take
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def job_source() -> str:
    """The job file's text, as shipped to the nodes."""
    with open(job.__file__, encoding="utf-8") as fh:
        return fh.read()


def measure(inv: Inventory, cluster: Cluster, progress: Progress | None = None, poll_s: float = POLL_S) -> FabricFacts:
    """Run the fabric job on every node and collect what it says; see the module docstring."""
    backend = backend_for(inv)
    run_id = f"fabric-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    plan = fabric_plan(inv, run_id, backend)
    records = node_records(plan)
    facts = FabricFacts(backend, run_id, {r.node: FabricNode(r.node, r.remote_dir) for r in records})
    say = progress or (lambda label, done, total: None)
    start = time.monotonic()
    final: set[str] = set()
    with sigterm_as_interrupt():  # SIGTERM, like Ctrl-C, ends in the `finally` that stops the job
        _launch(inv, cluster, plan, records, facts, final, start, say, poll_s)
    t_read = time.monotonic()
    _read_back(cluster, plan, records, facts)
    facts.steps_s["read"] = time.monotonic() - t_read
    take_result(facts, plan.nodes[0].node.name)
    return facts


def _launch(
    inv: Inventory,
    cluster: Cluster,
    plan: Plan,
    records: list[NodeRecord],
    facts: FabricFacts,
    final: set[str],
    start: float,
    say: Progress,
    poll_s: float,
) -> None:
    """Start the job on every node and wait for it; whatever still runs is stopped in `finally`."""
    try:
        say("fabric: starting the job", 0, len(plan.nodes))
        started = start_all_nodes(cluster, plan, {JOB_FILE: job_source()})
        facts.steps_s["start"] = time.monotonic() - start
        for name, exc in started.failed.items():
            facts.nodes[name].error = f"could not start: {getattr(exc, 'message', None) or exc}"
            final.add(name)
        for name, status in started.succeeded.items():
            facts.nodes[name].status = status
        if not started.failed:
            _wait(inv, cluster, plan, records, facts, final, start, say, poll_s)
            facts.steps_s["run"] = time.monotonic() - start - facts.steps_s["start"]
    finally:
        t_stop = time.monotonic()
        running = [r for r in records if r.node not in final]
        if running:
            with sigint_shielded():
                stops = stop_all(cluster, running, STOP_GRACE_S)
            for name, exc in stops.failed.items():
                facts.not_stopped[name] = str(exc)
            for name, res in stops.succeeded.items():
                if res.remaining:
                    facts.not_stopped[name] = f"processes still running: {list(res.remaining)}"
                elif res.status is not None:
                    facts.nodes[name].status = res.status
        facts.wall_s = time.monotonic() - start
        if running:
            facts.steps_s["stop"] = time.monotonic() - t_stop


def take_result(facts: FabricFacts, first: str) -> None:
    """Rank 0's ORCH_FABRIC_RESULT from the log of its node (`first`), held to the shape orch's job
    writes: one that is not is no result, and an error of that node (its check fails there)."""
    node = facts.nodes[first]
    results = marked(node.log, job.MARKER)
    facts.result, problems = read_fabric_result(results[-1]) if results else (None, [])
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        node.error = (
            node.error or f"the fabric job's result is not what orch's job writes: {'; '.join(problems[:3])}{more}"
        )


def _wait(
    inv: Inventory,
    cluster: Cluster,
    plan: Plan,
    records: list[NodeRecord],
    facts: FabricFacts,
    final: set[str],
    start: float,
    say: Progress,
    poll_s: float,
) -> None:
    """Poll every agent until all are final, one fails (the others are then stopped by the
    caller) or `timeout_s` passes. The master's last lines carry the job's progress."""
    master = plan.nodes[0].node.name
    by_name = {r.node: r for r in records}
    deadline = start + inv.checks.fabric.timeout_s
    interval = poll_s
    while True:
        time.sleep(max(0.0, min(interval, deadline - time.monotonic() + 0.1)))
        interval = min(interval * 1.5, max(poll_s, POLL_MAX_S))

        def ask(t: Transport) -> NodeStatus:
            r = by_name[t.node.name]
            return status_node(t, r.python, r.remote_dir, tail=20 if t.node.name == master else 0, timeout=15)

        asked = cluster.fan_out(ask, [n for n in inv.nodes if n.name not in final])
        for name, status in asked.succeeded.items():
            facts.nodes[name].status = status
            if status.state in FINAL_STATES or status.state == NodeState.UNKNOWN:
                final.add(name)
                if status.state != NodeState.SUCCEEDED:
                    facts.nodes[name].error = _exit_reason(status)
            if name == master:
                for info in marked("\n".join(status.tail), job.PROGRESS_MARKER)[-1:]:
                    say(f"fabric: {_progress_label(info)}", *_progress_step(info))
        for name, exc in asked.failed.items():
            facts.nodes[name].error = f"could not ask its agent: {exc}"
        if len(final) == len(plan.nodes) or any(facts.nodes[n].error for n in facts.nodes):
            return
        if time.monotonic() > deadline:
            facts.timed_out = True
            for name in facts.nodes:
                if name not in final:
                    facts.nodes[name].error = (
                        f"still running after timeout_s {inv.checks.fabric.timeout_s:g} s "
                        "(hung, or too slow for the sizes asked)"
                    )
            return


def _exit_reason(status: NodeStatus) -> str:
    if status.state == NodeState.UNKNOWN:
        return f"its agent has no state: {status.error or 'unknown'}"
    how = f"signal {status.signal}" if status.signal else f"exit code {status.exit_code}"
    return f"the job {status.state} ({how})" + (f": {status.reason}" if status.reason else "")


def _progress_label(info: Mapping[str, Any]) -> str:
    if info.get("phase") == "sweep":
        return f"all_reduce of {info.get('size_bytes', 0) / MB:g} MiB"
    if info.get("phase") == "links" and info.get("recheck"):
        return f"node pairs again (the slow-looking ones), {info.get('step')} of {info.get('steps')}"
    if info.get("phase") == "links":
        return f"node pairs, pass {info.get('pass')}, round {info.get('round')} of {info.get('of')}"
    return str(info.get("phase", ""))


def _progress_step(info: Mapping[str, Any]) -> tuple[int, int]:
    """(done, total) of the job's current phase."""
    if info.get("phase") == "links":
        return int(info.get("step") or 0), int(info.get("steps") or 0)
    return int(info.get("step") or 0), int(info.get("of") or 0)


def _read_back(cluster: Cluster, plan: Plan, records: list[NodeRecord], facts: FabricFacts) -> None:
    """Every node's log; then the run directories go when the job ended well everywhere (after
    a failure they stay, node.log with them, for a person to read)."""
    by_name = {r.node: r for r in records}
    clean = not facts.timed_out and not facts.not_stopped and not any(fn.error for fn in facts.nodes.values())

    def read(t: Transport) -> str:
        r = by_name[t.node.name]
        return collect_node(t, r.python, r.remote_dir, plan.inventory.job.run_root, LOG_LIMIT, clean, r.nonce).log

    logs = cluster.fan_out(read, [p.node for p in plan.nodes])
    for name, text in logs.succeeded.items():
        facts.nodes[name].log = text
    for name, exc in logs.failed.items():
        facts.nodes[name].error = facts.nodes[name].error or f"could not read its log back: {exc}"
