"""The hang watchdog of an attached `orch up`: no rank has written a line for `job.stall_timeout_s`.

A hang is the failure nothing else sees: one rank stuck (in a collective, a data loader, a
deadlock), every other rank waiting for it in a collective, no output, no exit, until NCCL's
timeout half an hour later, if ever. Progress is what the ranks print: every line of the merged
log that comes from a worker (torchrun's `--tee` gives it a rank) resets the clock; torchrun's
and the agent's own lines do not (torchrun keeps talking while its workers hang). Lines are
timed on the controller as the log streams deliver them, so node clocks do not matter. The clock
starts with the first line of any rank: start-up (imports, dataset caching, rendezvous) takes
very different times and has timeouts of its own (torchrun's rendezvous, the process group's).

`Watchdog` only keeps that clock (fed from the log streaming thread, read by the supervisor);
`hang_failure` turns a stall and the stacks taken at that moment (`stacks.py`) into the run's
first failure, naming the prime suspect: a rank whose process is stopped or in uninterruptible
sleep (no stack can be taken of it), else the rank whose stack differs from the others', else a
rank that gave no stack while the others did. `HangWatch` is the
supervisor's `watch` hook that uses both: on a stall it takes and saves every rank's stack,
reports them, and with `job.on_stall: stop` returns the failure; `orchestrator/up.py` builds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import OrchError
from ..store import NodeRecord, RunDir
from ..transport import Cluster
from .stacks import STUCK, RankStack, StackGroup, StacksReport, odd_ranks, save, take_stacks
from .supervise import Failure, NodeSpec, select_excerpt


class Watchdog:
    """The time since the last line of any rank, and whether this stall was reported already."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self.last: float | None = None
        """When a rank last wrote a line; None until the first one (start-up is not judged)."""
        self.reported: float | None = None
        self.blind: str | None = None
        """Why the watchdog cannot judge any more (the log streams stopped), or None."""
        self.lock = threading.Lock()

    def progress(self, at: float | None = None) -> None:
        """A rank wrote a line (now, or at `at` on this clock)."""
        with self.lock:
            now = self.clock() if at is None else at
            self.last = now if self.last is None else max(self.last, now)

    def off(self, why: str) -> None:
        """Stop judging: without the log streams silence means nothing."""
        with self.lock:
            self.blind = why

    def silent_s(self, now: float | None = None) -> float | None:
        """Seconds since a rank last wrote a line; None before the first."""
        with self.lock:
            return None if self.last is None else (self.clock() if now is None else now) - self.last

    def stalled(self, now: float | None = None) -> float | None:
        """The seconds of silence when no rank has written for `timeout_s` and this stall has not
        been reported yet (then it counts as reported); None otherwise. A line from any rank
        ends the stall, and the next silence of `timeout_s` is a new one."""
        with self.lock:
            now = self.clock() if now is None else now
            if self.blind is not None or self.timeout_s <= 0 or self.last is None or now - self.last < self.timeout_s:
                return None
            if self.reported is not None and self.reported >= self.last:
                return None
            self.reported = now
            return now - self.last


