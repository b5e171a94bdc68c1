"""`orch report`: one self-contained HTML page (plus the PNGs beside it) for a run.

Everything comes from the run directory on the controller: run.json (node states and times),
check.json (the preflight), the node log copies (the trainer's throughput tables) and the
trainer's results.csv (fetched from the master node when the log names it; else the same columns
from the trainer's epoch and validation lines). Plots are drawn
with matplotlib's Agg backend and its bundled DejaVu fonts, embedded as base64: the page needs
no network and no other file to open.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import re
import shlex
import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .config.schema import FabricCheckModel, StragglerModel
from .contract import NodeState
from .logs.fetch import NodeSource
from .logs.progress import rank0_lines
from .logs.stored import CopyScan, scan_records
from .logs.telemetry import Ignored, Sample
from .logs.trainer import (
    Phase,
    Throughput,
    announced,
    parse_final,
    parse_phases,
    parse_results,
    parse_throughput,
    parse_throughput_epochs,
)
from .run.straggler import Detector
from .store import (
    CHECK,
    NodeRecord,
    RunDir,
    clock_offsets,
    recorded_nodes,
    recorded_wall_s,
    recorded_world_size,
    write_private,
)

STATE_COLOURS = {
    NodeState.RUNNING: "#1f77b4",
    NodeState.SUCCEEDED: "#2ca02c",
    NodeState.FAILED: "#d62728",
    NodeState.STOPPED: "#ff7f0e",
    NodeState.STARTING: "#9467bd",
    NodeState.UNREACHABLE: "#8c564b",
    NodeState.UNKNOWN: "#7f7f7f",
    NodeState.PENDING: "#7f7f7f",
}


def read_results_csv(path: Path) -> dict[str, list[float]]:
    """ultralytics-style results.csv → {column: values}; column names are stripped of padding."""
    cols: dict[str, list[float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            for key, value in row.items():
                if key is None:
                    continue
                try:
                    cols.setdefault(key.strip(), []).append(float(value))
                except (TypeError, ValueError):
                    continue
    return cols


def run_wall(info: dict[str, Any], now: float) -> tuple[float | None, bool]:
    """(seconds, running): a finished run's recorded wall time (`store.recorded_wall_s`), or for
    one still running the time since it was created. Never the time of the report for a finished
    run: regenerating it must not change the figure."""
    from .contract import FINAL_STATES

    created = info.get("created")
    running = str(info.get("state")) not in FINAL_STATES
    if running:
        return (max(0.0, now - created) if isinstance(created, (int, float)) else None), True
    return recorded_wall_s(info), False


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing with Agg, every text drawn as written: node names, metric names
    and states come from the logs and run.json, and a `$` there is a character, never mathtext
    (`$\\foo$` would fail the whole report on an unknown symbol)."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["text.parse_math"] = False
    import matplotlib.pyplot as plt

    return plt


PLOT_MAX = 1e100
"""The largest magnitude a plot draws: a value from the logs or results.csv that is not a finite
number or is beyond it (`1e999`, `1.7e308`, which matplotlib cannot lay out) is a gap in its curve."""


def label(text: str) -> str:
    """A legend label from the logs as written; one that starts with `_` (which matplotlib would
    leave out of the legend) behind a space."""
    return f" {text}" if text.startswith("_") else text


def plottable(values: Iterable[float]) -> list[float]:
    """`values` with each that is not a finite number within ±PLOT_MAX as NaN (a gap, not drawn)."""
    return [v if _plottable(v) else math.nan for v in values]


def _plottable(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v) and abs(v) <= PLOT_MAX


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def plot_timeline(run: dict[str, Any], phases: list[Phase] | None = None) -> bytes:
    """One bar per node from start to end, coloured by its final state; under them rank 0's
    validation and checkpoint phases, and a line where each earlier attempt ended (retries)."""
    plt = _pyplot()

    nodes = run.get("nodes", [])
    phases = phases or []
    t0 = min([n.get("started_at") or run.get("created", 0) for n in nodes] + [run.get("created") or 0]) or 0
    wall, _running = run_wall(run, time.time())
    created = run.get("created")
    now = created + wall if isinstance(created, (int, float)) and wall is not None else time.time()
    rows = len(nodes) + (1 if phases else 0)
    fig, ax = plt.subplots(figsize=(8, 0.7 + 0.45 * max(1, rows)))
    for i, n in enumerate(nodes):
        start = (n.get("started_at") or t0) - t0
        end = (n.get("finished_at") or now) - t0
        state = n.get("state", NodeState.UNKNOWN)
        ax.barh(i, max(end - start, 0.05), left=start, color=STATE_COLOURS.get(state, "#7f7f7f"))
        ax.text(
            end,
            i,
            f" {state}" + (f" ({n['exit_code']})" if n.get("exit_code") not in (None, 0) else ""),
            va="center",
            fontsize=8,
        )
    labels = [f"{n['node']} (rank {n.get('node_rank', '?')})" for n in nodes]
    if phases:
        y = len(nodes)
        for kind, colour in PHASE_COLOURS.items():
            spans = [(p.start - t0, max(p.end - p.start, 0.05)) for p in phases if p.kind == kind]
            if spans:
                ax.broken_barh(spans, (y - 0.4, 0.8), color=colour, label=kind)
        labels.append("rank 0 phases")
        ax.legend(fontsize=7, loc="lower right")
    for a in run.get("attempts") or []:
        if isinstance(a.get("ended"), (int, float)):
            ax.axvline(a["ended"] - t0, color="#d62728", ls="--", lw=1)
            ax.text(
                a["ended"] - t0,
                -0.6,
                f" attempt {a.get('attempt')} ended: {a.get('result')}",
                fontsize=7,
                color="#d62728",
            )
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_title("node timeline")
    ax.margins(x=0.15)
    return _png(fig)


PHASE_COLOURS = {"validation": "#9467bd", "checkpoint": "#bcbd22"}


def plot_curves(results: dict[str, list[float]]) -> bytes | None:
    """Per epoch from results.csv: training losses, validation losses, mAP, learning rates."""
    plt = _pyplot()

    epochs = results.get("epoch")
    panels = [
        ("training loss", [k for k in results if k.startswith("train/") and k.endswith("loss")], "train/"),
        ("validation loss", [k for k in results if k.startswith("val/") and k.endswith("loss")], "val/"),
        ("validation mAP", [k for k in results if k.startswith("metrics/mAP")], "metrics/"),
        ("learning rate", [k for k in results if k.startswith("lr/")], ""),
    ]
    if not epochs or not any(keys for _t, keys, _p in panels):
        return None
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.3))
    for ax, (title, keys, prefix) in zip(axes, panels):
        for k in keys:
            ax.plot(plottable(epochs), plottable(results[k]), marker="o", ms=3, label=label(k.removeprefix(prefix)))
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        if keys:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not in results.csv", ha="center", va="center", transform=ax.transAxes, color="#888")
    fig.tight_layout()
    return _png(fig)


def node_throughput(
    epochs: dict[int, Throughput], nodes: Sequence[NodeRecord]
) -> dict[str, dict[int, tuple[float, float]]]:
    """Per node and epoch: (images/s of its ranks together, their mean data-wait share), from each
    epoch's throughput table and the ranks run.json gives each node (`base_rank`, `nproc`)."""
    owner: dict[int, str] = {}
    for n in nodes:
        if n.base_rank is not None and n.nproc is not None:
            owner.update({r: n.node for r in range(n.base_rank, n.base_rank + n.nproc)})
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for epoch, tp in epochs.items():
        by_node: dict[str, list[int]] = {}
        for rank in tp.ips:
            by_node.setdefault(owner.get(rank, f"rank {rank}"), []).append(rank)
        for node, ranks in by_node.items():
            out.setdefault(node, {})[epoch] = (
                sum(tp.ips[r] for r in ranks),
                statistics.fmean(tp.wait_share.get(r, 0.0) for r in ranks),
            )
    return out


