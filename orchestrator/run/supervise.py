"""Supervise a launched run: watch every node's agent, fail fast, tear down in `finally`.

A run is a small state machine (torch elastic's `SimpleElasticAgent.run` is the model):

    running ──(every node succeeded)──────────────────────────▶ succeeded
       │
       ├──(a node exited non-zero / its agent vanished /
       │   it stayed unreachable longer than the grace)──▶ teardown ─▶ failed
       └──(Ctrl-C, or any exception)──────────────────────▶ teardown ─▶ re-raised

Teardown (stop every node's process group, in parallel) runs in `finally`, so no path out of
`Supervisor.run` leaves ranks hanging on the other nodes. The side effects (`observe`, `stop_all`,
`excerpt`) are injected: `orchestrator/up.py` binds them to real transports, unit tests to scripts.

Where observations come from: an attached `orch up` takes them from the node status its log
streams push (`Pushed`), and polls a node's agent over SSH (`Poller`) only while that node's
stream is silent; `orch status` of a detached run asks every agent once.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..contract import FINAL_STATES, NodeState, RunState
from ..errors import TransportError
from ..node.agent import STREAMS
from ..node.telemetry import PREFIX as TELEMETRY_PREFIX
from ..waits import sigterm_as_interrupt as sigterm_as_interrupt  # defined with the waits it ends
from .agents import NodeStatus, StopResult
from .cause import (
    AFTER_S,
    BEFORE_S,
    CONSEQUENCE,
    EXCEPTION,
    TRACEBACK,
    WORKER,
    WRAPPERS,
    cause,
    consequence,
    hint_of,
    local_rank_of,
    raised,
    root_cause,
    worker_lines,
)
from .resume import PREEMPTED_LINE


@dataclass(frozen=True)
class Tunables:
    """How an attached `orch up` supervises, in seconds: each read from its environment variable
    (`ENV`; a value that is not a positive number keeps the default). The one definition of these
    defaults: docs/CONTRACT.md's table is tested against it."""

    poll_interval_s: float = 1.0
    """How often a node whose log stream is silent is polled (`agent.py status`)."""
    stream_silent_s: float = 3.0
    """How long a node's log stream may be silent before the node is polled (at most half the grace)."""
    unreachable_grace_s: float = 10.0
    """How long a node may be unreachable (its stream silent and a poll of it failed to connect)
    before the run fails."""
    no_answer_s: float = 120.0
    """How long a status poll that reached its node may take to answer (a `run_root` on a
    stalled NFS server) before the node counts as unreachable: no answer yet is not down."""

    ENV: ClassVar[dict[str, str]] = {
        "poll_interval_s": "ORCH_POLL_INTERVAL_S",
        "stream_silent_s": "ORCH_STREAM_SILENT_S",
        "unreachable_grace_s": "ORCH_UNREACHABLE_GRACE_S",
        "no_answer_s": "ORCH_NO_ANSWER_S",
    }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Tunables:
        env = os.environ if environ is None else environ
        values = {}
        for name, var in cls.ENV.items():
            try:
                value = float(env.get(var, ""))
            except ValueError:
                continue
            if value > 0 and math.isfinite(value):
                values[name] = value
        return cls(**values)

    @property
    def lease_s(self) -> float:
        """An attached run's lease on each node: 3 × the unreachable grace. A node that has not
        heard from the controller for that long (a cut link, a dead `orch up`) stops its ranks."""
        return 3 * self.unreachable_grace_s

    @property
    def silent_after_s(self) -> float:
        """When a silent stream's node is polled: `stream_silent_s`, at most half the grace."""
        return min(self.stream_silent_s, self.unreachable_grace_s / 2)


EXCERPT_LINES = 20

Observation = NodeStatus | Exception


@dataclass(frozen=True)
class NodeSpec:
    """What the supervisor needs to know about one node of the plan."""

    name: str
    node_rank: int
    base_rank: int
    nproc: int


