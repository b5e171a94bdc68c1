"""The straggler detector: a rank slower than the others, named with a reason, before it costs a day.

In synchronous DDP every rank's step takes as long as the slowest's: the fast ranks wait for the
slow one inside the gradient all-reduce, so images/s and wall time are the same everywhere and
tell nothing. What differs is the time each rank spends outside collectives, data wait plus
forward and loss, which every rank prints for each window of steps (`trainer/logs.timing_line`;
every rank ends its windows at the same batches). A window is judged once every rank has
reported it: a rank whose time per step outside collectives is above the median rank's divided
by `share` (0.8: 1.25 x the median) is slow in that window; slow for `windows` consecutive
windows, it is a straggler, and is named once (again only after it has recovered).

The reason comes from what that rank's window and its node's latest telemetry say:

- a throttling or hot GPU of that rank (`throttle` reasons, or 85 °C and above) → the GPU itself;
- most of its excess time waiting for data → the input pipeline on that node;
- every rank of that node slow while ranks elsewhere are not → the whole node;
- its GPU (the one whose index is its LOCAL_RANK) busy under `LOW_UTIL_PCT` with little data
  wait → waiting on others: its time outside the gradient collectives is spent waiting all the
  same (a collective inside forward: SyncBatchNorm, FSDP's gathers), the slow one is elsewhere;
- its GPU busy → compute-bound on that node; a node without GPUs (its telemetry found no
  nvidia-smi: the ranks compute on the CPU) → compute-bound too (a CPU share cannot tell waiting
  from being starved: a CPU quota lowers it as much as waiting does);
- no telemetry of that node, or none of that rank's GPU (nvidia-smi failed, the GPU missing or
  its utilisation unreadable, the rank's local rank unknown) → `unknown`: compute-bound or
  waiting on others cannot be told, and the reason says which telemetry is missing. Never a guess.

Pure: `Detector` is fed windows and node loads (the log streams' timing and telemetry lines, parsed
above this layer) with the time they were written, and returns what it found; nothing here reads
a clock. `StragglerWatch` is the supervisor's hook that says it, records it in run.json and, with
`job.straggler.action: stop`, fails the run naming the node (a retry then replaces that node with
a spare, `up.py`).
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..config.schema import StragglerModel
from .supervise import Failure, NodeSpec

HOT_C = 85.0
"""A GPU at or above this temperature counts as hot (datacentre GPUs slow down from ~85-90 °C)."""
LOW_UTIL_PCT = 50.0
"""A slow rank's GPU busy less than this (per cent), with little data wait, is waiting on others."""
KEEP_PENDING = 64
"""Windows kept waiting for their last rank; older ones are dropped (a rank that stopped reporting)."""
KEEP_SPEEDS = 1024
"""Judged windows kept for the report's heatmap: when there are twice as many, every other one is
dropped and from then on every other judged window kept, so a week of windows takes the memory
of at most 2 × KEEP_SPEEDS evenly spaced ones."""


@dataclass(frozen=True)
class Window:
    """One rank's timing of one window of steps."""

    node: str
    rank: int
    local_rank: int | None
    epoch: int
    batch: int
    steps: int
    data_s: float
    compute_s: float
    wall_s: float
    at: float
    """When the rank wrote it (epoch seconds)."""

    @property
    def key(self) -> tuple[int, int]:
        return self.epoch, self.batch

    @property
    def outside_s(self) -> float:
        """Seconds per step outside collectives (data wait + forward and loss)."""
        return (self.data_s + self.compute_s) / self.steps if self.steps else 0.0

    @property
    def data_per_step(self) -> float:
        return self.data_s / self.steps if self.steps else 0.0

    @property
    def data_share(self) -> float:
        return self.data_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class GpuLoad:
    index: int | None
    util_pct: float | None
    temp_c: float | None
    throttle: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeLoad:
    """What a node's latest telemetry line says, as far as the attribution needs it."""

    node: str
    cpu_pct: float | None
    rank_cpu_pct: Mapping[int, float | None] = field(default_factory=dict)
    gpus: tuple[GpuLoad, ...] = ()
    no_gpu: bool = False
    """The node has no GPU to judge by (its telemetry found no nvidia-smi): its ranks compute on the CPU."""
    gpu_error: str | None = None
    """Why the telemetry lists no GPU (`gpu_error` of the telemetry line)."""


