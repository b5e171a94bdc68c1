"""`orch up`: copy `job.sync` to every node, preflight, launch the plan on every node under the
node agent, supervise it while streaming the merged log, stop everything on the first failure. The one use case that composes
the packages (preflight/, run/, logs/); it says what happens through `UpProgress` and returns an
`UpOutcome`, and the CLI shows both.

On the controller, `$ORCH_HOME/runs/<run-id>/` keeps the inventory snapshot, `plan.json`,
`check.json`, `sync.json` (what `job.sync` changed on each node), `run.json` (run and per-node
state) and the merged log.

An attached `orch up` supervises through the log streams: each node's log reader also pushes
the node's status when it changes, so a healthy run costs no SSH exec after the start. A node
whose stream has been silent for `ORCH_STREAM_SILENT_S` (a stream not yet up: for half the
unreachable grace) is polled with `agent.py status` until it is heard from again.

Tunables for supervision (environment, seconds): `ORCH_POLL_INTERVAL_S` (default 1: the status
poll of a silent node), `ORCH_STREAM_SILENT_S` (default 3), `ORCH_UNREACHABLE_GRACE_S` (default
10: a node silent that long fails the run).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from .config.inventory import Inventory
from .config.plan import Plan, make_plan
from .contract import RunState
from .errors import OrchError, UsageError
from .logs.lines import LogLine
from .preflight.report import CheckReport, run_preflight, save_to_run
from .remote.sync import SyncReport, sync_nodes
from .run.agent import NodeStatus, StopResult, start_all, status_all, status_node, stop_all
from .run.control import offsets_s
from .run.records import RunRecord, node_records
from .run.supervise import Failure, NodeSpec, Pushed, Supervisor, sigint_shielded
from .store import RunDir, RunStore, clock_offsets
from .transport import Cluster, GroupResult

Result = Literal["succeeded", "failed", "start_failed", "sync_failed", "preflight_failed", "interrupted",
                 "detached"]


class UpProgress(Protocol):
    """What `up` tells as it goes, for the CLI to show; called from the main thread, except
    `line`, `log_event` and `log_stopped`, which come from the log streaming thread."""

    def syncing(self, inv: Inventory) -> None:
        """`job.sync` is being copied to every node (before the preflight)."""

    def synced(self, report: SyncReport, elapsed_s: float) -> None: ...

    def preflight_done(self, report: CheckReport, elapsed_s: float) -> None: ...

    def starting(self, plan: Plan) -> None: ...

    def start_failed(self, failures: Mapping[str, Exception]) -> None:
        """Nodes that could not start; every node that did is being stopped now."""

    def running(self, plan: Plan, startup_s: float) -> None: ...

    def line(self, line: LogLine) -> None:
        """A line of the merged log (attached runs)."""

    def log_event(self, node: str, message: str) -> None: ...

    def log_stopped(self, exc: Exception) -> None:
        """Log streaming broke; supervision goes on without it."""


class Quiet:
    """An UpProgress that says nothing."""

    def syncing(self, inv: Inventory) -> None:
        pass

    def synced(self, report: SyncReport, elapsed_s: float) -> None:
        pass

    def preflight_done(self, report: CheckReport, elapsed_s: float) -> None:
        pass

    def starting(self, plan: Plan) -> None:
        pass

    def start_failed(self, failures: Mapping[str, Exception]) -> None:
        pass

    def running(self, plan: Plan, startup_s: float) -> None:
        pass

    def line(self, line: LogLine) -> None:
        pass

    def log_event(self, node: str, message: str) -> None:
        pass

    def log_stopped(self, exc: Exception) -> None:
        pass


@dataclass
class UpOutcome:
    """How an `orch up` ended."""

    result: Result
    run_id: str | None = None
    preflight: CheckReport | None = None
    wall_s: float | None = None
    failure: Failure | None = None
    """The first failure of a failed run."""
    teardown_s: float | None = None
    not_stopped: dict[str, str] = field(default_factory=dict)
    """Nodes whose stop could not be confirmed, with the reason: run `orch down` once reachable."""
    sync: SyncReport | None = None
    """What copying `job.sync` did on each node (None: nothing to sync, or --skip-sync)."""
    sync_error: OrchError | None = None
    """Why `job.sync` could not be copied to any node (no rsync or ssh on the controller)."""


def env_seconds(name: str, default: float) -> float:
    """A positive number of seconds from the environment, else the default."""
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 else default


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


def not_stopped(results: GroupResult[StopResult]) -> dict[str, str]:
    """The nodes a stop could not confirm, with why: unreachable, or processes still running."""
    done, failed = results.succeeded, results.failed
    return {n: str(failed[n]) if n in failed else f"processes still running: {list(done[n].remaining)}"
            for n in results if n in failed or done[n].remaining}


def up(inv: Inventory, *, detach: bool = False, skip_checks: bool = False, run_id: str | None = None,
       skip_sync: bool = False, progress: UpProgress | None = None, fabric: bool = False) -> UpOutcome:
    """Copy `job.sync` (unless skip_sync), check, launch on every node, then supervise (or return
    once every node runs, with detach). A `job.sync` path missing here raises UsageError.
    `fabric`: the preflight also runs the fabric check (a short job on every node), as
    `checks.fabric` in the inventory does."""
    if skip_checks and fabric:
        raise UsageError("--fabric is a check: it cannot run with --skip-checks",
                         "drop --skip-checks, or --fabric")
    say = progress or Quiet()
    t0 = time.monotonic()
    synced = None
    if inv.job.sync and not skip_sync:
        say.syncing(inv)
        try:
            synced = sync_nodes(inv, inv.nodes)
        except UsageError:
            raise
        except OrchError as exc:  # nothing to copy with on the controller: nothing is launched
            return UpOutcome("sync_failed", sync_error=exc)
        say.synced(synced, time.monotonic() - t0)
        if not synced.ok:
            return UpOutcome("sync_failed", sync=synced)
    report = None
    if not skip_checks:
        t_check = time.monotonic()
        report = run_preflight(inv, fabric=fabric)
        say.preflight_done(report, time.monotonic() - t_check)
        if not report.ok:
            return UpOutcome("preflight_failed", preflight=report, sync=synced)
    t_launch = time.monotonic()
    run = RunStore().create(inv, run_id)
    plan = make_plan(inv, run.run_id)
    run.write(plan.to_json(), "plan.json")
    save_to_run(run, inv, report)
    if synced is not None:
        run.write(synced.to_json(), "sync.json")
    record = RunRecord(run)
    run.update(nodes=node_records(plan), state=RunState.STARTING)
    say.starting(plan)
    with Cluster(inv) as cluster, sigterm_as_interrupt():
        try:
            outcome = _launch(say, run, record, plan, cluster, detach, t0, t_launch, report)
        except KeyboardInterrupt:
            t = time.monotonic()
            with sigint_shielded():
                results = stop_all(cluster, record.nodes(), inv.job.stop_grace_s)
            record.update_nodes({}, state=RunState.STOPPED)
            outcome = UpOutcome("interrupted", run.run_id, report, teardown_s=time.monotonic() - t,
                                not_stopped=not_stopped(results))
    outcome.sync = synced
    return outcome


def _launch(say: UpProgress, run: RunDir, record: RunRecord, plan: Plan, cluster: Cluster, detach: bool,
            t0: float, t_launch: float, report: CheckReport | None) -> UpOutcome:
    """Start every node; stop them all if one cannot start; then return (detach) or supervise."""
    inv = plan.inventory
    started = start_all(cluster, plan)
    record.update_nodes(started.succeeded)
    if started.failed:
        say.start_failed(started.failed)
        t = time.monotonic()
        results = stop_all(cluster, record.nodes(), inv.job.stop_grace_s)
        record.update_nodes({n: r.status for n, r in results.succeeded.items() if r.status is not None},
                            state=RunState.FAILED, start_failures={n: str(e) for n, e in started.failed.items()})
        return UpOutcome("start_failed", run.run_id, report, teardown_s=time.monotonic() - t,
                         not_stopped=not_stopped(results))
    startup_s = time.monotonic() - t_launch
    record.update_nodes({}, state=RunState.RUNNING, startup_s=round(startup_s, 3))
    say.running(plan, startup_s)
    if detach:
        return UpOutcome("detached", run.run_id, report)
    return _attached(say, run, record, plan, cluster, t0, report)


def _attached(say: UpProgress, run: RunDir, record: RunRecord, plan: Plan, cluster: Cluster, t0: float,
              report: CheckReport | None) -> UpOutcome:
    """Stream the merged log and supervise until the run ends; record how it ended."""
    inv = plan.inventory
    records = record.nodes()
    by_name = {r["node"]: r for r in records}
    interval = env_seconds("ORCH_POLL_INTERVAL_S", 1.0)
    grace = env_seconds("ORCH_UNREACHABLE_GRACE_S", 10.0)
    silent_after = min(env_seconds("ORCH_STREAM_SILENT_S", 3.0), grace / 2)

    def poll_one(name: str) -> NodeStatus:
        r = by_name[name]
        # a loaded node answers slowly; only `grace` without an answer makes it unreachable
        return status_node(cluster[name], r["python"], r["remote_dir"], timeout=grace)

    def excerpt(name: str) -> list[str]:
        r = by_name[name]
        return list(status_node(cluster[name], r["python"], r["remote_dir"], tail=200).tail)

    pushed = Pushed([p.node.name for p in plan.nodes], poll_one, silent_after=silent_after,
                    first_frame_s=grace / 2, interval=interval, stale_after=grace / 2)
    sup = Supervisor([NodeSpec(p.node.name, p.node_rank, p.global_ranks.start, p.node.nproc_per_node)
                      for p in plan.nodes],
                     observe=pushed.observe,
                     stop_all=lambda: stop_all(cluster, records, inv.job.stop_grace_s),
                     excerpt=excerpt,
                     confirm=lambda names: status_all(cluster, [r for r in records if r["node"] in names], timeout=3.0),
                     interval=min(interval, 0.5), unreachable_grace=grace, sleep=pushed.wait,
                     on_update=lambda nodes: record.update_nodes(nodes), offsets_s=offsets_s(run, inv))
    stop_logs = threading.Event()
    logs = threading.Thread(target=_stream_logs, args=(say, run, inv, cluster, stop_logs, pushed), daemon=True,
                            name="logs")
    logs.start()
    pushed.start()
    interrupted = False
    try:
        outcome = sup.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        pushed.close(wait=5.0)
        # every node is final now: the follower drains the last lines and its node-side readers
        # exit on their own (closing them early would leave them to die later, on a broken pipe);
        # a node teardown could not reach will never be final, so do not wait long for it
        logs.join(timeout=2.0 if sup.not_stopped else 10.0)
        stop_logs.set()
        logs.join(timeout=2.0)
    wall = time.monotonic() - t0
    if interrupted:
        record.update_nodes(dict(sup.nodes), state=RunState.STOPPED, wall_s=round(wall, 3),
                            teardown_s=sup.teardown_s)
        return UpOutcome("interrupted", run.run_id, report, wall, teardown_s=sup.teardown_s or 0.0,
                         not_stopped=dict(sup.not_stopped))
    fields: dict[str, Any] = {"state": outcome.state, "wall_s": round(wall, 3), "teardown_s": outcome.teardown_s}
    if outcome.failure is not None:
        fields["first_failure"] = outcome.failure.to_json()
    record.update_nodes(dict(sup.nodes), **fields)
    return UpOutcome("succeeded" if outcome.state == RunState.SUCCEEDED else "failed", run.run_id, report, wall,
                     outcome.failure, outcome.teardown_s, dict(outcome.not_stopped))


def _stream_logs(say: UpProgress, run: RunDir, inv: Inventory, cluster: Cluster, stop: threading.Event,
                 pushed: Pushed) -> None:
    """The merged log (host and rank on every line) to `say.line` until the run ends or `stop`
    is set; the node status the streams carry goes to `pushed` (the supervisor's observations)."""
    from .logs.follow import Follower

    try:
        offsets, _origin = clock_offsets(run, inv.name)
        follower = Follower(run, inv, cluster, offsets_ms=offsets, on_event=say.log_event,
                            on_status=lambda node, status: pushed.status(node, NodeStatus.from_json(status)),
                            on_frame=pushed.frame)
        for line in follower.lines(stop):
            say.line(line)
    except Exception as exc:  # log streaming must never take supervision down with it
        say.log_stopped(exc)