@dataclass
class Failure:
    """The first failure of a run: which node, why, and the lines that show it."""

    node: str
    node_rank: int
    reason: str
    exit_code: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    excerpt: list[str] = field(default_factory=list)
    order: float = math.inf
    """When it happened (node epoch seconds); the earliest candidate is the first failure."""
    cause: str | None = None
    """What ended the failing rank (or torchrun), in one line, read from the node's log (`cause.py`);
    None: nothing more than `reason` is known."""
    hint: str | None = None
    """What usually fixes that cause."""
    signal: str | None = None
    """The signal that ended the failing process: the rank torchrun blames, else torchrun itself."""

    @property
    def summary(self) -> str:
        """The one line that says why: the cause, else the reason."""
        return self.cause or self.reason

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "node_rank": self.node_rank,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "cause": self.summary,
            "hint": self.hint,
            "signal": self.signal,
            "excerpt": list(self.excerpt),
        }

    def explain(self, raw_lines: Sequence[str]) -> None:
        """Read the excerpt, the rank torchrun blames and the cause from the node's last log lines
        (node.log lines, oldest first; none when the log could not be read)."""
        texts = [log_text(r) for r in raw_lines]
        if raw_lines:
            self.excerpt, rank, local = select_excerpt(raw_lines)
            if rank is not None and self.rank is None:  # a hang names its rank from the stacks
                self.rank, self.local_rank = rank, local
        found = cause(texts, node=self.node, signal=self.signal)
        if found is not None:
            self.cause, self.hint, self.signal = found.text, found.hint, found.signal or self.signal


@dataclass
class Outcome:
    """How a supervised run ended."""

    state: RunState
    wall_s: float
    failure: Failure | None = None
    teardown_s: float | None = None
    not_stopped: dict[str, str] = field(default_factory=dict)
    """Nodes teardown could not confirm as stopped, with the reason (e.g. unreachable)."""


# ----------------------------------------------------------------------------- pure helpers


def log_text(raw: str) -> str:
    """The text of a node.log line (`<ts> <stream> <text>`), or the line itself if it is not one."""
    parts = raw.split(" ", 2)
    if len(parts) == 3 and parts[0].endswith("Z") and parts[1] in STREAMS:
        return parts[2]
    return raw


SUMMARY_LINE = re.compile(r"^(?:\[\d+\]:|  |-{8,}|={8,}|Failures:|Root Cause)")
"""A line of torchrun's failure summary: an entry's number, a field, its traceback, a rule, a heading."""


def boilerplate(texts: Sequence[str]) -> set[int]:
    """The lines of a node log (texts) an excerpt leaves out; they stay in the log: the agent's
    telemetry lines, torchrun's failure summary (`==== ... FAILED`, `Failures:`, `Root Cause (first
    observed failure)`, `error_file`, to its closing `====`), its note of the error file it copies,
    and its own traceback ending in its `ChildFailedError`: the worker's exception above them says it,
    `cause` names it."""
    hidden = {
        i
        for i, t in enumerate(texts)
        if t.startswith(TELEMETRY_PREFIX + "{") or ("error_handler.py" in t and "error file" in t)
    }
    own = [i for i, t in enumerate(texts) if not WORKER.match(t)]  # not a worker's line (no worker field)
    for k, i in enumerate(own):
        t = texts[i]
        if any(w in t for w in WRAPPERS) and EXCEPTION.match(t.strip()):
            start = next((j for j in reversed(own[:k]) if texts[j].strip() == TRACEBACK), i)
            hidden.update(j for j in own if start <= j <= i)
        elif t.startswith("====") and k + 1 < len(own) and texts[own[k + 1]].rstrip().endswith(" FAILED"):
            close = next((j for j in own[k + 2 :] if texts[j].startswith("====")), own[-1])
            hidden.update(j for j in own if i <= j <= close)
    rc = root_cause(texts)
    if rc is not None and rc[0] not in hidden:  # a summary whose head was cut off: back to its first entry
        first, last = rc[0], rc[1]
        while first > 0 and first - 1 not in hidden and SUMMARY_LINE.match(texts[first - 1]):
            first -= 1
        hidden.update(range(first, last + 1))
    return hidden