@dataclass(frozen=True)
class Straggler:
    """A rank named slow: where, how slow, for how long, and why."""

    rank: int
    node: str
    speed: float
    """The median rank's time per step over this rank's (0.45: it takes 2.2 x as long)."""
    since: float
    """When its first slow window of this streak began (its line's time less its wall time)."""
    at: float
    """When the window that made it a straggler was written."""
    windows: int
    data_share: float
    cpu_pct: float | None
    kind: str
    """`gpu`, `data`, `node`, `waiting`, `compute` or `unknown` (`KINDS`)."""
    reason: str
    named_at: float | None = None
    """When the last rank's line of the window that named it was written: when it could be named."""

    def line(self) -> str:
        """`straggler: rank 2 on n3 at 0.45× the median for 3 min; data-wait 4 %, CPU 100 %: compute-bound on n3`."""
        facts = [f"data-wait {self.data_share:.0%}".replace("%", " %")]
        if self.cpu_pct is not None:
            facts.append(f"CPU {self.cpu_pct:.0f} %")
        return (
            f"straggler: rank {self.rank} on {self.node} at {self.speed:.2f}× the median for "
            f"{duration(self.at - self.since)}; {', '.join(facts)}: {self.reason}"
        )

    @property
    def log_ts(self) -> float:
        """Its line's time in the merged log: 1 µs after the line that completed the window that
        named it (the stamp's precision), so the merge puts it right after that line."""
        return (self.at if self.named_at is None else self.named_at) + 1e-6

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "speed": round(self.speed, 3),
            "since": round(self.since, 3),
            "at": round(self.at, 3),
            "windows": self.windows,
            "data_share": round(self.data_share, 4),
            "cpu_pct": self.cpu_pct,
            "kind": self.kind,
            "reason": self.reason,
            "line": self.line(),
        }


