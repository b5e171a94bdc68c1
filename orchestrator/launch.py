"""`orch up`, `orch status`, `orch down`: start the plan on every node under the node agent,
supervise it, and stop it by the process groups the agents recorded.

On each node the run lives in `runs.remote_dir()` (`<job.run_root>/<run-id>/<node>/`): the agent
(`orchestrator/node/agent.py`, shipped with every run so nodes need not run the same orch version),
`launch.json` (argv, env, cwd: private, never on a command line), `node.log`, `state.json`.
On the controller, `$ORCH_HOME/runs/<run-id>/` keeps the inventory snapshot, `plan.json`,
`check.json`, `run.json` (run and per-node state) and the merged log.

An attached `orch up` supervises through the log streams: each node's log reader also pushes
the node's status when it changes, so a healthy run costs no SSH exec after the start. A node
whose stream has been silent for `ORCH_STREAM_SILENT_S` (a stream not yet up: for half the
unreachable grace) is polled with `agent.py status` until it is heard from again.

Tunables for supervision (environment, seconds): `ORCH_POLL_INTERVAL_S` (default 1: the status
poll of a silent node), `ORCH_STREAM_SILENT_S` (default 3), `ORCH_UNREACHABLE_GRACE_S` (default
10: a node silent that long fails the run).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .cli import ui
from .config.inventory import Inventory
from .config.plan import NodePlan, Plan, make_plan
from .contract import FINAL_STATES, NodeState, RunState
from .errors import OrchError, TransportError
from .node import script as node_script
from .node import source as node_source
from .preflight.report import save_to_run
from .store import (
    RunDir,
    RunStore,
    clock_offsets,
    remote_dir,
)
from .supervise import (
    NodeSpec,
    Outcome,
    Pushed,
    Supervisor,
    corrected,
    run_state,
    select_excerpt,
    sigint_shielded,
)
from .transport import Cluster, GroupResult, Result, Transport

START_WAIT_S = 60.0


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, else the default."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


# ----------------------------------------------------------------------------- node-side commands


def launch_spec(plan: Plan, np_: NodePlan) -> dict[str, Any]:
    """launch.json: everything the agent needs, so no env value ever appears on a command line."""
    return {"run": plan.run_id, "node": np_.node.name, "node_rank": np_.node_rank,
            "argv": list(np_.argv), "env": dict(np_.env), "cwd": np_.workdir,
            "grace": plan.inventory.job.stop_grace_s, "torchrun_log_dir": True}


def agent_call(t: Transport, python: str, rdir: str, args: list[str], timeout: float) -> dict[str, Any]:
    """Run `python agent.py ARGS` in the node's run directory and parse the JSON it prints.

    Raises:
        TransportError: the node could not be reached.
        OrchError: the agent could not run (missing python, missing run directory...).
    """
    res = t.run([python, "agent.py", *args], cwd=rdir, timeout=timeout)
    return parse_agent(res, python)


def parse_agent(res: Result, python: str) -> dict[str, Any]:
    """The agent's JSON answer; a clear OrchError when the agent never ran."""
    line = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    try:
        data = json.loads(line) if line else None
    except ValueError:
        data = None
    if isinstance(data, dict):
        data["_exit"] = res.exit_code
        return data
    err = res.stderr.strip().splitlines()
    detail = err[-1] if err else f"exit code {res.exit_code}, no output"
    if res.exit_code == 127 or "not found" in detail or "No such file" in detail:
        raise OrchError(f"{res.node}: cannot run the node agent with python {python!r}: {detail}",
                        "set job.python (or the node's python:) to an interpreter that exists on that node")
    raise OrchError(f"{res.node}: the node agent failed: {detail}")


def start_node(t: Transport, plan: Plan, np_: NodePlan, rdir: str) -> dict[str, Any]:
    """Ship the agent and launch.json, start the job detached; return state.json once it runs.

    One SSH exec: `node/boot.py` writes both files (sent on stdin, so no env value is ever on a
    command line) and runs `agent.py start` in the run directory."""
    t.connect()
    files = {"agent.py": node_source("agent"), "launch.json": json.dumps(launch_spec(plan, np_))}
    python = np_.node.python
    res = t.run([python, "-c", node_script("boot"), rdir, "start", ".", "--wait", str(START_WAIT_S)],
                stdin=json.dumps(files).encode("ascii"), timeout=START_WAIT_S + 30)
    state = parse_agent(res, python)
    if state.get("_exit") != 0 or not state.get("pid"):
        raise OrchError(f"{np_.node.name}: the job did not start: {state.get('reason') or state.get('state')}")
    return state