def select_excerpt(
    raw_lines: Sequence[str], n: int = EXCERPT_LINES, worker: int | None = None
) -> tuple[list[str], int | None, int | None]:
    """The failure excerpt of a node log, and the (rank, local rank) torchrun blames, if any.

    The last `n` lines, plus torchrun's whole Root Cause block and the blamed worker's last lines
    (`worker`: that local rank's instead) when they fall outside them: torchrun prints its own
    traceback after the worker's, so the worker's exception is often 30 lines above the end."""
    texts = [log_text(r) for r in raw_lines]
    hidden = boilerplate(texts)
    shown = [i for i in range(len(texts)) if i not in hidden]
    keep = set(shown[-n:])
    rank = local = None
    rc = root_cause(texts)
    end = len(texts)
    if rc is not None:
        first, _last, r, lr = rc
        end = first
        if r >= 0:
            rank, local = r, lr
    if worker is not None or local is not None:
        blamed = worker if worker is not None else local
        mine = [i for i, t in enumerate(texts[:end]) if local_rank_of(t) == blamed]  # whatever torchrun's role
        keep.update(mine[-8:])
    out: list[str] = []
    prev = None
    for i in sorted(keep):
        if prev is not None and i != prev + 1:
            out.append("…")
        out.append(texts[i])
        prev = i
    return out, rank, local


def blame(
    first: Failure,
    logs: Mapping[str, Sequence[str]],
    specs: Mapping[str, NodeSpec],
    offsets_s: Mapping[str, float] | None = None,
) -> Failure:
    """The failure to name: `first`, unless its cause is a lost peer (a consequence) and a rank
    raised a real exception from `BEFORE_S` before to `AFTER_S` after it, on any node (`logs`:
    node.log lines of the nodes that could be read, `first.node`'s among them): then the earliest
    such exception, on its node and rank. Where no rank raised, a rank that stopped for a
    preemption in that window (`PREEMPTED_LINE`: its checkpoint written) is named the same way."""
    if not consequence(first.cause) or first.node not in logs:
        return first
    offsets = offsets_s or {}
    mine = [
        r
        for r in raised(logs[first.node])
        if consequence(r.text) and (first.local_rank is None or r.local_rank == first.local_rank)
    ]
    when = mine[0].at - offsets.get(first.node, 0.0) if mine else first.order
    if when == math.inf:
        return first
    found = [
        (r.at - offsets.get(node, 0.0), node, r)
        for node, lines in logs.items()
        if node in specs
        for r in raised(lines)
        if not consequence(r.text)
    ]
    found = [f for f in found if when - BEFORE_S <= f[0] <= when + AFTER_S]
    verb = "raised"
    if not found:  # no rank raised: a rank that stopped for a preemption (its checkpoint written) is the cause
        verb = "stopped"
        found = [
            (r.at - offsets.get(node, 0.0), node, r)
            for node, lines in logs.items()
            if node in specs
            for r in worker_lines(lines, PREEMPTED_LINE)
        ]
        found = [f for f in found if when - BEFORE_S <= f[0] <= when + AFTER_S]
    if not found:
        return first
    at, node, r = min(found, key=lambda f: f[0])
    spec = specs[node]
    lost = f"rank {first.rank}" if first.rank is not None else "a rank"
    said = CONSEQUENCE.search(first.cause or "")
    note = (
        f"{lost} on {first.node} lost its peer {abs(when - at):.3f} s {'after' if when >= at else 'before'} "
        f"this ({said.group() if said else first.cause}): a consequence of it"
    )
    hint = hint_of(r.text)
    real = Failure(
        node,
        spec.node_rank,
        first.reason if node == first.node else f"a rank {verb}: {r.text}",
        first.exit_code if node == first.node else None,
        spec.base_rank + r.local_rank,
        r.local_rank,
        order=min(first.order, at),
        cause=r.text,
        hint=f"{hint}; {note}" if hint else note,
    )
    real.excerpt = select_excerpt(logs[node], worker=r.local_rank)[0]
    return real