def hang_failure(
    silent_s: float,
    timeout_s: float,
    report: StacksReport | None,
    specs: Sequence[NodeSpec],
    problem: str | None = None,
) -> Failure:
    """A stall as the run's first failure, on the node of its prime suspect: a rank whose process
    is stopped or in uninterruptible sleep (`STUCK`: its stack could not be taken), else the rank
    whose stack differs from the majority's (both places named), else a rank that gave no stack
    while the others did; where every rank stands in the same place, it says so (and names the
    master). Without stacks, why there are none."""
    by_name = {s.name: s for s in specs}
    master = min(specs, key=lambda s: s.node_rank)
    head = f"hung: no rank wrote a line for {silent_s:.0f} s (stall timeout {timeout_s:g} s)"
    groups = report.groups if report is not None else []
    unread = sorted(
        (r for r in (report.ranks if report is not None else []) if r.error is not None and r.rank is not None),
        key=lambda r: (r.state not in STUCK, r.rank),
    )
    if unread and (unread[0].state in STUCK or (groups and not odd_ranks(groups))):
        return _suspect(head, unread[0], groups[0] if groups else None, by_name.get(unread[0].node, master))
    if not groups:
        why = problem or (", ".join(f"{k}: {v}" for k, v in report.problems.items()) if report else "")
        return Failure(master.name, master.node_rank, f"{head}; no stack could be taken ({why or 'no rank found'})")
    odd = odd_ranks(groups)
    if not odd:
        return Failure(
            master.name, master.node_rank, f"{head}; every rank stands in the same place: {groups[0].summary}"
        )
    group = next(g for g in groups if g.ranks == odd)
    rank = next(r for r in report.ranks if r.rank == odd[0]) if report is not None else None
    spec = by_name.get(rank.node, master) if rank is not None else master
    majority = groups[0]
    return Failure(
        spec.name,
        spec.node_rank,
        f"{head}; {group.label} stands apart: {group.summary}; {majority.label}: {majority.summary}",
        rank=odd[0],
        local_rank=rank.local_rank if rank is not None else None,
    )


def _suspect(head: str, rank: RankStack, majority: StackGroup | None, spec: NodeSpec) -> Failure:
    """The failure naming a rank that gave no stack (what its process was doing said first)."""
    why = (rank.error or "").splitlines()[0] if rank.error else "no stack"
    others = f"; {majority.label}: {majority.summary}" if majority is not None else ""
    return Failure(
        spec.name,
        spec.node_rank,
        f"{head}; rank {rank.rank} on {rank.node} gave no stack, the prime suspect: {why}{others}",
        rank=rank.rank,
        local_rank=rank.local_rank,
    )


class HangReporter(Protocol):
    """Who is told of a hang (`orch up`'s progress)."""

    def stalled(self, silent_s: float, timeout_s: float) -> None:
        """No rank wrote a line for `silent_s`: every rank's stack is being taken."""

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:
        """The stacks of a hang (grouped), or why there are none; `stop`: the run is torn down now."""


class HangWatch:
    """The supervisor's `watch` hook of an attached run: None while ranks make progress; on a stall,
    every rank's stack into the run directory (`stacks/<time>-hang.*`) and to `say`; with
    `on_stall` stop, the run's first failure (the odd rank named, the last lines of its node
    before the silence as the excerpt)."""

    def __init__(
        self,
        dog: Watchdog,
        on_stall: str,
        cluster: Cluster,
        run: RunDir,
        records: Sequence[NodeRecord],
        specs: Sequence[NodeSpec],
        say: HangReporter,
        excerpt: Callable[[str], list[str]],
    ) -> None:
        self.dog, self.on_stall, self.cluster, self.run = dog, on_stall, cluster, run
        self.records, self.specs, self.say, self.excerpt = records, specs, say, excerpt

    def __call__(self) -> Failure | None:
        silent = self.dog.stalled()
        if silent is None:
            return None
        timeout = self.dog.timeout_s
        self.say.stalled(silent, timeout)
        stacks: StacksReport | None = None
        problem = None
        try:
            stacks = take_stacks(self.cluster, self.run.run_id, self.records)
            save(self.run, stacks, tag="hang")
        except Exception as exc:  # a hang is still reported (and stopped) without its stacks
            problem = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OrchError) else exc.message
        stop = self.on_stall == "stop"
        self.say.stacks(stacks, problem, stop)
        if not stop:
            return None
        failure = hang_failure(silent, timeout, stacks, self.specs, problem)
        try:  # the node's last lines before the silence (after the teardown they are the stop's)
            failure.excerpt = select_excerpt(self.excerpt(failure.node))[0]
        except OrchError as exc:
            failure.excerpt = [f"(cannot read the node's log: {exc.message})"]
        return failure