def stop_node(t: Transport, python: str, rdir: str, grace: float) -> dict[str, Any]:
    """Stop one node's job (TERM, KILL after grace) and wait; idempotent.

    A node where the run never got as far as its run directory, or whose python cannot start the
    agent (so it never started the job either), has nothing to stop."""
    try:
        return agent_call(t, python, rdir, ["stop", ".", "--grace", f"{grace:g}"], grace + 30)
    except TransportError:
        raise
    except OrchError as exc:
        if not t.run(["true"], cwd=rdir, timeout=30).ok:
            return {"state": None, "stopped": [], "remaining": [], "note": "no run directory on this node"}
        if "cannot run the node agent" in exc.message:
            return {"state": None, "stopped": [], "remaining": [], "note": exc.message}
        raise


def status_node(t: Transport, python: str, rdir: str, tail: int = 0, timeout: float = 15) -> dict[str, Any]:
    """One node's state.json plus liveness; a missing run directory reads as state `unknown`."""
    try:
        return agent_call(t, python, rdir, ["status", ".", "--tail", str(tail)], timeout)
    except TransportError:
        raise
    except OrchError as exc:
        return {"state": NodeState.UNKNOWN, "agent_alive": False, "job_alive": False, "error": exc.message}


# ----------------------------------------------------------------------------- run records


def node_records(plan: Plan) -> list[dict[str, Any]]:
    """run.json `nodes`: where each node's run lives and how to reach its agent later."""
    inv = plan.inventory
    return [{"node": p.node.name, "host": p.node.host, "addr": p.node.addr, "node_rank": p.node_rank,
             "base_rank": p.global_ranks.start, "nproc": p.node.nproc_per_node,
             "remote_dir": remote_dir(inv, p.node, plan.run_id), "python": p.node.python,
             "state": NodeState.PENDING, "exit_code": None, "pid": None, "pgid": None,
             "started_at": None, "finished_at": None} for p in plan.nodes]