def plot_node_throughput(per_node: dict[str, dict[int, tuple[float, float]]]) -> bytes | None:
    """Images/s and data-wait share of every node over the epochs."""
    if not per_node:
        return None
    plt = _pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.3))
    for node, series in per_node.items():
        epochs = sorted(series)
        left.plot(epochs, plottable(series[e][0] for e in epochs), marker="o", ms=3, label=label(node))
        right.plot(epochs, plottable(100 * series[e][1] for e in epochs), marker="o", ms=3, label=label(node))
    left.set_title("images/s per node", fontsize=10)
    right.set_title("data wait per node (% of its time)", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("epoch")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def plot_throughput(tp: Throughput) -> bytes | None:
    """Per-rank images/s bars with the data-wait share and the scaling efficiency."""
    if not tp.ips:
        return None
    plt = _pyplot()

    ranks = sorted(tp.ips)
    heights = plottable(tp.ips[r] for r in ranks)
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(ranks) + 2), 3))
    ax.bar([str(r) for r in ranks], heights, color="#1f77b4")
    for i, r in enumerate(ranks):
        if not math.isnan(heights[i]):
            ax.text(i, heights[i], f"{tp.wait_share.get(r, 0):.0%} wait", ha="center", va="bottom", fontsize=7)
    title = f"images/s per rank, epoch {tp.epoch}"
    if tp.total is not None:
        title += f" — total {tp.total:.1f}"
    if tp.efficiency is not None:
        title += f", scaling efficiency {tp.efficiency:.0%}"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("rank")
    ax.set_ylabel("images/s")
    return _png(fig)


