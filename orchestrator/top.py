"""`orch top`: the whole cluster while it trains, from the node logs alone.

Every node's log carries its agent's telemetry lines (GPUs, CPU, memory, ranks: `node/telemetry.py`)
and its ranks' timing lines (`trainer/logs.timing_line`). `TopView` brings the controller's copies
of the node logs up to date (`logs/fetch.py`, as `orch logs` does: it works for a detached run,
from any shell, after a controller restart), reads what each copy gained since the last refresh,
and keeps per node its latest sample, per rank its latest window, and the straggler detector
(`run/straggler.py`) fed everything in the order it was written. `TopReport` is one refresh: a row
per node with its GPUs and ranks, the flags, the stragglers named so far (`to_json`: docs/CONTRACT.md's
top JSON). Layer 6 beside `up.py`: it composes logs and run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .config.inventory import Inventory
from .config.plan import world_size
from .logs.fetch import NodeSource, fetch_all, node_sources
from .logs.stored import CopyScan, scan_records
from .logs.telemetry import NOT_FOUND, Gpu, Ignored, Sample
from .logs.trainer import Timing
from .run.straggler import HOT_C, Detector, Straggler, Window
from .store import NodeRecord, RunDir, RunStore, clock_offsets, recorded_nodes, recorded_world_size
from .transport import Cluster

IDLE_PCT = 10.0
"""A GPU below this utilisation while its rank runs is flagged idle."""
STALE_SAMPLES = 3
"""A node whose last telemetry is older than this many sampling intervals is flagged stale."""


@dataclass
class RankView:
    rank: int
    node: str
    local_rank: int | None
    timing: Timing | None = None
    window: Window | None = None
    cpu_pct: float | None = None
    rss_mb: float | None = None
    pid: int | None = None


@dataclass
class NodeView:
    source: NodeSource
    offset: int = 0
    last_ts: float | None = None
    sample: Sample | None = None
    ranks: dict[int, RankView] = field(default_factory=dict)
    fetch_error: str | None = None


@dataclass(frozen=True)
class TopReport:
    """One refresh of `orch top`."""

    run: str
    state: str
    taken_at: float
    telemetry_s: float
    nodes: list[dict[str, Any]]
    stragglers: list[Straggler]
    speeds: list[tuple[tuple[int, int], float, dict[int, float]]] = field(default_factory=list)
    ignored_lines: int = 0
    """Lines of the node logs that start as a telemetry or timing record and are not a finite one."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "state": self.state,
            "taken_at": round(self.taken_at, 3),
            "telemetry_s": self.telemetry_s,
            "nodes": self.nodes,
            "stragglers": [s.to_json() for s in self.stragglers],
            "ignored_lines": self.ignored_lines,
        }


