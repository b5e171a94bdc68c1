"""`orch up`: copy `job.sync` to every node, preflight, launch the plan on every node under the
node agent, supervise it while streaming the merged log, stop everything on the first failure. The one use
case that composes
the packages (preflight/, run/, logs/); it says what happens through `UpProgress` and returns an
`UpOutcome`, and the CLI shows both.

On the controller, `$ORCH_HOME/runs/<run-id>/` keeps the inventory snapshot, `plan.json`,
`check.json`, `sync.json` (what `job.sync` changed on each node), `run.json` (run and per-node
state) and the merged log.

An attached `orch up` supervises through the log streams: each node's log reader also pushes
the node's status when it changes, so a healthy run costs no SSH exec after the start. A node
whose stream has been silent for a while (`Tunables.stream_silent_s`; a stream not yet up: for
half the unreachable grace) is polled with `agent.py status` until it is heard from again.

The tunables of supervision (environment variables, seconds) are `run.supervise.Tunables`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from .config.inventory import Inventory, with_replacements
from .config.plan import Plan, make_plan
from .contract import Name, RunState
from .errors import ConnectionLost, OrchError, TransportError, UsageError
from .logs.lines import LogLine
from .logs.teardown import NodeStopped, QuietStop
from .preflight.runner import CheckReport, run_preflight, save_to_run
from .remote.sync import SyncReport, sync_nodes
from .run import resume
from .run.agents import (
    NodeStatus,
    StopResult,
    UntrustedRunDir,
    start_all,
    status_all,
    status_node,
    stop_all,
)
from .run.control import offsets_s
from .run.records import RunRecord, node_records
from .run.stacks import StacksReport
from .run.straggler import Detector, Straggler, StragglerWatch, chain
from .run.supervise import (
    Failure,
    NodeSpec,
    Pushed,
    Supervisor,
    Tunables,
    sigint_shielded,
    sigterm_as_interrupt,
)
from .run.watchdog import HangWatch, Watchdog
from .store import RunDir, RunStore, clock_offsets
from .transport import Cluster, GroupResult, Hold, transport_of


class UpResult(Name):
    """How an `orch up` ended (`UpOutcome.result`; run.json `attempts[].result`; the CLI's exit code)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    START_FAILED = "start_failed"
    SYNC_FAILED = "sync_failed"
    PREFLIGHT_FAILED = "preflight_failed"
    RETRY_PREFLIGHT_FAILED = "retry_preflight_failed"
    INTERRUPTED = "interrupted"
    STOPPED = "stopped"
    """`orch down` (from another shell) stopped the run: final, never retried."""
    DETACHED = "detached"


RETRIED = (UpResult.FAILED, UpResult.START_FAILED)
"""The ends of an attempt that `job.retries` relaunches: the job failed (a rank, a node, a hang
stopped by the watchdog) or a node could not start. A failed sync or preflight never is."""


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

    def node_stopped(self, stop: NodeStopped) -> None:
        """A node was stopped (orch's teardown, Ctrl-C, orch down): what it printed meanwhile was
        kept out of `line` (it is in its log); from the log streaming thread."""

    def log_stopped(self, exc: Exception) -> None:
        """Log streaming broke; supervision goes on without it."""

    def warning(self, message: str) -> None:
        """Something the run goes on without (a record or log copy the controller's disk refused)."""

    def stalled(self, silent_s: float, timeout_s: float) -> None:
        """No rank wrote a line for `silent_s`: every rank's stack is being taken."""

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:
        """The stacks of a hang (grouped), or why there are none; `stop`: the run is torn down now,
        else it goes on (`job.on_stall: warn`)."""

    def straggler(self, found: Straggler, stop: bool) -> None:
        """A rank was named a straggler (`found.line()`); `stop`: the run is torn down for it
        (`job.straggler.action: stop`)."""

    def retrying(self, attempt: int, attempts: int, why: str, excerpt: Sequence[str] = ()) -> None:
        """The run failed (why, and the failing node's last lines) and is relaunched as attempt
        `attempt` of at most `attempts`."""

    def replacing(self, node: str, spare: str, why: str) -> None:
        """A node failed the retry's preflight; `spare` takes its place."""

    def resuming(self, how: str) -> None:
        """The trainer is relaunched with `how` (`--resume auto`, or the user's `--resume PATH`): it
        continues its own checkpoint if it wrote one."""

    def allocation(self, message: str) -> None:
        """Where the nodes' allocation is (`transport: slurm`): asked for, pending and why, running,
        given back."""


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

    def node_stopped(self, stop: NodeStopped) -> None:
        pass

    def log_stopped(self, exc: Exception) -> None:
        pass

    def warning(self, message: str) -> None:
        pass

    def stalled(self, silent_s: float, timeout_s: float) -> None:
        pass

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:
        pass

    def straggler(self, found: Straggler, stop: bool) -> None:
        pass

    def retrying(self, attempt: int, attempts: int, why: str, excerpt: Sequence[str] = ()) -> None:
        pass

    def replacing(self, node: str, spare: str, why: str) -> None:
        pass

    def resuming(self, how: str) -> None:
        pass

    def allocation(self, message: str) -> None:
        pass


@dataclass
class UpOutcome:
    """How an `orch up` ended."""

    result: UpResult
    run_id: str | None = None
    preflight: CheckReport | None = None
    wall_s: float | None = None
    failure: Failure | None = None
    """The first failure of a failed run."""
    teardown_s: float | None = None
    not_stopped: dict[str, str] = field(default_factory=dict)
    """Nodes whose stop could not be confirmed, with the reason: run `orch down` once reachable."""
    attempt: int = 1
    """The attempt that ended this way (1, then 2, 3... after automatic retries)."""
    attempts: int = 1
    """At most this many (`job.retries` + 1; 1 for a detached run: nobody is there to relaunch it)."""
    earlier: list[dict[str, Any]] = field(default_factory=list)
    """How the earlier attempts ended (run.json `attempts`)."""
    retry_failed: dict[str, str] = field(default_factory=dict)
    """With `retry_preflight_failed`: the nodes that failed the retry's preflight (no spare left), with why."""
    no_retry: str | None = None
    """Why a failure that retries were left for was not retried (a node whose stop is unconfirmed)."""
    sync: SyncReport | None = None
    """What copying `job.sync` did on each node (None: nothing to sync, or --skip-sync)."""
    sync_error: OrchError | None = None
    """Why `job.sync` could not be copied to any node (no rsync or ssh on the controller)."""
    never_started: dict[str, str] = field(default_factory=dict)
    """With `start_failed`: the nodes that could not even be reached to start, with why (nothing
    of the run is on them; their stop is not asked for)."""
    allocation: dict[str, Any] | None = None
    """The Slurm allocation the run ran in (run.json `slurm`: its job id, nodes, whether orch made it)."""
    preempted: bool = False
    """The last attempt ended because the trainer was preempted (a warning signal: its checkpoint is
    written, `--resume auto` continues)."""


NEVER_STARTED_KINDS = ("unreachable", "auth", "host_key_unknown", "host_key_changed", "host_key_revoked")


def never_started(failures: Mapping[str, Exception]) -> dict[str, str]:
    """The start failures that prove the node never started: no connection could be made (never
    one that broke under the start command: that start may have run)."""
    return {
        n: str(e)
        for n, e in failures.items()
        if isinstance(e, TransportError) and e.kind in NEVER_STARTED_KINDS and not isinstance(e, ConnectionLost)
    }


def not_stopped(results: GroupResult[StopResult]) -> dict[str, str]:
    """The nodes a stop could not confirm, with why: unreachable, or processes still running."""
    done, failed = results.succeeded, results.failed
    return {
        n: str(failed[n]) if n in failed else f"processes still running: {list(done[n].remaining)}"
        for n in results
        if n in failed or done[n].remaining
    }


def with_overrides(inv: Inventory, retries: int | None = None, stall_timeout_s: float | None = None) -> Inventory:
    """The inventory with `orch up`'s --retries / --stall-timeout in place of job.retries /
    job.stall_timeout_s (None: the inventory's own)."""
    job = inv.job
    if retries is not None:
        job = replace(job, retries=retries)
    if stall_timeout_s is not None:
        job = replace(job, stall_timeout_s=stall_timeout_s)
    return replace(inv, job=job) if job is not inv.job else inv


def up(
    inv: Inventory,
    *,
    detach: bool = False,
    skip_checks: bool = False,
    run_id: str | None = None,
    skip_sync: bool = False,
    progress: UpProgress | None = None,
    fabric: bool = False,
    retries: int | None = None,
    stall_timeout_s: float | None = None,
    overrides: dict[str, Any] | None = None,
) -> UpOutcome:
    """Copy `job.sync` (unless skip_sync), check, launch on every node, then supervise (or return
    once every node runs, with detach). A `job.sync` path missing here raises UsageError.
    `fabric`: the preflight also runs the fabric check (a short job on every node), as
    `checks.fabric` in the inventory does.

    An attached run that fails (not its sync or preflight) is torn down and relaunched under the
    same run id up to `job.retries` times (`retries` overrides it): `job.sync` and the preflight
    again (the fabric check too with `fabric`; a node that fails either is replaced by a healthy
    `spare:` node), then the same job, with `--resume` for the trainer once its master holds
    `weights/last.pt`. `overrides`: what the command line changed of the inventory file for this
    run (`config.overrides.Overrides.to_json`; `inv` has them applied already), kept in run.json so
    every later command reads the run's inventory as it ran."""
    if skip_checks and fabric:
        raise UsageError("--fabric is a check: it cannot run with --skip-checks", "drop --skip-checks, or --fabric")
    say = progress or Quiet()
    inv = with_overrides(inv, retries, stall_timeout_s)
    t0 = time.monotonic()
    with sigterm_as_interrupt():
        held = transport_of(inv).hold(inv, say.allocation)  # a Slurm allocation: asked for, waited on
        try:
            outcome = _up(say, held, detach, skip_checks, run_id, skip_sync, fabric, overrides, t0)
            if outcome.result == UpResult.DETACHED:
                held.keep()  # its launch gives the allocation back when the run ends
            return outcome
        finally:
            with sigint_shielded():
                held.release()


def _up(
    say: UpProgress,
    held: Hold,
    detach: bool,
    skip_checks: bool,
    run_id: str | None,
    skip_sync: bool,
    fabric: bool,
    overrides: dict[str, Any] | None,
    t0: float,
) -> UpOutcome:
    """`up` on the nodes `held` holds."""
    inv = held.inventory
    synced = None
    if inv.job.sync and not skip_sync:
        say.syncing(inv)
        try:
            synced = sync_nodes(inv, inv.nodes)
        except UsageError:
            raise
        except OrchError as exc:  # nothing to copy with on the controller: nothing is launched
            return UpOutcome(UpResult.SYNC_FAILED, sync_error=exc)
        say.synced(synced, time.monotonic() - t0)
        if not synced.ok:
            return UpOutcome(UpResult.SYNC_FAILED, sync=synced)
    report = None
    if not skip_checks:
        t_check = time.monotonic()
        report = run_preflight(inv, fabric=fabric, run_id=run_id)
        say.preflight_done(report, time.monotonic() - t_check)
        if not report.ok:
            return UpOutcome(UpResult.PREFLIGHT_FAILED, preflight=report, sync=synced)
    run = RunStore().create(inv, run_id)
    if overrides:
        run.update(overrides=overrides)
    if held.record is not None:
        run.update(slurm=held.record)
    if synced is not None:
        run.write(synced.to_json(), "sync.json")
    attempts = 1 if detach else 1 + inv.job.retries
    run.update(
        attempt=1,
        max_attempts=attempts,
        attempts=[],
        stall_timeout_s=inv.job.stall_timeout_s,
        on_stall=inv.job.on_stall,
    )
    save_to_run(run, inv, report)
    outcome = _attempts(say, run, held, report, detach, Prepare(skip_checks, skip_sync, fabric), t0, attempts)
    outcome.sync = outcome.sync or synced
    outcome.allocation = held.record
    return outcome


@dataclass(frozen=True)
class Prepare:
    """What each retry does again before its launch: as the first attempt did (`orch up`'s flags)."""

    skip_checks: bool = False
    skip_sync: bool = False
    fabric: bool = False


def _attempts(
    say: UpProgress,
    run: RunDir,
    held: Hold,
    report: CheckReport | None,
    detach: bool,
    prepare: Prepare,
    t0: float,
    attempts: int,
) -> UpOutcome:
    """Attempt after attempt until one succeeds, is interrupted, or no retry is left."""
    inv = current = held.inventory
    replaced: dict[str, str] = {}
    earlier: list[dict[str, Any]] = []
    synced: SyncReport | None = None
    attempt, t_launch = 1, time.monotonic()
    while True:
        outcome = _attempt(say, run, current, report, detach, t0, t_launch, attempt)
        outcome.attempt, outcome.attempts, outcome.earlier, outcome.sync = attempt, attempts, list(earlier), synced
        if outcome.result in RETRIED:
            _why_ended(run, held, outcome)
        if outcome.result in RETRIED and down_requested(run):
            return _stopped(run, outcome)
        if outcome.result not in RETRIED or attempt >= attempts:
            return outcome
        if outcome.not_stopped and not held.ended():
            outcome.no_retry = f"not relaunched: {unconfirmed(outcome.not_stopped)}"
            return outcome
        earlier.append(_attempt_record(attempt, outcome))
        attempt += 1
        say.retrying(attempt, attempts, _why(outcome), outcome.failure.excerpt if outcome.failure else ())
        run.update(attempt=attempt, attempts=earlier, state=RunState.STARTING, first_failure=None)
        try:
            inv = held.renew(say.allocation)  # the allocation again: requeued, or a new one once it ended
            if held.record is not None:
                run.update(slurm=held.record)
            if outcome.not_stopped:  # the allocation ended under the teardown: asked again in its renewal
                _stop_again(say, run, inv, outcome.not_stopped)
            prepared = _prepare_retry(say, run, inv, replaced, prepare, straggler_of(outcome.failure))
        except OrchError as exc:  # no allocation for another attempt (the user's own has ended)
            run.update(state=RunState.FAILED, first_failure=outcome.failure.to_json() if outcome.failure else None)
            outcome.no_retry = f"not relaunched: {exc.message}"
            return outcome
        except KeyboardInterrupt:
            run.update(state=RunState.STOPPED)
            return UpOutcome(
                UpResult.INTERRUPTED,
                run.run_id,
                report,
                time.monotonic() - t0,
                attempt=attempt,
                attempts=attempts,
                earlier=list(earlier),
            )
        if isinstance(prepared, UpOutcome):
            prepared.attempt, prepared.attempts, prepared.earlier = attempt, attempts, list(earlier)
            prepared.failure, prepared.wall_s = outcome.failure, time.monotonic() - t0
            run.update(
                state=RunState.FAILED,
                first_failure=outcome.failure.to_json() if outcome.failure else None,
                retry_failed=prepared.retry_failed,
            )
            return prepared
        current, report, synced = prepared
        if report is not None:  # the retry's own preflight (without, check.json stays the one it had)
            save_to_run(run, current, report)
        if down_requested(run):  # `orch down` while the retry was being prepared: nothing is relaunched
            return _stopped(
                run,
                UpOutcome(
                    UpResult.STOPPED,
                    run.run_id,
                    report,
                    time.monotonic() - t0,
                    outcome.failure,
                    attempt=attempt,
                    attempts=attempts,
                    earlier=list(earlier),
                ),
            )
        t_launch = time.monotonic()


def unconfirmed(nodes: Mapping[str, str]) -> str:
    return (
        f"the stop of {', '.join(nodes)} is unconfirmed, and a second copy of the job must not start beside the first"
    )


def _stop_again(say: UpProgress, run: RunDir, inv: Inventory, unsure: Mapping[str, str]) -> None:
    """The nodes whose stop an attempt's teardown could not confirm because their allocation was
    ending under it (Slurm starts no step in a completing job, so a container's sweep could not run
    there): stopped and swept again, each in the renewed allocation, before the retry starts
    anything. OrchError where one is still unconfirmed, or not in that allocation."""
    records = [r for r in RunRecord(run, warn=say.warning).nodes() if r.node in unsure]
    held = {n.name for n in inv.nodes}
    left = {n: why for n, why in unsure.items() if n not in held or n not in {r.node for r in records}}
    with Cluster(inv) as cluster:
        left.update(not_stopped(stop_all(cluster, [r for r in records if r.node in held], inv.job.stop_grace_s)))
    if left:
        raise OrchError(unconfirmed(left), f"orch down {run.run_id} once the nodes are reachable, then orch up again")


def _why_ended(run: RunDir, held: Hold, outcome: UpOutcome) -> None:
    """An attempt that failed because the trainer was preempted, or because the held nodes went away
    under it (a Slurm time limit, a preemption, a requeue), says so: its first failure's cause, in
    the outcome and in run.json."""
    f = outcome.failure
    outcome.preempted = f is not None and resume.preempted(f.cause, f.excerpt)
    gone = held.ended()
    if f is None or not (gone or outcome.preempted):
        return
    f.cause = "; ".join(
        part
        for part in (
            gone,
            "the trainer wrote its checkpoint (preempted: --resume continues)" if outcome.preempted else "",
        )
        if part
    )
    f.hint = (
        f.hint
        if outcome.preempted and not gone
        else "a longer slurm.time, or job.retries to resume in a new allocation"
    )
    run.update(first_failure=f.to_json())


def down_requested(run: RunDir) -> bool:
    """Has `orch down` been asked to stop this run (run.json `down_requested`, from any shell)?"""
    return bool(run.read().get("down_requested"))


def _stopped(run: RunDir, outcome: UpOutcome) -> UpOutcome:
    """The run ends `stopped`: `orch down` stopped it, and a stop is final (no retry)."""
    outcome.result = UpResult.STOPPED
    outcome.no_retry = "stopped by orch down"
    run.update(state=RunState.STOPPED)
    return outcome


def _attempt_record(attempt: int, outcome: UpOutcome) -> dict[str, Any]:
    """run.json `attempts[]`: how one attempt ended."""
    return {
        "attempt": attempt,
        "result": str(outcome.result),
        "ended": time.time(),
        "first_failure": outcome.failure.to_json() if outcome.failure else None,
    }


def _why(outcome: UpOutcome) -> str:
    """One line: why an attempt ended (for the retry message)."""
    f = outcome.failure
    if f is not None:
        rank = f" rank {f.rank}" if f.rank is not None else ""
        return f"{f.node}{rank}: {f.summary}"
    return "a node could not start" if outcome.result == UpResult.START_FAILED else str(outcome.result)


def straggler_of(failure: Failure | None) -> dict[str, str]:
    """{node: why} when the attempt was stopped for a straggler (`job.straggler.action: stop`):
    that node is replaced by a spare on the retry, as a node that fails the preflight is."""
    if failure is None or not failure.reason.startswith(STRAGGLER_PREFIX):
        return {}
    return {failure.node: failure.reason}


STRAGGLER_PREFIX = "straggler: "


def _prepare_retry(
    say: UpProgress,
    run: RunDir,
    inv: Inventory,
    replaced: dict[str, str],
    prepare: Prepare,
    slow: Mapping[str, str] | None = None,
) -> tuple[Inventory, CheckReport | None, SyncReport | None] | UpOutcome:
    """The inventory of the next attempt: `job.sync` and the preflight again (unless skipped), a
    spare for each node that now fails either, or was stopped as a straggler (`slow`; `replaced`
    grows, run.json `replaced` follows), and the trainer's `--resume` once its master holds the
    checkpoint, decided before the preflight (run as this run id): the trainer's own check judges
    the arguments this attempt launches. An UpOutcome when no attempt can be made."""
    report = synced = None
    pending_slow = dict(slow or {})
    while True:
        current = with_replacements(inv, replaced)
        why: dict[str, str] = {n: w for n, w in pending_slow.items() if n in {x.name for x in current.nodes}}
        pending_slow = {}
        if current.job.sync and not prepare.skip_sync:
            t = time.monotonic()
            say.syncing(current)
            try:
                synced = sync_nodes(current, current.nodes)
            except OrchError as exc:  # the controller cannot copy any more (a job.sync path gone)
                return UpOutcome(
                    UpResult.RETRY_PREFLIGHT_FAILED,
                    run.run_id,
                    sync_error=exc,
                    no_retry="job.sync failed",
                    retry_failed={n.name: f"sync: {exc.message}" for n in current.nodes},
                )
            say.synced(synced, time.monotonic() - t)
            run.write(synced.to_json(), "sync.json")
            why.update({n.node: f"sync: {n.error}" for n in synced.failed()})
        if not why and resume.is_trainer(current.job):
            # before the preflight: the trainer's own check then judges the args this attempt launches
            current = _with_resume(say, run, current)
        if not why and not prepare.skip_checks:
            t = time.monotonic()
            report = run_preflight(current, fabric=prepare.fabric, run_id=run.run_id)
            say.preflight_done(report, time.monotonic() - t)
            for r in report.failed():
                why.setdefault(r.node, f"{r.check}: {r.detail or r.value}")
        if not why:
            break
        bad = [n.name for n in current.nodes if n.name in why] or list(why)
        if len(bad) > len(current.spares) or any(b not in {n.name for n in current.nodes} for b in bad):
            left = f"{len(current.spares)} spare(s) left" if current.spares else "no spare left"
            return UpOutcome(
                UpResult.RETRY_PREFLIGHT_FAILED,
                run.run_id,
                report,
                retry_failed={b: why[b] for b in bad},
                no_retry=left,
            )
        for name, spare in zip(bad, current.spares):
            replaced[name] = spare.name
            say.replacing(name, spare.name, why[name])
        run.update(replaced=dict(replaced))
    return current, report, synced


def _with_resume(say: UpProgress, run: RunDir, inv: Inventory) -> Inventory:
    """The trainer's args for a retry: `--resume auto` (the trainer continues this run's own
    last.pt if it wrote one, else starts over in the same directory; where that is, it decides)."""
    args = resume.with_resume(inv.job.args)
    say.resuming("--resume auto" if args[-2:] == ("--resume", "auto") else "its own --resume / resume= argument")
    return replace(inv, job=replace(inv.job, args=args))


@dataclass
class Ending:
    """How an attempt ends, filled in as it goes. `teardown`, in the attempt's `finally`, acts on
    it once: stops the nodes that may still run (unless `stop` is off: the supervisor stopped them
    itself, or the run is left running detached) and records `state`, `fields` and the nodes'
    last statuses in run.json. Until something else is decided, it holds what an error or Ctrl-C
    leaves: every node stopped, the run `stopped`."""

    stop: bool = True
    spared: frozenset[str] = frozenset()
    """Nodes not to stop: their agent refused the run directory, so nothing started there."""
    state: RunState | None = RunState.STOPPED
    """run.json `state` at the end (None: nothing more to record, a detached run)."""
    fields: dict[str, Any] = field(default_factory=dict)
    nodes: dict[str, NodeStatus] = field(default_factory=dict)
    wall_s: float | None = None
    teardown_s: float | None = None
    not_stopped: dict[str, str] = field(default_factory=dict)

    def teardown(self, cluster: Cluster, record: RunRecord, grace: float) -> None:
        """Stop what may still run (Ctrl-C and SIGTERM held off meanwhile); record the end."""
        if self.stop:
            t = time.monotonic()
            with sigint_shielded():
                results = stop_all(cluster, [r for r in record.nodes() if r.node not in self.spared], grace)
            self.teardown_s = time.monotonic() - t
            self.not_stopped = not_stopped(results)
            self.nodes.update({n: r.status for n, r in results.succeeded.items() if r.status is not None})
        if self.state is not None:
            record.update_nodes(self.nodes, state=self.state, **self.fields)


def _attempt(
    say: UpProgress,
    run: RunDir,
    inv: Inventory,
    report: CheckReport | None,
    detach: bool,
    t0: float,
    t_launch: float,
    attempt: int,
) -> UpOutcome:
    """One launch of the run on the inventory's nodes: plan, start, supervise (or detach); on
    every way out, the one teardown (`Ending`)."""
    plan = make_plan(inv, run.run_id, attempt, run.nonce or "", pins=report.pins if report is not None else None)
    run.write(plan.to_json(env_values=True), "plan.json")  # private (0600): what was launched, values too
    record = RunRecord(run, warn=say.warning)
    run.update(nodes=[r.to_json() for r in node_records(plan)], state=RunState.STARTING)
    say.starting(plan)
    end = Ending()
    with Cluster(inv) as cluster:
        try:
            outcome = _launch(say, run, record, plan, cluster, detach, t0, t_launch, report, end, attempt)
        except KeyboardInterrupt:
            outcome = UpOutcome(UpResult.INTERRUPTED, run.run_id, report)
        finally:
            end.teardown(cluster, record, inv.job.stop_grace_s)
    outcome.wall_s = outcome.wall_s if end.wall_s is None else end.wall_s
    outcome.teardown_s = outcome.teardown_s if end.teardown_s is None else end.teardown_s
    outcome.not_stopped = {n: why for n, why in end.not_stopped.items() if n not in outcome.never_started}
    return outcome


def _launch(
    say: UpProgress,
    run: RunDir,
    record: RunRecord,
    plan: Plan,
    cluster: Cluster,
    detach: bool,
    t0: float,
    t_launch: float,
    report: CheckReport | None,
    end: Ending,
    attempt: int = 1,
) -> UpOutcome:
    """Start every node; if one cannot start, the rest are stopped (`end`); then return (detach) or
    supervise."""
    started = start_all(
        cluster,
        plan,
        lease_s=None if detach else Tunables.from_env().lease_s,
        log_path=run.path / f"launch-{attempt}.log",
        detached=detach,
    )
    record.update_nodes(started.succeeded)
    if down_requested(run):  # `orch down` came while the nodes were starting: stop what started
        return UpOutcome(UpResult.STOPPED, run.run_id, report)
    if started.failed:
        say.start_failed(started.failed)
        # a node whose agent refused its run directory started nothing there (the boot refuses
        # before it writes): no stop to confirm
        end.spared = frozenset(n for n, e in started.failed.items() if isinstance(e, UntrustedRunDir))
        end.state = RunState.FAILED
        end.fields = {"start_failures": {n: str(e) for n, e in started.failed.items()}}
        return UpOutcome(UpResult.START_FAILED, run.run_id, report, never_started=never_started(started.failed))
    startup_s = time.monotonic() - t_launch
    record.update_nodes({}, state=RunState.RUNNING, startup_s=round(startup_s, 3))
    say.running(plan, startup_s)
    if detach:
        end.stop, end.state = False, None
        return UpOutcome(UpResult.DETACHED, run.run_id, report)
    return _attached(say, run, record, plan, cluster, t0, report, end, attempt)


def _attached(
    say: UpProgress,
    run: RunDir,
    record: RunRecord,
    plan: Plan,
    cluster: Cluster,
    t0: float,
    report: CheckReport | None,
    end: Ending,
    attempt: int = 1,
) -> UpOutcome:
    """Stream the merged log and supervise until the run ends; say in `end` how it ended."""
    inv = plan.inventory
    records = record.nodes()
    by_name = {r.node: r for r in records}
    tune = Tunables.from_env()
    interval, grace = tune.poll_interval_s, tune.unreachable_grace_s

    def poll_one(name: str) -> NodeStatus:
        r = by_name[name]
        # a node that was reached but answers slowly (a stalled disk) is not down: it has
        # `no_answer_s`; one that cannot be reached fails the call, and is judged by `grace`
        return status_node(cluster[name], r.python, r.remote_dir, timeout=tune.no_answer_s, nonce=r.nonce, renew=True)

    def excerpt(name: str) -> list[str]:
        r = by_name[name]
        return list(status_node(cluster[name], r.python, r.remote_dir, tail=200, nonce=r.nonce).tail)

    pushed = Pushed(
        [p.node.name for p in plan.nodes],
        poll_one,
        silent_after=tune.silent_after_s,
        first_frame_s=grace / 2,
        interval=interval,
        stale_after=grace / 2,
        no_answer_s=tune.no_answer_s,
    )
    specs = [NodeSpec(p.node.name, p.node_rank, p.global_ranks.start, p.node.nproc_per_node) for p in plan.nodes]
    dog = Watchdog(inv.job.stall_timeout_s)
    hang = HangWatch(dog, inv.job.on_stall, cluster, run, records, specs, say, excerpt)
    st = inv.job.straggler
    detector = Detector(st.share, st.windows, plan.world_size)
    slow = StragglerWatch(detector, st.action, specs, say, lambda found: run.update(stragglers=found))
    watch = chain(hang if inv.job.stall_timeout_s > 0 else None, slow)
    sup = Supervisor(
        specs,
        observe=pushed.observe,
        stop_all=lambda: stop_all(cluster, records, inv.job.stop_grace_s),
        excerpt=excerpt,
        confirm=lambda names: status_all(cluster, [r for r in records if r.node in names], timeout=3.0),
        interval=min(interval, 0.5),
        unreachable_grace=grace,
        sleep=pushed.wait,
        on_update=lambda nodes: record.update_nodes(nodes),
        offsets_s=offsets_s(run, inv),
        watch=watch,
        warn=say.warning,
    )
    stop_logs = threading.Event()
    logs = threading.Thread(
        target=_stream_logs,
        args=(say, run, inv, cluster, stop_logs, pushed, dog, attempt == 1, detector),
        daemon=True,
        name="logs",
    )
    logs.start()
    pushed.start()
    try:
        outcome = sup.run()
    finally:
        # the supervisor stops every node on its way out (its own `finally`): no second stop
        # here, unless it never got that far; what it saw of the nodes is recorded either way
        end.stop = not sup.torn_down
        if sup.torn_down:
            end.nodes, end.teardown_s, end.not_stopped = dict(sup.nodes), sup.teardown_s, dict(sup.not_stopped)
        pushed.close(wait=5.0)
        # every node is final now: the follower drains the last lines and its node-side readers
        # exit on their own (closing them early would leave them to die later, on a broken pipe);
        # a node teardown could not reach will never be final, so do not wait long for it
        logs.join(timeout=2.0 if sup.not_stopped else 10.0)
        stop_logs.set()
        logs.join(timeout=2.0)
        end.wall_s = time.monotonic() - t0
        end.fields = {"wall_s": round(end.wall_s, 3), "teardown_s": sup.teardown_s}
    end.teardown_s, end.not_stopped = outcome.teardown_s, dict(outcome.not_stopped)
    if outcome.state == RunState.FAILED and down_requested(run):
        # `orch down` from another shell: the nodes it stopped are not a failure of the job
        return UpOutcome(UpResult.STOPPED, run.run_id, report)
    end.state = outcome.state
    if outcome.failure is not None:
        end.fields["first_failure"] = outcome.failure.to_json()
    return UpOutcome(
        UpResult.SUCCEEDED if outcome.state == RunState.SUCCEEDED else UpResult.FAILED,
        run.run_id,
        report,
        failure=outcome.failure,
    )


def _stream_logs(
    say: UpProgress,
    run: RunDir,
    inv: Inventory,
    cluster: Cluster,
    stop: threading.Event,
    pushed: Pushed,
    dog: Watchdog | None = None,
    from_start: bool = True,
    detector: Detector | None = None,
) -> None:
    """The merged log (host and rank on every line) to `say.line` until the run ends or `stop`
    is set; the node status the streams carry goes to `pushed` (the supervisor's observations),
    every rank's line to the hang watchdog, the agents' telemetry lines and the ranks' timing
    lines to the straggler detector (and not to `say.line`: they are merged.log's and `orch
    logs`', too many for a console). A straggler the detector names becomes a line of the merged
    log (`Follower.say`: controller.log, merged.log), right after the line that completed its
    window. A relaunch (`from_start` False) follows each node from where the last attempt's copy
    ends, appending to merged.log."""
    from .logs.follow import Follower
    from .logs.telemetry import parse_sample, timing_window

    quiet = QuietStop()  # what a node prints once stopped stays in its log: one line says it stopped
    try:
        offsets, _origin = clock_offsets(run, inv.name)
        follower = Follower(
            run,
            inv,
            cluster,
            offsets_ms=offsets,
            on_event=say.log_event,
            from_start=from_start,
            on_status=lambda node, status: pushed.status(node, NodeStatus.from_json(status)),
            on_frame=pushed.frame,
            lease=True,
        )
        for line in follower.lines(stop):
            if dog is not None and line.rank is not None:
                dog.progress()
            if line.node == follower.controller:
                continue  # the controller's own line (a straggler named): said already, on stderr
            if line.stream == "orch":
                sample = parse_sample(line)
                if sample is not None:
                    if detector is not None:
                        detector.load(sample.load())
                    continue
            elif line.rank is not None:
                found = timing_window(line, offsets.get(line.node, 0.0) / 1000.0)
                if found is not None:
                    if detector is not None:
                        for named in detector.window(found[0]):  # a line of the merged log (said on stderr)
                            follower.say(named.log_ts, named.line())
                    continue
            shown = quiet.feed(line)
            if isinstance(shown, NodeStopped):
                say.node_stopped(shown)
            elif shown is not None:
                say.line(shown)
        for pending in quiet.pending():
            say.node_stopped(pending)
    except Exception as exc:  # log streaming must never take supervision down with it
        if dog is not None:
            dog.off(f"log streaming stopped: {exc}")
        say.log_stopped(exc)