def merge_status(record: dict[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """A run.json node record updated with what the node's agent reported."""
    out = dict(record)
    for key in ("state", "exit_code", "pid", "pgid", "agent_pid", "started_at", "finished_at", "signal", "error"):
        if key in status:
            out[key] = status[key]
    return out


class RunRecord:
    """run.json updates from several threads (poller callbacks, teardown), serialized."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.lock = threading.Lock()

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.run.read().get("nodes") or [])

    def update_nodes(self, statuses: Mapping[str, Mapping[str, Any]], **fields: Any) -> None:
        with self.lock:
            data = self.run.read()
            data["nodes"] = [merge_status(r, statuses[r["node"]]) if r["node"] in statuses else r
                             for r in data.get("nodes") or []]
            data.update(fields)
            self.run.write(data)


# ----------------------------------------------------------------------------- fan-out


def start_all(cluster: Cluster, plan: Plan) -> GroupResult[dict[str, Any]]:
    """Start every node in parallel; every node's answer (state or exception) is collected."""
    rdirs = {p.node.name: remote_dir(plan.inventory, p.node, plan.run_id) for p in plan.nodes}
    return cluster.fan_out(lambda t: start_node(t, plan, plan.for_node(t.node.name), rdirs[t.node.name]))


def stop_all(cluster: Cluster, records: list[dict[str, Any]], grace: float) -> GroupResult[dict[str, Any]]:
    """Stop every node in parallel (idempotent): every agent's answer, or why there is none."""
    by_name = {r["node"]: r for r in records}
    nodes = [n for n in cluster.inv.nodes if n.name in by_name]
    return cluster.fan_out(lambda t: stop_node(t, by_name[t.node.name]["python"],
                                               by_name[t.node.name]["remote_dir"], grace), nodes)


def status_all(cluster: Cluster, records: list[dict[str, Any]], timeout: float = 15) -> GroupResult[dict[str, Any]]:
    """Every node's agent status in parallel, or why there is none."""
    by_name = {r["node"]: r for r in records}
    nodes = [n for n in cluster.inv.nodes if n.name in by_name]
    return cluster.fan_out(lambda t: status_node(t, by_name[t.node.name]["python"],
                                                 by_name[t.node.name]["remote_dir"], timeout=timeout), nodes)


# ----------------------------------------------------------------------------- preflight


def preflight(inv: Inventory, con: Console) -> tuple[int, Any]:
    """Run the checks; (3, report) when any fails, (0, report) otherwise."""
    from .cli.render import check_table
    from .preflight.report import run_preflight

    report = run_preflight(inv)
    warnings = [r for r in report.results if r.status == "warn"]
    if not report.ok or warnings:
        check_table(report, con)
    if not report.ok:
        con.print("[bold red]preflight failed: nothing was launched[/] (fix the failures above, "
                  "or pass --skip-checks to launch anyway)")
        return 3, report
    return 0, report


# ----------------------------------------------------------------------------- orch up


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM to `orch up` tears the run down like Ctrl-C does (a scheduler's kill, a CI timeout)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def up_command(inv: Inventory, *, detach: bool = False, skip_checks: bool = False,
               run_id: str | None = None, verbose: bool = False) -> int:
    """Check, launch on every node, then supervise (or return, with --detach). Returns the exit code."""
    con = ui.console()
    t0 = time.monotonic()
    report = None
    if not skip_checks:
        code, report = preflight(inv, con)
        if code:
            return code
        con.print(f"preflight passed in {time.monotonic() - t0:.1f} s")
    t_launch = time.monotonic()
    run = RunStore().create(inv, run_id)
    plan = make_plan(inv, run.run_id)
    run.write(plan.to_json(), "plan.json")
    save_to_run(run, inv, report)
    record = RunRecord(run)
    run.update(nodes=node_records(plan), state=RunState.STARTING)
    con.print(f"run [bold]{run.run_id}[/]: starting {len(plan.nodes)} nodes × {plan.nodes[0].node.nproc_per_node} "
              f"processes (world size {plan.world_size}, master {plan.master_addr}:{plan.master_port})")
    with Cluster(inv) as cluster, sigterm_as_interrupt():
        try:
            return launch_and_supervise(con, run, record, plan, cluster, detach, t0, t_launch)
        except KeyboardInterrupt:
            with sigint_shielded():
                stop_all(cluster, record.nodes(), inv.job.stop_grace_s)
            record.update_nodes({}, state=RunState.STOPPED)
            con.print("interrupted: every node stopped")
            return 130


def launch_and_supervise(con: Console, run: RunDir, record: RunRecord, plan: Plan, cluster: Cluster,
                         detach: bool, t0: float, t_launch: float) -> int:
    """Start every node; stop them all if one cannot start; then return (detach) or supervise."""
    inv = plan.inventory
    started = start_all(cluster, plan)
    record.update_nodes(started.succeeded)
    if started.failed:
        return start_failed(con, cluster, record, started.failed, inv)
    startup_s = time.monotonic() - t_launch
    record.update_nodes({}, state=RunState.RUNNING, startup_s=round(startup_s, 3))
    con.print(f"all {len(plan.nodes)} nodes running after {startup_s:.1f} s")
    if detach:
        con.print(f"detached. Follow: orch logs --follow {run.run_id} · state: orch status {run.run_id} "
                  f"· stop: orch down {run.run_id}")
        return 0
    return attached(con, run, record, plan, cluster, t0)


def start_failed(con: Console, cluster: Cluster, record: RunRecord, failed: Mapping[str, Exception],
                 inv: Inventory) -> int:
    """Some node could not start: stop the ones that did, say why, exit 1."""
    for name, exc in failed.items():
        msg = exc.message if isinstance(exc, OrchError) else f"{type(exc).__name__}: {exc}"
        con.print(f"[bold red]{escape(name)}: could not start[/]: {escape(msg)}")
        hint = getattr(exc, "hint", None)
        if hint:
            con.print(f"  hint: {escape(hint)}")
    t = time.monotonic()
    results = stop_all(cluster, record.nodes(), inv.job.stop_grace_s)
    failed, done = results.failed, results.succeeded
    left = [n for n in results if n in failed or done[n].get("remaining")]
    record.update_nodes(results.succeeded, state=RunState.FAILED,
                        start_failures={n: str(e) for n, e in failed.items()})
    con.print(f"stopped every node that had started ({time.monotonic() - t:.1f} s); nothing was left running"
              if not left else f"[bold red]could not confirm the stop on: {', '.join(left)}[/] (run: orch down "
              f"{record.run.run_id})")
    return 1


def attached(con: Console, run: RunDir, record: RunRecord, plan: Plan, cluster: Cluster, t0: float) -> int:
    """Stream the merged log and supervise until the run ends; print its outcome."""
    inv = plan.inventory
    records = record.nodes()
    by_name = {r["node"]: r for r in records}
    interval = env_seconds("ORCH_POLL_INTERVAL_S", 1.0)
    grace = env_seconds("ORCH_UNREACHABLE_GRACE_S", 10.0)
    silent_after = min(env_seconds("ORCH_STREAM_SILENT_S", 3.0), grace / 2)

    def poll_one(name: str) -> dict[str, Any]:
        r = by_name[name]
        # a loaded node answers slowly; only `grace` without an answer makes it unreachable
        return status_node(cluster[name], r["python"], r["remote_dir"], timeout=grace)

    def excerpt(name: str) -> list[str]:
        r = by_name[name]
        return list(status_node(cluster[name], r["python"], r["remote_dir"], tail=200).get("tail") or [])

    pushed = Pushed([p.node.name for p in plan.nodes], poll_one, silent_after=silent_after,
                    first_frame_s=grace / 2, interval=interval, stale_after=grace / 2)
    sup = Supervisor([NodeSpec(p.node.name, p.node_rank, p.global_ranks.start, p.node.nproc_per_node)
                      for p in plan.nodes],
                     observe=pushed.observe,
                     stop_all=lambda: stop_all(cluster, records, inv.job.stop_grace_s),
                     excerpt=excerpt, confirm=lambda names: status_all(cluster, [r for r in records if r["node"] in names], timeout=3.0),
                     interval=min(interval, 0.5), unreachable_grace=grace, sleep=pushed.wait,
                     on_update=lambda nodes: record.update_nodes(nodes), offsets_s=offsets_s(run, inv))
    stop_logs = threading.Event()
    logs = threading.Thread(target=stream_logs, args=(run, inv, cluster, stop_logs, pushed), daemon=True,
                            name="logs")
    logs.start()
    pushed.start()
    outcome: Outcome | None = None
    try:
        outcome = sup.run()
    except KeyboardInterrupt:
        pass
    finally:
        pushed.close(wait=5.0)
        # every node is final now: the follower drains the last lines and its node-side readers
        # exit on their own (closing them early would leave them to die later, on a broken pipe);
        # a node teardown could not reach will never be final, so do not wait long for it
        logs.join(timeout=2.0 if sup.not_stopped else 10.0)
        stop_logs.set()
        logs.join(timeout=2.0)
    wall = time.monotonic() - t0
    if outcome is None:
        record.update_nodes(dict(sup.nodes), state=RunState.STOPPED, wall_s=round(wall, 3),
                            teardown_s=sup.teardown_s)
        con.print(f"interrupted: stopped every node in {sup.teardown_s or 0:.1f} s" if not sup.not_stopped
                  else f"[bold red]interrupted; could not confirm the stop on {', '.join(sup.not_stopped)}[/]")
        return 130
    return report_outcome(con, record, outcome, sup, wall)


def report_outcome(con: Console, record: RunRecord, outcome: Outcome, sup: Supervisor, wall: float) -> int:
    """Record the end in run.json and tell the user: wall time, or the first failure."""
    fields: dict[str, Any] = {"state": outcome.state, "wall_s": round(wall, 3), "teardown_s": outcome.teardown_s}
    if outcome.failure is not None:
        fields["first_failure"] = outcome.failure.to_json()
    record.update_nodes(dict(sup.nodes), **fields)
    if outcome.state == RunState.SUCCEEDED:
        con.print(f"[green]run {record.run.run_id} succeeded on every node[/] in {wall:.1f} s")
        return 0
    f = outcome.failure
    assert f is not None
    rank = f"rank {f.rank}" if f.rank is not None else "rank unknown"
    con.print(f"\n[bold red]run {record.run.run_id} failed[/]: first failure on [bold]{escape(f.node)}[/] "
              f"(node rank {f.node_rank}, {rank}, exit code {f.exit_code}): {escape(f.reason)}")
    for line in f.excerpt:
        con.print(f"  {escape(line)}", soft_wrap=True)
    stopped = f"stopped every other node in {outcome.teardown_s or 0:.1f} s"
    con.print(stopped if not outcome.not_stopped else
              f"[bold red]could not confirm the stop on {', '.join(outcome.not_stopped)}[/]: run "
              f"`orch down {record.run.run_id}` once they are reachable")
    return 1


# ----------------------------------------------------------------------------- log streaming


def stream_logs(run: RunDir, inv: Inventory, cluster: Cluster, stop: threading.Event,
                pushed: Pushed | None = None) -> None:
    """Print the merged log (host and rank on every line) until the run ends or `stop` is set;
    the node status the streams carry goes to `pushed` (the supervisor's observations)."""
    import sys

    from .logs.follow import Follower
    from .logs.lines import column_widths, format_line

    color = ui.color_enabled(sys.stdout)
    con = ui.console()
    nodes = [n.name for n in inv.nodes]
    width, rank_width = column_widths(nodes, sum(n.nproc_per_node for n in inv.nodes))

    def event(node: str, msg: str) -> None:
        con.print(f"[dim]{escape(node)}: {escape(msg)}[/]")

    try:
        offsets, _origin = clock_offsets(run, inv.name)
        follower = Follower(run, inv, cluster, offsets_ms=offsets, on_event=event,
                            on_status=None if pushed is None else pushed.status,
                            on_frame=None if pushed is None else pushed.frame)
        for line in follower.lines(stop):
            sys.stdout.write(format_line(line, color, node_width=width, rank_width=rank_width) + "\n")
            sys.stdout.flush()
    except Exception as exc:  # log streaming must never take supervision down with it
        con.print(f"[yellow]log streaming stopped: {escape(str(exc))}[/]")


# ----------------------------------------------------------------------------- orch status / down


def _cluster_for(run: RunDir) -> tuple[Inventory, list[dict[str, Any]]]:
    data = run.read()
    return run.inventory(), list(data.get("nodes") or [])


def status_command(run_id: str | None, *, as_json: bool = False) -> int:
    """Per-node state of a run, asked of every node's agent now; run.json is brought up to date."""
    run = RunStore().get(run_id)
    inv, records = _cluster_for(run)
    with Cluster(inv) as cluster:
        answers = status_all(cluster, records)
        ok, failed = answers.succeeded, answers.failed
        statuses = {n: dict(ok[n]) if n in ok else {"state": NodeState.UNREACHABLE, "error": str(failed[n])}
                    for n in answers}
        data = run.read()
        state = run_state([s.get("state", NodeState.UNKNOWN) for s in statuses.values()], data.get("state", RunState.STARTING))
        fields: dict[str, Any] = {"state": state}
        if state == RunState.FAILED and not data.get("first_failure"):
            # a detached run failed with nobody watching: name its first failure now
            fields["first_failure"] = detached_failure(cluster, records, statuses, offsets_s(run, inv))
    RunRecord(run).update_nodes({n: s for n, s in statuses.items() if s.get("state") != NodeState.UNREACHABLE}, **fields)
    out = status_json(run.read(), statuses)
    if as_json:
        print(json.dumps(out, indent=2))
    else:
        print_status(out)
    return 0


def offsets_s(run: RunDir, inv: Inventory) -> dict[str, float]:
    """The clock offsets (s) the run's preflight (else the last `orch check`) measured."""
    return {node: ms / 1000.0 for node, ms in clock_offsets(run, inv.name)[0].items()}


def detached_failure(cluster: Cluster, records: list[dict[str, Any]],
                     statuses: Mapping[str, Mapping[str, Any]],
                     offsets: Mapping[str, float] | None = None) -> dict[str, Any] | None:
    """The earliest failed node of a run (on the reference clock), with its excerpt, judged after
    the fact."""
    specs = {r["node"]: NodeSpec(r["node"], r["node_rank"], r.get("base_rank", 0), r.get("nproc", 1))
             for r in records}
    failures = [f for n, s in statuses.items() if n in specs and s.get("state") == NodeState.FAILED
                for f in [corrected(Supervisor.node_failure(specs[n], s), offsets or {})] if f is not None]
    if not failures:
        return None
    first = min(failures, key=lambda f: f.order)
    rec = next(r for r in records if r["node"] == first.node)
    try:
        tail = status_node(cluster[first.node], rec["python"], rec["remote_dir"], tail=200).get("tail") or []
    except OrchError:
        tail = []
    first.excerpt, first.rank, first.local_rank = select_excerpt(tail)
    return first.to_json()


def status_json(data: Mapping[str, Any], statuses: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """CONTRACT.md's status JSON, with pid, uptime and last log time per node."""
    nodes = []
    for r in data.get("nodes") or []:
        s = statuses.get(r["node"], {})
        now = s.get("now") or time.time()
        started, finished = s.get("started_at") or r.get("started_at"), s.get("finished_at") or r.get("finished_at")
        uptime = None if not started else round((finished or now) - started, 1)
        nodes.append({"node": r["node"], "node_rank": r["node_rank"], "host": r.get("host"),
                      "state": s.get("state") or r.get("state"), "exit_code": s.get("exit_code", r.get("exit_code")),
                      "pid": s.get("pid") or r.get("pid"), "pgid": s.get("pgid") or r.get("pgid"),
                      "uptime_s": uptime, "last_log": _iso(s.get("log_mtime")),
                      "last_log_age_s": None if not s.get("log_mtime") else round(now - s["log_mtime"], 1),
                      "agent_alive": s.get("agent_alive"), "error": s.get("error")})
    out: dict[str, Any] = {"run": data.get("run"), "state": data.get("state"), "nodes": nodes}
    if data.get("first_failure"):
        out["first_failure"] = data["first_failure"]
    return out


def _iso(ts: float | None) -> str | None:
    if not ts:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def print_status(out: Mapping[str, Any]) -> None:
    con = ui.console(stderr=False)
    table = Table(title=f"run {out['run']}: {ui.styled(str(out['state']))}")
    for col in ("node", "rank", "state", "exit", "pid", "uptime", "last log"):
        table.add_column(col)
    for n in out["nodes"]:
        up = "" if n["uptime_s"] is None else f"{n['uptime_s']:.0f} s"
        last = "" if n["last_log_age_s"] is None else f"{n['last_log_age_s']:.0f} s ago"
        table.add_row(n["node"], str(n["node_rank"]), ui.styled(str(n["state"])),
                      "" if n["exit_code"] is None else str(n["exit_code"]), str(n["pid"] or ""), up,
                      last if not n.get("error") else escape(str(n["error"]))[:80])
    con.print(table)
    ff = out.get("first_failure")
    if ff:
        con.print(f"first failure: {ff['node']} (rank {ff.get('rank')}, exit code {ff.get('exit_code')}): "
                  f"{escape(str(ff.get('reason', '')))}")


def down_command(run_id: str | None) -> int:
    """Stop every process of a run on every node by its recorded process group; idempotent."""
    con = ui.console()
    run = RunStore().get(run_id)
    inv, records = _cluster_for(run)
    t = time.monotonic()
    with Cluster(inv) as cluster:
        results = stop_all(cluster, records, inv.job.stop_grace_s)
    record = RunRecord(run)
    done, failed = results.succeeded, results.failed
    ok = {n: r for n, r in done.items() if not r.get("remaining")}
    data = run.read()
    # a node that had already failed makes the run failed, whoever stopped the rest
    state = run_state([str(r["state"]) for r in done.values() if r.get("state")], data.get("state"))
    state = state if state in FINAL_STATES else RunState.STOPPED
    record.update_nodes({n: r for n, r in done.items() if r.get("state")}, state=state)
    for name in results:
        res = done.get(name)
        if res is None:
            con.print(f"[bold red]{escape(name)}: not stopped[/]: {escape(str(failed[name]))}")
        elif res.get("remaining"):
            con.print(f"[bold red]{escape(name)}: processes still running[/]: {res['remaining']}")
        else:
            n = len(res.get("stopped") or [])
            con.print(f"{escape(name)}: {'stopped ' + str(n) + ' processes' if n else 'nothing running'}")
    if len(ok) != len(results):
        con.print(f"run {run.run_id}: some nodes could not be stopped; run `orch down {run.run_id}` again "
                  "when they are reachable")
        return 1
    con.print(f"run {run.run_id}: nothing left running on {len(ok)} nodes ({time.monotonic() - t:.1f} s)")
    return 0