class TopView:
    """A run's nodes as `orch top` follows them; `refresh` reads what the copies gained."""

    def __init__(self, run: RunDir, inv: Inventory, clock: Callable[[], float] = time.time) -> None:
        self.run, self.inv, self.clock = run, inv, clock
        self.offsets_ms, _origin = clock_offsets(run, inv.name)
        self.sources = node_sources(run, inv)
        self.nodes = {s.node: NodeView(s) for s in self.sources}
        st = inv.job.straggler
        self.detector = Detector(st.share, st.windows, recorded_world_size(run.read()) or world_size(inv.nodes))
        self.ignored = 0
        """Lines of the copies that start as a telemetry or timing record and are not a finite one."""

    @classmethod
    def open(cls, run_id: str | None) -> TopView:
        """The named run, else the latest; UsageError (exit 2) when there is none."""
        run = RunStore().get(run_id)
        return cls(run, run.inventory())

    def inv_cluster(self) -> Cluster:
        return Cluster(self.inv)

    def fetch(self, cluster: Cluster) -> None:
        """Bring every node's copy up to date; a node that cannot be read keeps its copy (and says why)."""
        result = fetch_all(self.run, self.inv, cluster, self.sources)
        for name, view in self.nodes.items():
            exc = result.failed.get(name)
            view.fetch_error = None if exc is None else str(exc)

    def refresh(self, cluster: Cluster) -> TopReport:
        """One look: fetch what the node logs gained, read it, report."""
        self.fetch(cluster)
        self.read_copies()
        return self.report()

    def frames(self, interval: float, sleep: Callable[[float], None] = time.sleep) -> Iterator[TopReport]:
        """The live view's refreshes, `interval` seconds apart, over one cluster kept open
        between them (closed when the iteration is)."""
        with self.inv_cluster() as cluster:
            while True:
                yield self.refresh(cluster)
                sleep(interval)  # the refresh rate of a view, not a wait for anything

    def read_copies(self) -> None:
        """Everything the copies gained since the last call, fed in the order it was written: a
        line at a time per copy (`CopyScan`), so memory does not grow with the logs. A line that
        starts as a record and is not a finite one is counted in `ignored`."""
        scans = {name: CopyScan(view.source, view.offset) for name, view in self.nodes.items()}
        for line, record in scan_records(list(scans.values()), self.offsets_ms):
            view = self.nodes[line.node]
            if isinstance(record, Ignored):
                self.ignored += 1
            elif isinstance(record, Sample):
                view.sample = record
                for r in record.ranks:
                    rv = view.ranks.setdefault(r.rank, RankView(r.rank, view.source.node, r.local_rank))
                    rv.cpu_pct, rv.rss_mb, rv.pid = r.cpu_pct, r.rss_mb, r.pid
                self.detector.load(record.load())
            else:
                window, timing = record
                rv = view.ranks.setdefault(window.rank, RankView(window.rank, view.source.node, window.local_rank))
                rv.timing, rv.window, rv.local_rank = timing, window, window.local_rank
                self.detector.window(window)
        for name, scan in scans.items():
            view = self.nodes[name]
            view.offset = scan.offset
            if scan.last_ts is not None:
                view.last_ts = scan.last_ts if view.last_ts is None else max(view.last_ts, scan.last_ts)

    def report(self) -> TopReport:
        now = self.clock()
        recorded = {n.node: n for n in recorded_nodes(self.run.read())}
        state = str(self.run.read().get("state", "unknown"))
        named = {s.rank for s in self.detector.found}
        streak = {r for r, ws in self.detector.streak.items() if ws}
        rows = []
        for view in sorted(self.nodes.values(), key=lambda v: v.source.node_rank):
            rows.append(self._node_row(view, recorded.get(view.source.node), now, named, streak))
        return TopReport(
            self.run.run_id,
            state,
            now,
            self.inv.job.telemetry_s,
            rows,
            list(self.detector.found),
            list(self.detector.speeds),
            self.ignored,
        )

    def _node_row(
        self, view: NodeView, rec: NodeRecord | None, now: float, named: set[int], streak: set[int]
    ) -> dict[str, Any]:
        node = view.source.node
        offset = self.offsets_ms.get(node, 0.0) / 1000.0
        s = view.sample
        node_state = str(rec.state if rec is not None else "unknown")
        running = node_state == "running"
        by_local = {r.local_rank: r for r in view.ranks.values() if r.local_rank is not None}
        gpus = [
            self._gpu_row(g, by_local.get(g.index) if g.index is not None else None, running)
            for g in (s.gpus if s else ())
        ]
        ranks: list[dict[str, Any]] = []
        for rv in sorted(view.ranks.values(), key=lambda r: r.rank):
            t = rv.timing
            rank_flags = ["straggler"] if rv.rank in named else (["slow"] if rv.rank in streak else [])
            speed = self.detector.last_speeds.get(rv.rank)
            ranks.append(
                {
                    "rank": rv.rank,
                    "local_rank": rv.local_rank,
                    "pid": rv.pid,
                    "cpu_pct": rv.cpu_pct,
                    "rss_mb": rv.rss_mb,
                    "images_per_s": round(t.ips, 2) if t else None,
                    "data_share": round(t.data_share, 4) if t else None,
                    "step_outside_s": round(t.outside_s, 5) if t else None,
                    "speed": round(speed, 3) if speed is not None else None,
                    "flags": rank_flags,
                }
            )
        flags: list[str] = []
        if any("throttle" in g["flags"] for g in gpus):
            flags.append("throttle")
        if any("hot" in g["flags"] for g in gpus):
            flags.append("hot")
        if any("idle" in g["flags"] for g in gpus):
            flags.append("idle-gpu")
        if any("error" in g["flags"] for g in gpus):
            flags.append("gpu-error")
        if any(r["flags"] == ["straggler"] for r in ranks):
            flags.append("straggler")
        sample_age = None if s is None else round(now - (s.ts - offset), 1)
        every = self.inv.job.telemetry_s
        if running and every > 0 and (sample_age is None or sample_age > STALE_SAMPLES * every):
            flags.append("stale")
        ips = [r["images_per_s"] for r in ranks if r["images_per_s"] is not None]
        waits = [r["data_share"] for r in ranks if r["data_share"] is not None]
        return {
            "node": node,
            "node_rank": view.source.node_rank,
            "state": node_state,
            "last_line_age_s": None if view.last_ts is None else round(now - (view.last_ts - offset), 1),
            "sample_age_s": sample_age,
            "fetch_error": view.fetch_error,
            "cpu_pct": s.cpu_pct if s else None,
            "load1": s.load1 if s else None,
            "ncpu": s.ncpu if s else None,
            "mem_used_mb": s.mem_used_mb if s else None,
            "mem_total_mb": s.mem_total_mb if s else None,
            "gpu_error": s.gpu_error if s else None,
            "no_gpu": s is not None and not s.gpus and s.gpu_error == NOT_FOUND and not self._declares_gpus(node),
            "images_per_s": round(sum(ips), 2) if ips else None,
            "data_share": max(waits) if waits else None,
            "gpus": gpus,
            "ranks": ranks,
            "flags": flags,
        }

    def _declares_gpus(self, node: str) -> bool:
        """The inventory gives the node GPUs (without them, no nvidia-smi is a CPU node, not an error)."""
        return any(n.gpus for n in self.inv.nodes if n.name == node)

    @staticmethod
    def _gpu_row(g: Gpu, rank: RankView | None, running: bool) -> dict[str, Any]:
        flags = []
        if g.throttle:
            flags.append("throttle")
        if g.temp_c is not None and g.temp_c >= HOT_C:
            flags.append("hot")
        if g.error:
            flags.append("error")
        if running and rank is not None and g.util_pct is not None and g.util_pct < IDLE_PCT:
            flags.append("idle")
        return {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "util_pct": g.util_pct,
            "mem_used_mb": g.mem_used_mb,
            "mem_total_mb": g.mem_total_mb,
            "temp_c": g.temp_c,
            "power_w": g.power_w,
            "sm_mhz": g.sm_mhz,
            "throttle": list(g.throttle) if g.throttle is not None else None,
            "fan_pct": g.fan_pct,
            "error": g.error,
            "rank": rank.rank if rank is not None else None,
            "flags": flags,
        }


def top_once(run_id: str | None) -> TopReport:
    """One look at a run (`orch top --once`, `--json`): the named run, else the latest; UsageError
    (exit 2) when there is none."""
    view = TopView.open(run_id)
    with view.inv_cluster() as cluster:
        return view.refresh(cluster)