def plot_fabric_nodes(fabric: dict[str, Any]) -> bytes | None:
    """The fabric check's rate per node: send and recv (best pair) side by side, slow ones red,
    the warn line (share × the median) dashed."""
    per_node = fabric.get("per_node") or []
    if not per_node:
        return None
    plt = _pyplot()

    slow = {(p["node"], p["direction"]) for p in fabric.get("slow_nodes") or []}
    names = [p["node"] for p in per_node]
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(names) + 2), 3))
    width = 0.4
    for k, (direction, colour) in enumerate((("send", "#1f77b4"), ("recv", "#2ca02c"))):
        values = [p[f"{direction}_gbps"] or 0 for p in per_node]
        xs = [i + (k - 0.5) * width for i in range(len(names))]
        colours = ["#d62728" if (n, direction) in slow else colour for n in names]
        ax.bar(xs, values, width, color=colours, label=direction)
        for x, v in zip(xs, values):
            ax.text(x, v, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
        ax.axhline(
            fabric.get("share", FabricCheckModel.share) * statistics.median(values), color=colour, lw=0.8, ls="--"
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.set_ylabel("GB/s (best pair)")
    ax.set_title(
        f"fabric: send / recv per node (red: below {fabric.get('share', FabricCheckModel.share):g}"
        f" x the median, dashed)",
        fontsize=9,
    )
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    return _png(fig)


def plot_fabric_sweep(fabric: dict[str, Any]) -> bytes | None:
    """The fabric check's all_reduce sweep: busbw and algbw against the message size."""
    sweep = fabric.get("sweep") or []
    if not sweep:
        return None
    plt = _pyplot()

    sizes = [row["size_bytes"] for row in sweep]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(sizes, [row["busbw_gbps"] for row in sweep], marker="o", label="busbw")
    ax.plot(sizes, [row["algbw_gbps"] for row in sweep], marker=".", ls=":", label="algbw")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{s / (1 << 20):g} MiB" for s in sizes], fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("GB/s")
    ax.set_title(
        f"all_reduce, {fabric.get('backend')} on {fabric.get('device')}, {fabric.get('world_size')} ranks "
        f"on {fabric.get('nnodes')} nodes",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    return _png(fig)


def _fabric_section(fabric: dict[str, Any], out: Path) -> list[str]:
    """The fabric check's part of the page: the sweep as a curve and a table, a bar per node."""
    nodes, sweep = plot_fabric_nodes(fabric), plot_fabric_sweep(fabric)
    for name, png in (("fabric_nodes.png", nodes), ("fabric_sweep.png", sweep)):
        if png is not None:
            write_private(out / name, png)
    parts = ["<h2>fabric</h2>", _img("fabric: rate per node", nodes), _img("fabric: all_reduce sweep", sweep)]
    parts.append(
        _table(
            ["size (B)", "count (elements)", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"],
            [
                [
                    r["size_bytes"],
                    r["count"],
                    r["type"],
                    f"{r['time_us']:.1f}",
                    f"{r['algbw_gbps']:.2f}",
                    f"{r['busbw_gbps']:.2f}",
                    r["wrong"],
                ]
                for r in fabric.get("sweep") or []
            ],
        )
    )
    slow = {p["node"] for p in fabric.get("slow_nodes") or []}
    parts.append(
        _table(
            ["node", "send GB/s", "recv GB/s", "send median", "recv median", "status"],
            [
                [
                    p["node"],
                    f"{p['send_gbps']:.3f}",
                    f"{p['recv_gbps']:.3f}",
                    f"{p['send_median_gbps']:.3f}",
                    f"{p['recv_median_gbps']:.3f}",
                    "warn" if p["node"] in slow else "ok",
                ]
                for p in fabric.get("per_node") or []
            ],
            status_col=5,
        )
    )
    return parts


SUMMARY_LINES = re.compile(rb"throughput epoch|train epoch|val epoch|final val|weights in|results\.csv")
"""What the report keeps of the node logs besides the records: the trainer's throughput tables,
epoch, validation, final and done lines (a few per epoch, however long the epochs are)."""


@dataclass
class LogScan:
    """One pass over the node log copies, a line at a time per copy: the summary lines
    (`SUMMARY_LINES`, per node in file order) and the straggler detector replayed on the records."""

    lines: list[str]
    detector: Detector
    ignored: int
    """Lines that start as a telemetry or timing record and are not a finite one."""


def scan_logs(run: RunDir) -> LogScan:
    """Read the copies once: the detector replayed (every judged window's speed per rank: the
    median rank's time per step outside collectives over the rank's own; the stragglers it names,
    with the run's `job.straggler` settings, the defaults without an inventory) and the summary lines."""
    share, windows = StragglerModel.share, StragglerModel.windows
    offsets: dict[str, float] = {}
    try:
        inv = run.inventory()
        share, windows = inv.job.straggler.share, inv.job.straggler.windows
        offsets, _origin = clock_offsets(run, inv.name)
    except Exception:  # a run directory without its inventory: the defaults, no skew correction
        pass
    world = recorded_world_size(run.read())
    det = Detector(share, windows, world)
    scans = [
        CopyScan(NodeSource(path.stem, i, None, "", "", path), keep=SUMMARY_LINES)
        for i, path in enumerate(run.node_logs())
    ]
    ignored = 0
    for _line, record in scan_records(scans, offsets):
        if isinstance(record, Ignored):
            ignored += 1
        elif isinstance(record, Sample):
            det.load(record.load())
        else:
            det.window(record[0])
    return LogScan([text for scan in scans for text in scan.kept], det, ignored)


def rank_pace(run: RunDir) -> Detector:
    """The straggler detector replayed over the node log copies (`scan_logs`)."""
    return scan_logs(run).detector


def time_ticks(times: list[float], most: int = 8) -> tuple[list[int], list[str], str]:
    """Ticks for columns stamped `times` (seconds, ascending): (column indices, labels, unit). The
    unit fits the span (seconds under 2 minutes, minutes under 3 hours, else hours) and the labels
    carry the decimals that tell them apart: a 40 s run reads `0 5 10 ...`, never `0 0 0`."""
    if not times:
        return [], [], "seconds"
    ticks = list(range(0, len(times), max(1, len(times) // most)))
    span = times[-1] - times[0]
    unit, scale = ("seconds", 1.0) if span < 120 else ("minutes", 60.0) if span < 3 * 3600 else ("hours", 3600.0)
    values = [(times[i] - times[0]) / scale for i in ticks]
    for digits in range(4):
        labels = [f"{v:.{digits}f}" for v in values]
        if len(set(labels)) == len(labels):
            break
    return ticks, labels, unit


def plot_pace(det: Detector, max_windows: int = 400) -> bytes | None:
    """A heatmap: one row per rank, one column per timing window, coloured by the rank's speed
    against the median rank (1 = the median; red below `share`), the stragglers marked."""
    if not det.speeds:
        return None
    plt = _pyplot()
    from matplotlib.colors import TwoSlopeNorm

    speeds = det.speeds
    step = max(1, len(speeds) // max_windows)  # a long run: every step-th window, still one column each
    speeds = speeds[::step]
    ranks = sorted({r for _k, _at, row in speeds for r in row})
    grid = [[row.get(r, float("nan")) for _k, _at, row in speeds] for r in ranks]
    fig, ax = plt.subplots(figsize=(min(12, max(5, 0.05 * len(speeds) + 3)), max(2, 0.3 * len(ranks) + 1)))
    image = ax.imshow(
        grid, aspect="auto", cmap="RdYlGn", norm=TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=1.5), interpolation="nearest"
    )
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=7)
    ticks, labels, unit = time_ticks([at for _k, at, _r in speeds])
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_xlabel(f"{unit} since the first timing window")
    for s in det.found:
        if s.rank in ranks:
            ax.annotate(
                "straggler",
                (
                    next((i for i, (_k, at, _r) in enumerate(speeds) if at >= s.at), len(speeds) - 1),
                    ranks.index(s.rank),
                ),
                fontsize=7,
                color="black",
                ha="center",
                va="center",
            )
    fig.colorbar(image, ax=ax, label="speed vs the median rank")
    ax.set_title("each rank's speed outside collectives (data wait + forward and loss), window by window", fontsize=9)
    return _png(fig)


def _pace_section(run: RunDir, out: Path, scan: LogScan) -> list[str]:
    """`ranks over time`: the heatmap and the stragglers named (the detector replayed on the logs)."""
    det = scan.detector
    png = plot_pace(det)
    if png is not None:
        write_private(out / "pace.png", png)
    parts = ["<h2>ranks over time</h2>", _img("per-rank speed heatmap", png)]
    lines = [s.line() for s in det.found] or [
        str(s.get("line")) for s in run.read().get("stragglers") or [] if isinstance(s, dict)
    ]
    if lines:
        parts.append("<pre class='fail'>" + html.escape("\n".join(lines)) + "</pre>")
    elif det.speeds:
        parts.append("<p>no straggler: no rank stayed slower than the others</p>")
    if scan.ignored:
        parts.append(
            f"<p id='ignored-lines' class='warn'>{scan.ignored} line{'' if scan.ignored == 1 else 's'} of "
            "the node logs ignored: not a finite telemetry or timing record</p>"
        )
    return parts


def _img(name: str, png: bytes | None) -> str:
    if png is None:
        return f'<p class="none">no data for {html.escape(name)}</p>'
    data = base64.b64encode(png).decode()
    return f'<img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[Any]], status_col: int | None = None) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = f' class="{html.escape(str(v))}"' if i == status_col else ""
            cells.append(f"<td{cls}>{html.escape('' if v is None else str(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "</table>"


CSS = """body{font-family:DejaVu Sans,sans-serif;margin:2em;color:#222;max-width:1100px}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
.ok,.succeeded{color:#2ca02c}.warn,.stopped{color:#ff7f0e}.fail,.failed{color:#d62728;font-weight:bold}
.skip{color:#888}.none{color:#888;font-style:italic}pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:.8em}
img{max-width:100%}
.card{display:flex;flex-wrap:wrap;gap:8px}
.card .item{border:1px solid #ddd;border-radius:6px;padding:6px 10px;min-width:150px}
.label{font-size:.75em;color:#666}.value{font-size:1.05em}
.cause{border:2px solid #d62728;background:#fdecea;border-radius:6px;padding:8px 12px;margin:1em 0}
.cause .value{font-weight:bold;color:#a00}.cause .where,.cause .hint{font-size:.85em}
details summary{cursor:pointer;color:#2ca02c;font-size:.85em;margin:.4em 0}"""


def master_rank0_lines(run: RunDir, master: str | None) -> Iterator[tuple[float, str]]:
    """Rank 0's `(time, text)` lines of the master's copy, streaming (what `parse_phases` reads)."""
    path = run.node_log(str(master))
    if not master or not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
        yield from rank0_lines(fh)


@dataclass(frozen=True)
class Summary:
    """The report's summary card: what a person looks for first."""

    state: str
    wall_s: float | None
    running: bool
    world_size: int | None
    nodes: int
    attempt: int
    max_attempts: int
    best_map50_95: float | None
    best_epoch: int | None
    final: tuple[str, int, dict[str, float]] | None
    """The final validation (`final val` line): checkpoint, its epoch, its metrics."""
    weights: str | None
    master: str | None
    located: Located | None = None
    """The weights where they are (the master's host, or nowhere outside the container): `locate`."""

    def _weights_text(self) -> str:
        if not self.weights:
            return "—"
        return self.located.text(str(self.master)) if self.located is not None else f"{self.weights} (on {self.master})"

    def items(self) -> list[tuple[str, str, str, Any]]:
        """(key, label, text, raw value) per field, in the card's order."""
        final = self.final
        final_text = "—"
        if final is not None:
            name, epoch, metrics = final
            shown = ", ".join(
                f"{k.removeprefix('metrics/')} {v:.4g}" for k, v in metrics.items() if k.startswith("metrics/mAP")
            )
            final_text = f"{name} (epoch {epoch}): {shown or 'no mAP'}"
        wall = "—" if self.wall_s is None else ("running for " if self.running else "") + f"{self.wall_s:.1f} s"
        best = "—" if self.best_map50_95 is None else f"{self.best_map50_95:.4g} (epoch {self.best_epoch})"
        return [
            ("state", "state", self.state, self.state),
            ("best_map50_95", "best mAP50-95", best, self.best_map50_95),
            ("best_epoch", "best epoch", "—" if self.best_epoch is None else str(self.best_epoch), self.best_epoch),
            (
                "final_val",
                "final validation",
                final_text,
                None if final is None else final[2].get("metrics/mAP50-95(B)"),
            ),
            ("weights", "weights", self._weights_text(), self.weights),
            ("wall_s", "wall time", wall, self.wall_s),
            (
                "world_size",
                "world size",
                "—" if self.world_size is None else f"{self.world_size} ({self.nodes} nodes)",
                self.world_size,
            ),
            ("attempts", "attempts", f"{self.attempt} of {self.max_attempts}", self.attempt),
        ]


def summarize(
    info: dict[str, Any], results: dict[str, list[float]], lines: list[str], plan: dict[str, Any], now: float
) -> Summary:
    """The summary card from run.json (`info`), results.csv's columns, the node logs and plan.json."""
    wall, running = run_wall(info, now)
    maps, epochs = results.get("metrics/mAP50-95(B)") or [], results.get("epoch") or []
    best = best_epoch = None
    finite = [k for k in range(len(maps)) if len(epochs) == len(maps) and _plottable(maps[k]) and _plottable(epochs[k])]
    if finite:
        i = max(finite, key=lambda k: (maps[k], -k))  # the first epoch that reached the best
        best, best_epoch = maps[i], int(epochs[i])
    nodes = recorded_nodes(info)
    world = plan.get("world_size") if isinstance(plan.get("world_size"), int) else None
    if world is None:
        world = recorded_world_size(info)
    weights, _csv = announced(lines)
    master = next((n.node for n in nodes if n.node_rank == 0), None)
    attempt = int(info.get("attempt") or 1)
    return Summary(
        str(info.get("state")),
        wall,
        running,
        world,
        len(nodes),
        attempt,
        int(info.get("max_attempts") or attempt),
        best,
        best_epoch,
        parse_final(lines),
        weights,
        master,
    )


def _summary_card(summary: Summary) -> str:
    cells = []
    for key, label, text, raw in summary.items():
        value = "" if raw is None else html.escape(str(raw), quote=True)
        cls = f" {html.escape(summary.state)}" if key == "state" else ""
        cells.append(
            f"<div class='item' data-key='{key}' data-value='{value}'><div class='label'>"
            f"{html.escape(label)}</div><div class='value{cls}'>{html.escape(text)}</div></div>"
        )
    return "<section id='summary' class='card'>" + "".join(cells) + "</section>"


def _cause_banner(failure: dict[str, Any]) -> str:
    """A failed run's root cause, highlighted at the top: the failure's `cause` when the
    supervisor found one (else its reason), where it happened, and the hint."""
    cause = failure.get("cause") or failure.get("reason") or "the job failed"
    ended = f"signal {failure['signal']}" if failure.get("signal") else f"exit code {failure.get('exit_code')}"
    where = f"node {failure.get('node')}, rank {failure.get('rank')}, {ended}"
    hint = f"<div class='hint'>hint: {html.escape(str(failure['hint']))}</div>" if failure.get("hint") else ""
    return (
        f"<section id='root-cause' class='cause'><div class='label'>root cause</div>"
        f"<div class='value'>{html.escape(str(cause))}</div><div class='where'>{html.escape(where)}</div>"
        f"{hint}</section>"
    )


def masked_env(env: dict[str, Any]) -> dict[str, str]:
    """Env names with their values hidden as the plan JSON hides them (`config.plan.HIDDEN`): which
    variables were set matters, their values may be tokens and keys."""
    from .config.plan import HIDDEN

    return {str(k): HIDDEN for k in env}


def launched_image(plan: Mapping[str, Any], python: str) -> str | None:
    """The image a container run's first node ran, as plan.json records it (its `environment`:
    the image ID the launch was pinned to, else the image as named); a plan.json written before
    the environment was recorded: the word before the job's `python` in its argv. None: neither."""
    first = (plan.get("nodes") or [{}])[0] or {}
    environment = first.get("environment")
    if isinstance(environment, Mapping):
        ran = environment.get("image_id") or environment.get("image")
        return str(ran) if ran else None
    argv = [str(a) for a in first.get("argv") or []]
    return next((argv[i - 1] for i, word in enumerate(argv) if i > 0 and word == python), None)


def _configuration(run: RunDir, info: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The resolved inventory (nodes, master, job; with the command line's overrides and any spare
    in place) and the job's arguments as launched; env values masked."""
    parts = ["<h2>configuration</h2>"]
    try:
        inv = run.inventory()
    except Exception as exc:  # a snapshot that no longer parses: say so, show the rest
        parts.append(f"<p class='none'>inventory snapshot unreadable: {html.escape(str(exc))}</p>")
        inv = None
    if inv is not None:
        job = inv.job
        rows: list[list[Any]] = [
            ["inventory", inv.path],
            ["transport", inv.transport],
            ["master", f"{inv.master.name} ({inv.master.addr}:{inv.master_port})"],
            ["rendezvous", job.rdzv],
            ["entry", f"-m {job.module}" if job.module and not job.script else job.script],
            ["workdir", job.workdir],
            ["python", job.python],
            ["job arguments", " ".join(job.args) or "—"],
            ["torchrun args", " ".join(job.torchrun_args) or "—"],
            ["env", ", ".join(f"{k}={v}" for k, v in masked_env(dict(inv.env)).items()) or "—"],
        ]
        c = job.container
        if c is not None:
            ran = launched_image(plan, c.python)
            rows += [
                ["container", f"{c.runtime}: {c.image}" + (f" (image ID {ran})" if ran and ran != c.image else "")],
                ["container python", c.python],
                ["container workdir", c.workdir or job.workdir or "—"],
                ["container mounts", ", ".join(m.spec() for m in c.mounts) or "—"],
                ["container user", c.user],
                ["container options", " ".join(c.options) or "—"],
            ]
        if info.get("overrides"):
            ov = info["overrides"]
            rows.append(
                [
                    "from the command line",
                    "; ".join(
                        f"{k} {' '.join(v) if isinstance(v, list) else v}"
                        for k, v in {**ov, "env": ", ".join(masked_env(ov.get("env") or {}))}.items()
                        if v
                    ),
                ]
            )
        parts.append(_table(["key", "value"], rows))
        parts.append(
            _table(
                ["node", "node rank", "host", "addr", "procs", "gpus"],
                [[n.name, i, n.host, n.addr, n.nproc_per_node, n.gpus] for i, n in enumerate(inv.nodes)],
            )
        )
    argv = ((plan.get("nodes") or [{}])[0] or {}).get("argv") or []
    if argv:
        parts.append(
            "<p>command as launched on node rank 0:</p><pre id='command'>"
            + html.escape(shlex.join(str(a) for a in argv))
            + "</pre>"
        )
    return parts


def _preflight(checks: dict[str, Any]) -> list[str]:
    """The preflight table: rows that are not `ok` in view, the `ok` rows folded."""
    parts = ["<h2>preflight</h2>"]
    results = checks.get("results") or []
    if not results:
        return [*parts, "<p class='none'>no preflight recorded (launched with --skip-checks)</p>"]
    header = ["check", "node", "status", "value", "detail", "hint"]

    def rows(rs: list[dict[str, Any]]) -> list[list[Any]]:
        return [
            [r.get("check"), r.get("node"), r.get("status"), r.get("value"), r.get("detail"), r.get("hint")] for r in rs
        ]

    shown = [r for r in results if r.get("status") != "ok"]
    ok = [r for r in results if r.get("status") == "ok"]
    parts.append(_table(header, rows(shown), status_col=2) if shown else "<p class='ok'>every check passed</p>")
    if ok:
        parts.append(
            f"<details id='preflight-ok'><summary>{len(ok)} ok rows</summary>"
            + _table(header, rows(ok), status_col=2)
            + "</details>"
        )
    return parts


def build_report(run: RunDir, results_csv: Path | None = None, scan: LogScan | None = None) -> Path:
    """Write `report/index.html` and its PNGs into the run directory; return the HTML path. The
    node logs are read as streams (`scan`, once; the master's again for rank 0's phases): memory
    does not grow with their size."""
    info = run.read()
    checks = run.read(CHECK)
    plan = run.read("plan.json")
    out = run.path / "report"
    out.mkdir(exist_ok=True, mode=0o700)
    scan = scan or scan_logs(run)
    lines = scan.lines
    master = next((n.node for n in recorded_nodes(info) if n.node_rank == 0), None)
    phases = parse_phases(master_rank0_lines(run, master))
    timeline = plot_timeline(info, phases)
    results_csv = results_csv or (run.path / "results.csv")
    # results.csv when it could be fetched, else the same columns from the trainer's log lines
    results = read_results_csv(results_csv) if results_csv.exists() else parse_results(lines)
    curves = plot_curves(results)
    bars = plot_throughput(parse_throughput(lines))
    per_node = plot_node_throughput(node_throughput(parse_throughput_epochs(lines), recorded_nodes(info)))
    for name, png in (
        ("timeline.png", timeline),
        ("curves.png", curves),
        ("throughput.png", bars),
        ("throughput_nodes.png", per_node),
    ):
        if png is not None:
            write_private(out / name, png)
    summary = summarize(info, results, lines, plan, time.time())
    summary = replace(summary, located=locate(run, summary.weights))
    wall_text = (
        ""
        if summary.wall_s is None
        else (f", running for {summary.wall_s:.1f} s" if summary.running else f", wall time {summary.wall_s:.1f} s")
    )
    state = html.escape(str(info.get("state")))
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>orch run {html.escape(run.run_id)}</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>run {html.escape(run.run_id)} — <span class='{state}'>{state}</span></h1>",
    ]
    failure = info.get("first_failure")
    if failure:
        parts.append(_cause_banner(failure))
    parts.append(
        f"<p>inventory {html.escape(str(info.get('inventory')))}, {len(info.get('nodes', []))} nodes"
        + wall_text
        + "</p>"
    )
    parts += ["<h2>summary</h2>", _summary_card(summary)]
    if failure:
        parts.append("<h2>first failure</h2>")
        ended = f"signal {failure['signal']}" if failure.get("signal") else f"exit code {failure.get('exit_code')}"
        parts.append(
            f"<p class='fail'>node {html.escape(str(failure.get('node')))}, rank "
            f"{html.escape(str(failure.get('rank')))}, {html.escape(ended)}</p>"
        )
        parts.append("<pre>" + html.escape("\n".join(failure.get("excerpt") or [])) + "</pre>")
    parts += [
        "<h2>timeline</h2>",
        _img("timeline", timeline),
        "<h2>loss and mAP</h2>",
        _img("loss and mAP curves", curves),
        "<h2>throughput</h2>",
        _img("throughput per node over the epochs", per_node),
        _img("throughput per rank", bars),
    ]
    earlier = info.get("attempts") or []
    if earlier:
        parts.append("<h2>attempts</h2>")
        parts.append(
            _table(
                ["attempt", "ended", "result", "first failure"],
                [
                    [
                        a.get("attempt"),
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["ended"]))
                        if isinstance(a.get("ended"), (int, float))
                        else "",
                        a.get("result"),
                        _failure_words(a.get("first_failure")),
                    ]
                    for a in earlier
                ],
            )
        )
    parts += _pace_section(run, out, scan)
    parts.append("<h2>nodes</h2>")
    parts.append(
        _table(
            ["node", "node rank", "host", "state", "exit code", "pid"],
            [[n.node, n.node_rank, n.host, n.state, n.exit_code, n.pid] for n in recorded_nodes(info)],
            status_col=3,
        )
    )
    parts += _configuration(run, info, plan)
    if checks.get("fabric"):
        parts += _fabric_section(checks["fabric"], out)
    parts += _preflight(checks)
    parts.append("</body></html>")
    page = out / "index.html"
    write_private(page, "\n".join(parts))
    return page


def _failure_words(first: Any) -> str:
    if not isinstance(first, dict):
        return ""
    cause = first.get("cause") or first.get("reason") or f"exit {first.get('exit_code')}"
    return f"{first.get('node')} rank {first.get('rank')}: {cause}"


@dataclass(frozen=True)
class Located:
    """A path the trainer announced (its `done:` line), where it is: on the master's host through
    the container's mounts (`JobEnv.host_path`), or nowhere outside the container (issue 54.2)."""

    written: str
    """As the trainer wrote it (in a container run, the container's path)."""
    host: str | None
    """On the master's host; None: under no mount, deleted with the container."""

    def text(self, master: str) -> str:
        if self.host is None:
            return f"{self.written} (on {master}: inside the container only, deleted with it)"
        if self.host != self.written:
            return f"{self.host} (on {master}; {self.written} in the container)"
        return f"{self.host} (on {master})"


def locate(run: RunDir, path: str | None) -> Located | None:
    """`path` as the trainer announced it, located on the master's host by the run's inventory
    snapshot (a bare run: the same path)."""
    if path is None:
        return None
    from .config.jobenv import job_env
    from .errors import OrchError

    try:
        inv = run.inventory()
    except (OrchError, OSError):
        return Located(path, path)
    return Located(path, job_env(inv, inv.master).host_path(path))


def fetch_results_csv(run: RunDir, found: Located | None) -> tuple[Path | None, str | None]:
    """Copy the results.csv the trainer announced (`found`, on the master's host) into the run dir:
    (the copy, or an earlier one; why it could not be fetched, never silently)."""
    target = run.path / "results.csv"
    earlier = target if target.exists() else None
    if found is None:
        return earlier, None
    if found.host is None:
        return earlier, f"{found.written} was inside the container only (under no mount): deleted with it"
    from .transport import open_transport

    inv = run.inventory()
    with open_transport(inv, inv.master) as t:
        result = t.run(["cat", found.host], timeout=30)
    if not result.ok:
        said = (result.stderr or "").strip().splitlines()
        why = said[-1] if said else f"exit {result.exit_code}"
        return earlier, f"`cat {found.host}` on {inv.master.name}: {why}"
    write_private(target, result.stdout)
    return target, None


@dataclass(frozen=True)
class ReportOutcome:
    """Where `orch report` wrote the page, and where the run's weights and results are."""

    page: Path
    master: str
    weights: Located | None
    """The weights directory the trainer announced, where it is."""
    results_csv: Located | None
    """The results.csv the trainer announced, where it is."""
    local_csv: Path | None
    """Its copy in the run directory."""
    fetch_error: str | None = None
    """Why results.csv could not be fetched from the master (the report's curves then come from the log)."""


def make_report(run_id: str | None) -> ReportOutcome:
    """Write the report of a run (the latest by default)."""
    from .errors import OrchError, TransportError
    from .store import RunStore

    run = RunStore().get(run_id)
    scan = scan_logs(run)
    announced_weights, announced_csv = announced(scan.lines)
    weights, remote_csv = locate(run, announced_weights), locate(run, announced_csv)
    local_csv, error = None, None
    try:
        local_csv, error = fetch_results_csv(run, remote_csv)
    except (TransportError, OrchError) as exc:
        error = str(exc)
    page = build_report(run, scan=scan)
    master = next((n.node for n in recorded_nodes(run.read())), "the master")
    return ReportOutcome(page, master, weights, remote_csv, local_csv, error)