def run_state(node_states: Sequence[str], recorded: str | None) -> RunState:
    """A run's state from its nodes' (for `orch status` of a detached run). Final states stick; a
    run.json without a state it knows reads as starting."""
    recorded = recorded if recorded in set(RunState) else RunState.STARTING
    if recorded in FINAL_STATES:
        return RunState(recorded)
    if node_states and all(s == NodeState.SUCCEEDED for s in node_states):
        return RunState.SUCCEEDED
    if any(s == NodeState.FAILED for s in node_states):
        return RunState.FAILED
    if any(s in (NodeState.RUNNING, NodeState.STARTING) for s in node_states):
        return RunState.RUNNING
    if node_states and all(s in FINAL_STATES for s in node_states):
        return RunState.STOPPED
    return RunState(recorded)


def corrected(failure: Failure | None, offsets_s: Mapping[str, float]) -> Failure | None:
    """A failure whose `order` (the node's clock) is moved to the reference clock."""
    if failure is not None and failure.order != math.inf:
        failure.order -= offsets_s.get(failure.node, 0.0)
    return failure


# ----------------------------------------------------------------------------- polling


class Poller:
    """One thread per node calls `poll_one(name)` every `interval`; `observe()` reads the latest.

    Threads keep a slow or dead node from delaying the verdict on the others. A call that has
    been in flight longer than `stale_after` is reported as a TimeoutError. With `wanted`, a
    node is polled only while `wanted(name)` is true (checked every `interval`, at most 0.2 s)."""

    def __init__(
        self,
        names: Sequence[str],
        poll_one: Callable[[str], NodeStatus],
        *,
        interval: float = 1.0,
        stale_after: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
        wanted: Callable[[str], bool] | None = None,
    ) -> None:
        self.names = list(names)
        self.poll_one = poll_one
        self.interval = interval
        self.stale_after = stale_after
        self.clock = clock
        self.wanted = wanted
        self.latest: dict[str, Observation] = {}
        self.answered: dict[str, float] = {}
        """When each node's latest answer (or exception) came, on `clock`."""
        self.answered_ok: dict[str, float] = {}
        """When each node last answered with a status (it was reachable then)."""
        self.calls = 0
        self.inflight: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(n,), daemon=True, name=f"poll-{n}") for n in self.names
        ]

    def start(self) -> Poller:
        for t in self.threads:
            t.start()
        return self

    def _loop(self, name: str) -> None:
        while not self.stop.is_set():
            if self.wanted is not None and not self.wanted(name):
                self.stop.wait(min(self.interval, 0.2))
                continue
            with self.lock:
                self.inflight[name] = self.clock()
                self.calls += 1
            try:
                result: Observation = self.poll_one(name)
            except Exception as exc:  # judged by the supervisor: unreachable for how long
                result = exc
            with self.lock:
                self.inflight.pop(name, None)
                self.latest[name] = result
                self.answered[name] = self.clock()
                if not isinstance(result, Exception):
                    self.answered_ok[name] = self.answered[name]
            self.stop.wait(self.interval)

    def observe(self) -> dict[str, Observation]:
        now = self.clock()
        with self.lock:
            out = dict(self.latest)
            for name, since in self.inflight.items():
                if now - since > self.stale_after:
                    out[name] = Unanswered(now - since, since)
        return out

    def snapshot(self) -> tuple[dict[str, Observation], dict[str, float], dict[str, float], dict[str, float]]:
        """(latest answers, when they came, when each node last answered a status, calls in flight)."""
        with self.lock:
            return dict(self.latest), dict(self.answered), dict(self.answered_ok), dict(self.inflight)

    def close(self, wait: float = 0.0) -> None:
        """Stop polling; wait up to `wait` s for calls in flight, so none outlives the controller."""
        self.stop.set()
        deadline = time.monotonic() + wait
        with self.lock:
            hung = {n for n, since in self.inflight.items() if self.clock() - since > self.stale_after}
        for name, t in zip(self.names, self.threads):
            if t.is_alive() and name not in hung:  # a call to an unreachable node ends on its own
                t.join(max(0.0, deadline - time.monotonic()))