def duration(seconds: float) -> str:
    """`45 s`, `3 min`, `2 h 5 min`."""
    s = max(0, round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


class Detector:
    """Judges windows as they complete; thread-safe (fed from the log thread, read by the supervisor)."""

    def __init__(
        self, share: float = StragglerModel.share, windows: int = StragglerModel.windows, world_size: int | None = None
    ) -> None:
        self.share, self.windows, self.world_size = share, windows, world_size
        self.pending: dict[tuple[int, int], dict[int, Window]] = {}
        self.judged: tuple[int, int] | None = None
        self.streak: dict[int, list[Window]] = {}
        self.named: set[int] = set()
        self.loads: dict[str, NodeLoad] = {}
        self.ranks: dict[int, str] = {}
        self.found: list[Straggler] = []
        self.speeds: list[tuple[tuple[int, int], float, dict[int, float]]] = []
        """Judged windows, evenly spaced (every `speeds_every`-th: `KEEP_SPEEDS`): (key, when,
        {rank: median / its time}), for the report's heatmap."""
        self.speeds_every = 1
        self.judged_windows = 0
        self.last_speeds: dict[int, float] = {}
        """{rank: median / its time} of the last judged window."""
        self._unread = 0
        self.last_key: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()

    def load(self, load: NodeLoad) -> None:
        with self.lock:
            self.loads[load.node] = load

    def window(self, w: Window) -> list[Straggler]:
        """Account one rank's window; the stragglers named by the windows it completed."""
        with self.lock:
            before = self.last_key.get(w.rank)
            if before is not None and w.key <= before:
                self._restart()  # this rank went back: a relaunch (a retry resumed), judged anew
            self.last_key[w.rank] = w.key
            self.ranks[w.rank] = w.node
            if self.judged is not None and w.key <= self.judged:
                return []  # a window already judged without this rank (it came too late)
            self.pending.setdefault(w.key, {})[w.rank] = w
            world = self.world_size or len(self.ranks)
            out: list[Straggler] = []
            for key in sorted(self.pending):
                got = self.pending[key]
                if len(got) < world:
                    continue
                for older in [k for k in self.pending if k <= key]:
                    del self.pending[older]
                self.judged = key
                out += self._judge(got)
            while len(self.pending) > KEEP_PENDING:
                del self.pending[min(self.pending)]
            self.found += out
            return out

    def _restart(self) -> None:
        self.pending.clear()
        self.judged = None
        self.streak.clear()
        self.named.clear()
        self.last_key.clear()

    def take(self) -> list[Straggler]:
        """The stragglers named since the last call."""
        with self.lock:
            new = self.found[len(self.found) - self._unread :] if self._unread else []
            self._unread = 0
            return new

    def _judge(self, got: Mapping[int, Window]) -> list[Straggler]:
        times = {r: w.outside_s for r, w in got.items()}
        median = statistics.median(times.values())
        any_w = next(iter(got.values()))
        self.last_speeds = {r: (median / t if t > 0 else 1.0) for r, t in times.items()}
        if self.judged_windows % self.speeds_every == 0:
            self.speeds.append((any_w.key, max(w.at for w in got.values()), self.last_speeds))
            if len(self.speeds) >= 2 * KEEP_SPEEDS:
                del self.speeds[1::2]
                self.speeds_every *= 2
        self.judged_windows += 1
        if median <= 0 or len(got) < 2:
            return []
        limit = median / self.share
        slow = {r for r, t in times.items() if t > limit}
        out = []
        for rank, w in sorted(got.items()):
            if rank not in slow:
                self.streak.pop(rank, None)
                self.named.discard(rank)
                continue
            streak = self.streak.setdefault(rank, [])
            if rank in self.named:
                continue  # named already: its streak is not needed again until it recovers
            streak.append(w)
            if len(streak) >= self.windows and rank not in self.named:
                self.named.add(rank)
                out.append(self._name(w, streak, median, got, slow))
        self._unread += len(out)
        return out

    def _name(
        self, w: Window, streak: Sequence[Window], median: float, got: Mapping[int, Window], slow: set[int]
    ) -> Straggler:
        load = self.loads.get(w.node)
        cpu = None
        if load is not None:
            cpu = load.rank_cpu_pct.get(w.rank)
            if cpu is None:
                cpu = load.cpu_pct
        # the data rule is judged on the whole streak, as the line reports its data wait: one window
        # of a CPU-starved node can wait for data as much as it computes, the streak does not
        whole = replace(
            w,
            steps=sum(x.steps for x in streak),
            data_s=sum(x.data_s for x in streak),
            compute_s=sum(x.compute_s for x in streak),
            wall_s=sum(x.wall_s for x in streak),
        )
        kind, reason = attribute(
            whole,
            median,
            statistics.median(x.data_per_step for x in got.values()),
            load,
            node_ranks=[r for r, x in got.items() if x.node == w.node],
            slow=slow,
            others_fine=any(r not in slow for r, x in got.items() if x.node != w.node),
        )
        data_share = sum(x.data_s for x in streak) / max(1e-9, sum(x.wall_s for x in streak))
        return Straggler(
            rank=w.rank,
            node=w.node,
            speed=median / w.outside_s,
            since=streak[0].at - streak[0].wall_s,
            at=w.at,
            windows=len(streak),
            data_share=data_share,
            cpu_pct=cpu,
            kind=kind,
            reason=reason,
            named_at=max(x.at for x in got.values()),
        )


KINDS = {
    "gpu": "the GPU",
    "data": "input pipeline",
    "node": "the node",
    "waiting": "waiting on others",
    "compute": "compute-bound",
    "unknown": "reason unknown",
}
"""Each attribution's kind, and the words `orch top` shows it by beside a straggler flag."""


def attribute(
    w: Window,
    median: float,
    median_data: float,
    load: NodeLoad | None,
    *,
    node_ranks: Sequence[int],
    slow: set[int],
    others_fine: bool,
) -> tuple[str, str]:
    """(kind, reason) of a slow window: the GPU itself, the input pipeline, the whole node, waiting
    on others, compute, or `unknown` where the telemetry cannot tell compute from waiting."""
    gpu = None
    if load is not None and w.local_rank is not None:
        gpu = next((g for g in load.gpus if g.index == w.local_rank), None)
    if gpu is not None and gpu.throttle:
        return "gpu", f"GPU {gpu.index} on {w.node} throttles ({', '.join(gpu.throttle)})"
    if gpu is not None and gpu.temp_c is not None and gpu.temp_c >= HOT_C:
        return "gpu", f"GPU {gpu.index} on {w.node} is hot ({gpu.temp_c:.0f} °C)"
    excess = w.outside_s - median
    if excess > 0 and w.data_per_step - median_data >= 0.5 * excess:
        return "data", f"input pipeline on {w.node} (waits for data {w.data_share:.0%} of the time)"
    if len(node_ranks) > 1 and all(r in slow for r in node_ranks) and others_fine:
        return "node", f"compute-bound on {w.node}: every rank of {w.node} is slow, the node itself"
    if load is not None and load.no_gpu:
        return "compute", f"compute-bound on {w.node}"
    missing = _no_gpu_telemetry(w, load, gpu)
    if missing is not None:
        return "unknown", (
            f"slow outside collectives on {w.node}, compute-bound or waiting on others cannot be told ({missing})"
        )
    assert gpu is not None and gpu.util_pct is not None
    if gpu.util_pct < LOW_UTIL_PCT:
        return "waiting", (
            f"waiting on others: GPU {gpu.index} on {w.node} is {gpu.util_pct:.0f} % busy and data "
            f"wait is low, the slow one is elsewhere"
        )
    return "compute", f"compute-bound on {w.node}"


def _no_gpu_telemetry(w: Window, load: NodeLoad | None, gpu: GpuLoad | None) -> str | None:
    """What is missing to judge rank `w.rank` by its GPU's utilisation; None when nothing is."""
    if load is None:
        return f"no telemetry from {w.node}"
    if w.local_rank is None:
        return f"the GPU of rank {w.rank} is not known: no local rank"
    if gpu is None:
        if not load.gpus:
            return (
                f"no GPU telemetry from {w.node}: {load.gpu_error}"
                if load.gpu_error
                else f"no GPU telemetry from {w.node}"
            )
        return f"no GPU {w.local_rank} in the telemetry of {w.node}"
    if gpu.util_pct is None:
        return f"the utilisation of GPU {gpu.index} on {w.node} is unreadable"
    return None


class StragglerReporter(Protocol):
    """Who is told of a straggler (`orch up`'s progress)."""

    def straggler(self, found: Straggler, stop: bool) -> None:
        """A rank was named slow; `stop`: the run is torn down for it."""


class StragglerWatch:
    """The supervisor's hook: each straggler found is said, recorded in run.json (`stragglers`), and
    with `action: stop` becomes the run's first failure on that node."""

    def __init__(
        self,
        detector: Detector,
        action: str,
        specs: Sequence[NodeSpec],
        say: StragglerReporter,
        record: Callable[[list[dict[str, Any]]], object],
    ) -> None:
        self.detector, self.action, self.say, self.record = detector, action, say, record
        self.by_name = {s.name: s for s in specs}
        self.all: list[dict[str, Any]] = []

    def __call__(self) -> Failure | None:
        found = self.detector.take()
        if not found:
            return None
        stop = self.action == "stop"
        for s in found:
            self.say.straggler(s, stop)
            self.all.append(s.to_json())
        self.record(list(self.all))
        if not stop:
            return None
        first = found[0]
        spec = self.by_name.get(first.node)
        node_rank = spec.node_rank if spec is not None else 0
        local = first.rank - spec.base_rank if spec is not None else None
        return Failure(first.node, node_rank, first.line(), rank=first.rank, local_rank=local)


def chain(*hooks: Callable[[], Failure | None] | None) -> Callable[[], Failure | None] | None:
    """One supervisor `watch` hook of several: the first failure any of them returns."""
    live = [h for h in hooks if h is not None]
    if not live:
        return None

    def watch() -> Failure | None:
        for h in live:
            failure = h()
            if failure is not None:
                return failure
        return None

    return watch


def replay(
    windows: Iterable[Window],
    loads: Iterable[tuple[float, NodeLoad]],
    share: float,
    n_windows: int,
    world_size: int | None = None,
) -> Detector:
    """A detector fed a stored log's windows and loads in the order they were written (what `orch
    status`, `orch top` and the report use for a run no supervisor watched)."""
    det = Detector(share, n_windows, world_size)
    events: list[tuple[float, int, Any]] = [(w.at, 1, w) for w in windows]
    events += [(at, 0, load) for at, load in loads]
    for _at, kind, item in sorted(events, key=lambda e: (e[0], e[1])):
        if kind == 0:
            det.load(item)
        else:
            det.window(item)
    return det
