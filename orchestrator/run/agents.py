"""The node agent's client: ship it with a run, then start, ask and stop it on every node.

On each node the run lives in `store.remote_dir()` (`<job.run_root>/<run-id>/<node>/`): the agent
(`orchestrator/node/agent.py` and its modules, shipped with every run so nodes need not run the same orch
version), `launch.json` (argv, env, cwd: private, never on a command line), `node.log`,
`state.json`. What an agent says of its node is typed here: a `NodeStatus`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..config.plan import NodePlan, Plan
from ..contract import NodeState
from ..errors import AgentUnavailable, OrchError, TransportError
from ..node import AGENT_MODULES, FROM_STDIN, agent_files
from ..node import program as node_program
from ..node import script as node_script
from ..node.agent import HOOK_TIMEOUT_S
from ..store import NodeRecord, remote_dir
from ..transport import Cluster, GroupResult, Result, Transport

START_WAIT_S = 60.0
RECORDED = (
    "state",
    "exit_code",
    "pid",
    "pgid",
    "agent_pid",
    "started_at",
    "finished_at",
    "failed_at",
    "signal",
    "reason",
    "error",
    "cleanup_left",
)
"""The fields of a NodeStatus that run.json keeps for each node (`reason`: the agent's own word
on why its job ended so, e.g. the lease's expiry)."""


def _number(value: Any) -> Any:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _pids(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list):
        return None
    return tuple(int(p) for p in value if isinstance(p, int) and not isinstance(p, bool))


@dataclass(frozen=True)
class NodeStatus:
    """What a node's agent says of its share of a run: state.json, plus what only the node can
    tell (liveness, the log's size and time, its last lines). The answer of `agent.py start`,
    `agent.py status` and `stop`, and of the log reader's status frames."""

    state: NodeState | None
    """None where the node has no state.json yet (nothing started there, or not yet)."""
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    pid: int | None = None
    pgid: int | None = None
    agent_pid: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    failed_at: float | None = None
    """When torchrun first said one of its workers failed (the node's clock); None when it did not."""
    agent_alive: bool | None = None
    """None when not asked (a final state, or an answer that does not say)."""
    job_alive: bool | None = None
    now: float | None = None
    """The node's clock when it answered."""
    log_size: int | None = None
    log_mtime: float | None = None
    tail: tuple[str, ...] = ()
    error: str | None = None
    """Why the controller could not ask the agent (with state unreachable or unknown)."""
    cleanup_left: tuple[int, ...] | None = None
    """Processes of the job still there after the agent's cleanup timed out (a final state that
    left something running); None when the agent does not say."""
    disk_full: str | None = None
    """The node's run root refused a write (`run_root /... is full (...)`): the agent goes on, its
    log and state are not all written; None when it does not say."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeStatus:
        """The agent's JSON. A state this orch does not know reads as unknown; a field of the wrong
        type (what a node sends is not trusted) as not said."""
        raw = data.get("state")
        state = (
            None
            if raw is None
            else NodeState(raw)
            if isinstance(raw, str) and raw in set(NodeState)
            else NodeState.UNKNOWN
        )
        tail = data.get("tail")
        alive = {k: data.get(k) if isinstance(data.get(k), bool) else None for k in ("agent_alive", "job_alive")}
        return cls(
            state=state,
            exit_code=_number(data.get("exit_code")),
            signal=_text(data.get("signal")),
            reason=_text(data.get("reason")),
            pid=_number(data.get("pid")),
            pgid=_number(data.get("pgid")),
            agent_pid=_number(data.get("agent_pid")),
            started_at=_number(data.get("started_at")),
            finished_at=_number(data.get("finished_at")),
            failed_at=_number(data.get("failed_at")),
            now=_number(data.get("now")),
            log_size=_number(data.get("log_size")),
            log_mtime=_number(data.get("log_mtime")),
            tail=tuple(str(x) for x in tail) if isinstance(tail, list) else (),
            error=_text(data.get("error")),
            cleanup_left=_pids(data.get("cleanup_left")),
            disk_full=_text(data.get("disk_full")),
            **alive,
        )

    def recorded(self) -> dict[str, Any]:
        """The fields run.json keeps of it, where it says anything."""
        out = {k: getattr(self, k) for k in RECORDED if getattr(self, k) is not None}
        if "cleanup_left" in out:
            out["cleanup_left"] = list(out["cleanup_left"])
        return out

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["tail"] = list(self.tail)
        if self.cleanup_left is not None:
            out["cleanup_left"] = list(self.cleanup_left)
        return out


@dataclass(frozen=True)
class StopResult:
    """What `agent.py stop` saw on a node once it was done: the job's processes it found and are
    gone now, any still running, and the strangers under the recorded ids it left alone."""

    status: NodeStatus | None
    """state.json after the stop; None where nothing was ever started."""
    stopped: tuple[int, ...] = ()
    remaining: tuple[int, ...] = ()
    note: str | None = None
    strangers: tuple[int, ...] = ()
    """Processes that now hold a pid or process group the run recorded, but are not the job's
    (pid reuse): never signalled."""
    foreign: bool = False
    """The node's run directory holds another launch's run of this id (another controller's):
    left alone, nothing of it signalled (`note` says whose)."""
    containers: tuple[str, ...] = ()
    """Containers of this launch found on the node after the agent's stop (a killed agent's) and
    removed by label (run.json `sweep`)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StopResult:
        return cls(
            NodeStatus.from_json(data) if data.get("state") else None,
            tuple(int(p) for p in data.get("stopped") or ()),
            tuple(int(p) for p in data.get("remaining") or ()),
            _text(data.get("note")),
            tuple(int(p) for p in data.get("strangers") or ()),
            data.get("foreign") is True,
        )


# ----------------------------------------------------------------------------- one node


def launch_spec(plan: Plan, np_: NodePlan, lease_s: float | None = None) -> dict[str, Any]:
    """launch.json: everything the agent needs, so no env value ever appears on a command line.
    `lease_s` (an attached run): the agent stops the job when the controller has not renewed its
    lease for that long (see `node/agent.py` LEASE)."""
    spec = {
        "run": plan.run_id,
        "node": np_.node.name,
        "node_rank": np_.node_rank,
        "argv": list(np_.argv),
        "env": dict(np_.env),
        "cwd": np_.workdir,
        "grace": plan.inventory.job.stop_grace_s,
        "torchrun_log_dir": True,
        "telemetry_s": plan.inventory.job.telemetry_s,
        "stop_hook": list(np_.stop),
    }
    if plan.nonce:
        spec["nonce"] = plan.nonce
    if np_.environment is not None and np_.environment.warned:
        spec["warning_blocked"] = True  # a container under Slurm: node/agent.py WARNING, node/warned.py
    if lease_s:
        spec["lease_s"] = lease_s
    return spec


class UntrustedRunDir(OrchError):
    """The node's agent refused its run directory (`node/trust.py`: it, or a directory above it,
    can be changed by others): nothing there was read, written or started."""


def agent_call(t: Transport, python: str, rdir: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run `python agent.py ARGS` in the node's run directory and parse the JSON it prints.

    Raises:
        TransportError: the node could not be reached.
        AgentUnavailable: the agent could not run with that python (missing interpreter).
        OrchError: the agent failed otherwise (missing run directory...).
    """
    res = t.run([python, "agent.py", *args], cwd=rdir, timeout=timeout)
    return parse_agent(res, python)


def parse_agent(res: Result, python: str) -> dict[str, Any]:
    """The agent's JSON answer (its last line); a clear OrchError when the agent never ran."""
    line = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    try:
        data = json.loads(line) if line else None
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can take
        data = None
    if isinstance(data, dict):
        if data.get("untrusted"):
            raise UntrustedRunDir(
                f"{res.node}: {data.get('error')}",
                "a run directory (and every directory above it) must be writable by its owner only; "
                "or set job.run_root to a directory of your own",
            )
        return data
    err = res.stderr.strip().splitlines()
    detail = err[-1] if err else f"exit code {res.exit_code}, no output"
    if res.exit_code == 127 or "not found" in detail or "No such file" in detail:
        raise AgentUnavailable(res.node, python, detail)
    raise OrchError(f"{res.node}: the node agent failed: {detail}")


def boot_call(
    plan: Plan,
    np_: NodePlan,
    rdir: str,
    python: str,
    extra: Mapping[str, str] | None = None,
    lease_s: float | None = None,
    foreground: bool = False,
) -> tuple[list[str], bytes]:
    """How one node's share of a run starts: `node/boot.py` (argv), which writes the files sent on
    its stdin (the agent, launch.json: no env value is ever on a command line) into the run
    directory and runs `agent.py start` there. `extra` ({name: text}) are more files for the run
    directory (a job orch brings, like the fabric check's); `foreground`: the agent stays in that
    process (a transport that holds the agents, `Transport.agent_held`). `python`: the node's, which
    runs orch's node programs."""
    files = {**(extra or {}), **agent_files(), "launch.json": json.dumps(launch_spec(plan, np_, lease_s))}
    argv = [python, "-c", node_script("boot"), rdir, "start", ".", "--wait", str(START_WAIT_S)]
    return argv + (["--foreground"] if foreground else []), json.dumps(files).encode("ascii")


def started(res: Result, node: str, python: str) -> NodeStatus:
    """The agent's answer to its start on `node` (whose `python` ran it): the node's status once its
    job runs, else OrchError why."""
    state = parse_agent(res, python)
    if state.get("foreign"):
        raise OrchError(
            f"{node}: the job did not start: {state.get('reason')}; nothing of it was touched",
            "run ids are unique per controller only when orch picks them: pick another --run-id, or "
            "remove that directory once that run is over",
        )
    if res.exit_code != 0 or not state.get("pid"):
        raise OrchError(f"{node}: the job did not start: {state.get('reason') or state.get('state')}")
    return NodeStatus.from_json(state)


def start_node(
    t: Transport,
    plan: Plan,
    np_: NodePlan,
    rdir: str,
    extra: Mapping[str, str] | None = None,
    lease_s: float | None = None,
) -> NodeStatus:
    """Ship the agent and launch.json, start the job detached (one exec: `boot_call`); its status
    once it runs."""
    t.connect()
    python = np_.node.python
    argv, stdin = boot_call(plan, np_, rdir, python, extra, lease_s)
    return started(t.run(argv, stdin=stdin, timeout=START_WAIT_S + 30), np_.node.name, python)


FALLBACK_PYTHON = "python3"
"""What runs the agent where the run's own python no longer can: it needs only the standard library."""


def stop_node(t: Transport, python: str, rdir: str, grace: float, nonce: str | None = None) -> StopResult:
    """Stop one node's job (TERM, KILL after grace) and wait; idempotent.

    What it returns is what the agent saw once done, never an assumption: a node where the run
    never got as far as its run directory has nothing of it; where the run's python cannot start
    the agent any more, `python3` asks it; where neither can, the stop is not confirmed (OrchError).
    With the launch's `nonce`, a run directory another launch claimed is left alone (`foreign`).
    A node whose allocation has ended (TransportError `gone`: its scheduler ended every process of
    it) has nothing left to stop, and says so."""
    try:
        return _stop_node(t, python, rdir, grace, nonce)
    except TransportError as exc:
        if exc.kind != "gone":
            raise
        return StopResult(
            None, note=f"{exc.message.removeprefix(t.node.name + ': ')}: nothing of the run is left there"
        )


def _stop_node(t: Transport, python: str, rdir: str, grace: float, nonce: str | None = None) -> StopResult:
    args = ["stop", ".", "--grace", f"{grace:g}", *(["--nonce", nonce] if nonce else [])]
    try:
        # the agent's stop hook (a container's removal) may take up to its own bound after the grace
        return StopResult.from_json(agent_call(t, python, rdir, args, grace + 30 + HOOK_TIMEOUT_S))
    except TransportError:
        raise
    except OrchError as exc:
        if not t.run(["true"], cwd=rdir, timeout=30).ok:
            return StopResult(None, note="no run directory on this node: nothing of the run was started here")
        if isinstance(exc, AgentUnavailable) and python != FALLBACK_PYTHON:
            return _stop_node(t, FALLBACK_PYTHON, rdir, grace, nonce)
        raise


SWEEP_TIMEOUT_S = 200.0
"""What the node's sweep may take (the agent's listing and removal bounds, and the start)."""


def sweep_node(
    t: Transport, python: str, listing: Sequence[str], remove: Sequence[str], result: StopResult
) -> StopResult:
    """After the agent's stop: the launch's containers still on the node (`listing`, its
    environment's `Sweep`: by label, never another launch's), removed by their full IDs
    (`remove -- ID...`), both by the node's agent program (`agent.py sweep`, on stdin): it runs
    them without a login shell and removes only what the runtime listed as a whole 64-hex ID, so
    a login's output (a `.bashrc` printing another user's container) names nothing. A listing or
    removal that fails raises OrchError: the stop is then not confirmed."""
    from dataclasses import replace

    spec = json.dumps({"list": list(listing), "remove": list(remove)})
    try:
        data = _sweep(t, python, spec)
    except AgentUnavailable:
        if python == FALLBACK_PYTHON:
            raise
        data = _sweep(t, FALLBACK_PYTHON, spec)
    ids = tuple(str(i) for i in data.get("containers") or () if isinstance(i, str))
    if data.get("error"):
        raise OrchError(
            f"{t.node.name}: {data['error']}",
            f"run `{' '.join(listing)}` on the node, then `{' '.join(remove)} -- ID` for what it lists",
        )
    return replace(result, containers=ids)


def _sweep(t: Transport, python: str, spec: str) -> dict[str, Any]:
    res = t.run(
        [python, "-c", FROM_STDIN, "sweep", "--spec", spec],
        stdin=node_program("agent", AGENT_MODULES).encode("ascii"),
        timeout=SWEEP_TIMEOUT_S,
    )
    return parse_agent(res, python)


def status_node(
    t: Transport,
    python: str,
    rdir: str,
    tail: int = 0,
    timeout: float = 15,
    nonce: str | None = None,
    renew: bool = False,
) -> NodeStatus:
    """One node's state.json plus liveness; a missing run directory reads as state `unknown`, and
    so does (with `nonce`) one another launch claimed, its `error` saying whose. `renew`: the
    supervising `orch up` renews the run's lease with its poll."""
    args = ["status", ".", "--tail", str(tail), *(["--nonce", nonce] if nonce else []), *(["--renew"] if renew else [])]
    try:
        data = agent_call(t, python, rdir, args, timeout)
        if data.get("foreign"):
            return NodeStatus(NodeState.UNKNOWN, agent_alive=False, job_alive=False, error=_text(data.get("error")))
        return NodeStatus.from_json(data)
    except TransportError:
        raise
    except OrchError as exc:
        return NodeStatus(NodeState.UNKNOWN, agent_alive=False, job_alive=False, error=exc.message)


@dataclass(frozen=True)
class Collected:
    """What `agent.py collect` brought back: the tail of node.log, whether the run directory is gone."""

    log: str
    removed: bool = False
    kept: str | None = None
    """Why the run directory was asked to go and stayed (the agent's refusal: outside the run
    root, another launch's, its job still running)."""


def collect_node(
    t: Transport,
    python: str,
    rdir: str,
    root: str,
    limit: int,
    remove: bool,
    nonce: str | None = None,
    timeout: float = 60,
) -> Collected:
    """The last `limit` bytes of a node's log; with `remove`, then its run directory is removed by
    the agent, which checks it as it checks every run directory (trusted, `<root>/<run-id>/<node>`,
    this launch's, nothing of it running) before it removes anything."""
    args = [
        "collect",
        ".",
        "--root",
        root,
        "--limit",
        str(limit),
        *(["--remove"] if remove else []),
        *(["--nonce", nonce] if nonce else []),
    ]
    data = agent_call(t, python, rdir, args, timeout)
    kept = data.get("kept")
    return Collected(_text(data.get("log")) or "", bool(data.get("removed")), str(kept) if kept else None)


# ----------------------------------------------------------------------------- every node


def start_all(
    cluster: Cluster,
    plan: Plan,
    extra: Mapping[str, str] | None = None,
    lease_s: float | None = None,
    log_path: Path | None = None,
    detached: bool = False,
) -> GroupResult[NodeStatus]:
    """Start every node at once (`Cluster.launch`); every node's answer (its status, or why not) is
    collected. `extra`: more files for every node's run directory (see `boot_call`); `lease_s`: see
    `launch_spec`; `log_path`, `detached`: where a transport that holds the agents writes its
    launch's output, and whether that launch outlives this process."""
    held = cluster.kind.agent_held
    python = {p.node.name: p.node.python for p in plan.nodes}
    calls = {
        p.node.name: boot_call(
            plan, p, remote_dir(plan.inventory, p.node, plan.run_id), python[p.node.name], extra, lease_s, held
        )
        for p in plan.nodes
    }
    answers = cluster.launch(calls, timeout=START_WAIT_S + 30, log_path=log_path, detached=detached)
    out: dict[str, NodeStatus | Exception] = {}
    for name, res in answers.items():
        try:
            out[name] = res if isinstance(res, Exception) else started(res, name, python[name])
        except Exception as exc:  # collected, judged by the caller
            out[name] = exc
    return GroupResult(out)


def stop_all(cluster: Cluster, records: Sequence[NodeRecord], grace: float) -> GroupResult[StopResult]:
    """Stop every node in parallel (idempotent): every agent's answer, or why there is none. Each
    record's `nonce` (run.json) guards its stop: another launch's run of the same id is left alone,
    so a node whose start answer was lost is asked too, and stopped only if it is this launch's."""
    by_name = {r.node: r for r in records}
    nodes = [n for n in cluster.inv.nodes if n.name in by_name]

    def stop(t: Transport) -> StopResult:
        r = by_name[t.node.name]
        result = stop_node(t, r.python, r.remote_dir, grace, r.nonce)
        if not r.sweep or result.foreign:
            return result
        if not r.sweep_remove:  # a record not from node_records or trusted_records: never guess the removal
            raise OrchError(f"{t.node.name}: run.json lists the run's containers but not how to remove them")
        return sweep_node(t, r.python, r.sweep, r.sweep_remove, result)

    return cluster.fan_out(stop, nodes)


def status_all(cluster: Cluster, records: Sequence[NodeRecord], timeout: float = 15) -> GroupResult[NodeStatus]:
    """Every node's agent status in parallel, or why there is none."""
    by_name = {r.node: r for r in records}
    nodes = [n for n in cluster.inv.nodes if n.name in by_name]

    def ask(t: Transport) -> NodeStatus:
        r = by_name[t.node.name]
        return status_node(t, r.python, r.remote_dir, timeout=timeout, nonce=r.nonce)

    return cluster.fan_out(ask, nodes)