class Unanswered(TimeoutError):
    """A poll still in flight after `stale_after`: the node counts as unreachable since it began."""

    def __init__(self, waited: float, since: float) -> None:
        super().__init__(f"no answer for {waited:.0f} s")
        self.since = since


class Silent(ConnectionError):
    """A node whose log stream went silent and whose agent cannot be asked either: unreachable
    since it was last heard from (a stream frame or a status answer)."""

    def __init__(self, cause: Exception, since: float) -> None:
        super().__init__(str(cause))
        self.since = since
        self.cause = cause


def gone(obs: Exception) -> bool:
    """Whether a node cannot be reached because its allocation has ended (TransportError `gone`):
    final, nothing can run there any more, so no unreachable grace is waited out."""
    cause = obs.cause if isinstance(obs, Silent) else obs
    return isinstance(cause, TransportError) and cause.kind == "gone"


class Pushed:
    """Observations pushed by the nodes' log streams; an SSH poll only for a silent node.

    Each node's log reader sends the node's status when it changes (`status`) and some frame at
    least every 0.2 s (`frame`). A node heard from within `silent_after` is judged on what it
    pushed, so a healthy run costs no status exec at all. A node whose stream is silent (down,
    reconnecting, stalled behind a slow merge, never up) is polled by a `Poller` as before, and
    whichever is newer, the pushed status or the poll's answer, is its observation. If the poll
    fails or hangs, the node is unreachable since it was last heard from: the supervisor's grace
    then means "silent that long". A final pushed state is the node's last word (its stream ends
    after it), so it is never polled. A stream's first frame may take `first_frame_s` (a login
    shell and a python start on a node busy starting its job) before its node counts as silent.

    No answer yet is not down: a poll still in flight (it reached the node: a connection that
    fails raises, and that is judged as above) leaves the node judged on what it last said, for
    up to `no_answer_s` (a slow disk under `run_root`); past that it is unreachable since last heard."""

    def __init__(
        self,
        names: Sequence[str],
        poll_one: Callable[[str], NodeStatus],
        *,
        silent_after: float = 3.0,
        first_frame_s: float = 0.0,
        interval: float = 1.0,
        stale_after: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        no_answer_s: float = 120.0,
    ) -> None:
        self.names = list(names)
        self.no_answer_s = max(no_answer_s, stale_after)
        self.silent_after = silent_after
        self.first_frame_s = max(silent_after, first_frame_s)
        self.clock = clock
        now = clock()
        self.heard: dict[str, float] = {n: now for n in self.names}  # silence counts from the start
        self.unheard = set(self.names)
        self.pushed: dict[str, tuple[float, NodeStatus]] = {}
        self.lock = threading.Lock()
        self.news = threading.Event()
        self.poller = Poller(
            self.names, poll_one, interval=interval, stale_after=stale_after, clock=clock, wanted=self.silent
        )

    def start(self) -> Pushed:
        self.poller.start()
        return self

    # -- fed by the log streams (reader threads)

    def frame(self, name: str) -> None:
        """Any frame from the node's stream: it is alive."""
        with self.lock:
            self.heard[name] = self.clock()
            self.unheard.discard(name)

    def status(self, name: str, status: NodeStatus) -> None:
        """The node's status, as its reader sent it."""
        with self.lock:
            now = self.clock()
            self.heard[name] = now
            self.unheard.discard(name)
            self.pushed[name] = (now, status)
        self.news.set()

    # -- read by the supervisor

    def silent(self, name: str) -> bool:
        """Is this node's stream silent (and its state not final)? Then it is polled."""
        with self.lock:
            pushed = self.pushed.get(name)
            if pushed is not None and pushed[1].state in FINAL_STATES:
                return False
            return self._quiet(name, self.clock())

    def _quiet(self, name: str, now: float) -> bool:
        """Silent longer than its stream may be (under the lock)."""
        allowed = self.first_frame_s if name in self.unheard else self.silent_after
        return now - self.heard[name] >= allowed

    def observe(self) -> dict[str, Observation]:
        latest, answered, answered_ok, inflight = self.poller.snapshot()
        now = self.clock()
        out: dict[str, Observation] = {}
        with self.lock:
            for name in self.names:
                at, pushed = self.pushed.get(name, (-math.inf, None))
                heard = self.heard[name]
                if pushed is not None and (pushed.state in FINAL_STATES or not self._quiet(name, now)):
                    out[name] = pushed
                    continue
                # the stream is silent: a poll decides, once it has answered since
                poll, poll_at = latest.get(name), answered.get(name, -math.inf)
                alive_at = max(heard, answered_ok.get(name, -math.inf))
                asked = inflight.get(name)
                if asked is not None and now - asked > self.no_answer_s:
                    out[name] = Unanswered(now - alive_at, alive_at)
                elif isinstance(poll, Exception) and poll_at > heard:
                    out[name] = Silent(poll, alive_at)
                elif isinstance(poll, NodeStatus) and poll_at > at:
                    out[name] = poll
                elif pushed is not None:
                    out[name] = pushed
        return out

    def wait(self, timeout: float) -> None:
        """The supervisor's sleep: over early when a node pushes a new status."""
        self.news.wait(timeout)
        self.news.clear()

    @property
    def polls(self) -> int:
        """Status polls made so far (each an SSH exec)."""
        return self.poller.calls

    def close(self, wait: float = 0.0) -> None:
        self.poller.close(wait)


@contextmanager
def sigint_shielded() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM while tearing down: a second one must not leave nodes half-stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


# ----------------------------------------------------------------------------- the state machine


class Supervisor:
    """Poll, judge, and stop everything on the first failure (or any exit path)."""

    def __init__(
        self,
        specs: Sequence[NodeSpec],
        *,
        observe: Callable[[], Mapping[str, Observation]],
        stop_all: Callable[[], Mapping[str, StopResult | Exception]],
        excerpt: Callable[[str], Sequence[str]] | None = None,
        confirm: Callable[[Sequence[str]], Mapping[str, Observation]] | None = None,
        interval: float = 1.0,
        unreachable_grace: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_update: Callable[[Mapping[str, NodeStatus]], object] | None = None,
        offsets_s: Mapping[str, float] | None = None,
        watch: Callable[[], Failure | None] | None = None,
        warn: Callable[[str], object] | None = None,
    ) -> None:
        self.specs = {s.name: s for s in specs}
        self.warn = warn
        """Told once per node what it says goes wrong while the run goes on (its run root full)."""
        self.said_full: set[str] = set()
        self.offsets_s = dict(offsets_s or {})
        """Each node's clock offset (s, node minus reference) as `orch check` measured it: a node
        reports when it failed on its own clock, so failures are ordered on the reference clock."""
        self.observe = observe
        self.stop_all = stop_all
        self.excerpt = excerpt
        self.confirm = confirm
        self.interval = interval
        self.grace = unreachable_grace
        self.clock = clock
        self.sleep = sleep
        self.on_update = on_update
        self.watch = watch
        """Asked once a round while every node runs: a failure nothing a node reports shows (a
        hang, `watchdog.py`), or None. It may take its time: the nodes are still running."""
        self.nodes: dict[str, NodeStatus] = {n: NodeStatus(NodeState.STARTING) for n in self.specs}
        self.unreachable_since: dict[str, float] = {}
        self.failure: Failure | None = None
        self.teardown_s: float | None = None
        self.not_stopped: dict[str, str] = {}
        self.torn_down = False

    def run(self) -> Outcome:
        """Supervise until success or the first failure; teardown is guaranteed on every path."""
        start = self.clock()
        try:
            while True:
                verdict = self.judge(self.observe(), self.clock())
                if verdict == RunState.RUNNING and self.watch is not None:
                    self.failure = self.watch()
                    verdict = RunState.FAILED if self.failure is not None else verdict
                if verdict == RunState.SUCCEEDED:
                    # every agent has exited after its cleanup, and says what that cleanup left
                    self.torn_down = True
                    return Outcome(RunState.SUCCEEDED, self.clock() - start, not_stopped=self.cleanup_left())
                if verdict == RunState.FAILED:
                    self.teardown()
                    self.attach_excerpt()
                    return Outcome(
                        RunState.FAILED, self.clock() - start, self.failure, self.teardown_s, self.not_stopped
                    )
                self.sleep(self.interval)
        finally:
            if not self.torn_down:
                self.teardown()

    def judge(self, observations: Mapping[str, Observation], now: float) -> RunState:
        """Fold one round of observations into node states; return running|succeeded|failed."""
        candidates: list[Failure] = []
        changed = False
        for name, spec in self.specs.items():
            obs = observations.get(name)
            if obs is None:
                continue  # no answer yet from its first poll
            if isinstance(obs, Exception):
                since = self.unreachable_since.setdefault(name, getattr(obs, "since", now))
                changed |= self._set(name, NodeStatus(NodeState.UNREACHABLE, error=str(obs)))
                if gone(obs):
                    candidates.append(Failure(name, spec.node_rank, str(obs), order=time.time() - (now - since)))
                elif now - since >= self.grace:
                    candidates.append(
                        Failure(
                            name,
                            spec.node_rank,
                            f"unreachable for {now - since:.0f} s: {obs}",
                            order=time.time() - (now - since),
                        )
                    )
                continue
            self.unreachable_since.pop(name, None)
            if obs.disk_full and name not in self.said_full and self.warn is not None:
                self.said_full.add(name)
                self.warn(f"node {name}: {obs.disk_full}")
            changed |= self._set(name, obs)
            failure = self.failure_of(spec, obs)
            if failure is not None:
                candidates.append(failure)
        if changed and self.on_update is not None:
            self.on_update(self.nodes)
        if candidates:
            candidates += self.confirmed(observations)
            self.failure = min(candidates, key=lambda f: f.order)
            return RunState.FAILED
        if all(n.state == NodeState.SUCCEEDED for n in self.nodes.values()):
            return RunState.SUCCEEDED
        return RunState.RUNNING

    def _set(self, name: str, value: NodeStatus) -> bool:
        old = self.nodes.get(name)
        self.nodes[name] = value
        return old is None or old.state != value.state or old.exit_code != value.exit_code

    def confirmed(self, seen: Mapping[str, Observation]) -> list[Failure]:
        """Failures a fresh poll finds on the nodes that looked healthy in this round.

        Polls are not simultaneous: a node that failed first may have been asked just before it
        did, while a later victim was asked just after. One more look orders them by exit time."""
        if self.confirm is None:
            return []
        healthy = [
            n
            for n, o in seen.items()
            if isinstance(o, NodeStatus) and n in self.specs and self.node_failure(self.specs[n], o) is None
        ]
        if not healthy:
            return []
        out = []
        for name, obs in self.confirm(healthy).items():
            if name in healthy and isinstance(obs, NodeStatus):
                failure = self.failure_of(self.specs[name], obs)
                if failure is not None:
                    out.append(failure)
                    self.nodes[name] = obs
        return out

    def failure_of(self, spec: NodeSpec, obs: NodeStatus) -> Failure | None:
        """`node_failure`, ordered on the reference clock (the node's offset taken out)."""
        return corrected(self.node_failure(spec, obs), self.offsets_s)

    @staticmethod
    def node_failure(spec: NodeSpec, obs: NodeStatus) -> Failure | None:
        """Is this node's report a failure? A non-zero exit, an outside stop, or a vanished agent."""
        state, code = obs.state, obs.exit_code
        when = float(obs.finished_at or obs.now or math.inf)
        if state == NodeState.FAILED:
            # when torchrun saw its first worker fail, where it said: a victim of that failure
            # elsewhere fails later, though its torchrun may exit sooner than this one
            when = min(when, obs.failed_at or math.inf)
            why = f"exited with code {code}" + (f" ({obs.signal})" if obs.signal else "")
            if obs.reason:
                why += f": {obs.reason}"
            if obs.disk_full:
                why += f" ({obs.disk_full})"
            return Failure(spec.name, spec.node_rank, why, code, order=when, signal=obs.signal)
        if state == NodeState.STOPPED:  # the agent's own reason when it stopped the job itself (its lease ran out)
            why = (
                f"was stopped on its node: {obs.reason}"
                if obs.reason
                else "was stopped from outside this `orch up` (orch down?)"
            )
            return Failure(spec.name, spec.node_rank, why, code, order=when)
        if state not in FINAL_STATES and obs.agent_alive is False:
            gone = "its job is gone too" if not obs.job_alive else "its job is still running"
            full = f" ({obs.disk_full})" if obs.disk_full else ""
            return Failure(
                spec.name, spec.node_rank, f"the node agent (pid {obs.agent_pid}) disappeared{full}; {gone}", order=when
            )
        return None

    def cleanup_left(self) -> dict[str, str]:
        """The nodes whose agent's cleanup timed out at the job's end, with what it left running."""
        return {
            name: f"the job's cleanup timed out: processes still running: {list(st.cleanup_left)}"
            for name, st in self.nodes.items()
            if st.cleanup_left
        }

    def teardown(self) -> None:
        """Stop every node (in parallel, idempotent) and remember which could not be confirmed."""
        if self.torn_down:
            return
        self.torn_down = True
        t0 = self.clock()
        with sigint_shielded():
            results = self.stop_all()
        self.teardown_s = self.clock() - t0
        for name, res in results.items():
            if isinstance(res, Exception):
                self.not_stopped[name] = str(res)
            elif res.remaining:
                self.not_stopped[name] = f"processes still running: {list(res.remaining)}"
            elif (
                res.status is not None
                and res.status.state in FINAL_STATES
                and name in self.nodes
                and self.nodes[name].state not in FINAL_STATES
            ):
                # what the stop found: a node last seen running whose agent was killed under it
                # (a Slurm step's --kill-on-bad-exit past KillWait) is recorded as the stop left it
                self.nodes[name] = res.status

    def attach_excerpt(self) -> None:
        """The first failure's excerpt and cause, from its node's log read after the teardown."""
        f = self.failure
        if f is None or f.excerpt:
            return  # taken before the teardown (a hang: the lines before the silence, not the stop's)
        if self.excerpt is None or f.node in self.not_stopped:
            f.explain([])  # an unreachable node cannot show its log now
            return
        try:
            raw = list(self.excerpt(f.node))
        except Exception as exc:  # the failure is reported even when its log cannot be read
            f.explain([])
            f.excerpt = [f"(cannot read the node's log: {exc})"]
            return
        f.explain(raw)
        if consequence(f.cause):  # a lost peer: the rank that raised is named instead
            read = self.excerpt

            def tail(name: str) -> list[str]:
                try:
                    return list(read(name))
                except Exception:  # a node whose log cannot be read now cannot be blamed
                    return []

            others = [n for n in self.specs if n != f.node and n not in self.not_stopped]
            with ThreadPoolExecutor(max_workers=max(1, min(16, len(others)))) as pool:
                logs = {f.node: raw, **dict(zip(others, pool.map(tail, others)))}  # bounded: transport timeouts
            self.failure = blame(f, logs, self.specs, self.offsets_s)
