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
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .contract import NodeState
from .logs.trainer import Throughput, announced, parse_results, parse_throughput
from .store import CHECK, RunDir, write_private

STATE_COLOURS = {NodeState.RUNNING: "#1f77b4", NodeState.SUCCEEDED: "#2ca02c", NodeState.FAILED: "#d62728",
                 NodeState.STOPPED: "#ff7f0e", NodeState.STARTING: "#9467bd", NodeState.UNREACHABLE: "#8c564b",
                 NodeState.UNKNOWN: "#7f7f7f", NodeState.PENDING: "#7f7f7f"}


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


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def plot_timeline(run: dict[str, Any]) -> bytes:
    """One bar per node from start to end, coloured by its final state; the failure marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = run.get("nodes", [])
    t0 = min([n.get("started_at") or run.get("created", 0) for n in nodes] + [run.get("created") or 0]) or 0
    now = run.get("finished_at") or time.time()
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(nodes))))
    for i, n in enumerate(nodes):
        start = (n.get("started_at") or t0) - t0
        end = (n.get("finished_at") or now) - t0
        state = n.get("state", NodeState.UNKNOWN)
        ax.barh(i, max(end - start, 0.05), left=start, color=STATE_COLOURS.get(state, "#7f7f7f"))
        ax.text(end, i, f" {state}" + (f" ({n['exit_code']})" if n.get("exit_code") not in (None, 0) else ""),
                va="center", fontsize=8)
    ax.set_yticks(range(len(nodes)), [f"{n['node']} (rank {n.get('node_rank', '?')})" for n in nodes])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the run started")
    ax.set_title("node timeline")
    ax.margins(x=0.15)
    return _png(fig)


def plot_curves(results: dict[str, list[float]]) -> bytes | None:
    """Training losses and mAP per epoch from results.csv."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = results.get("epoch")
    losses = [k for k in results if k.startswith("train/") and k.endswith("loss")]
    maps = [k for k in ("metrics/mAP50(B)", "metrics/mAP50-95(B)") if k in results]
    if not epochs or not (losses or maps):
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    for k in losses:
        left.plot(epochs, results[k], marker="o", label=k.removeprefix("train/"))
    left.set_title("training loss")
    left.set_xlabel("epoch")
    left.legend(fontsize=8)
    for k in maps:
        right.plot(epochs, results[k], marker="o", label=k.removeprefix("metrics/"))
    right.set_title("validation mAP")
    right.set_xlabel("epoch")
    if maps:
        right.legend(fontsize=8)
    return _png(fig)


def plot_throughput(tp: Throughput) -> bytes | None:
    """Per-rank images/s bars with the data-wait share and the scaling efficiency."""
    if not tp.ips:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(tp.ips)
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(ranks) + 2), 3))
    ax.bar([str(r) for r in ranks], [tp.ips[r] for r in ranks], color="#1f77b4")
    for r in ranks:
        ax.text(ranks.index(r), tp.ips[r], f"{tp.wait_share.get(r, 0):.0%} wait", ha="center", va="bottom", fontsize=7)
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.axhline(fabric.get("share", 0.7) * statistics.median(values), color=colour, lw=0.8, ls="--")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.set_ylabel("GB/s (best pair)")
    ax.set_title(f"fabric: send / recv per node (red: below {fabric.get('share', 0.7):g} x the median, dashed)",
                 fontsize=9)
    ax.legend(fontsize=8, ncol=2, loc="upper left")
    return _png(fig)


def plot_fabric_sweep(fabric: dict[str, Any]) -> bytes | None:
    """The fabric check's all_reduce sweep: busbw and algbw against the message size."""
    sweep = fabric.get("sweep") or []
    if not sweep:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [row["size_bytes"] for row in sweep]
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot(sizes, [row["busbw_gbps"] for row in sweep], marker="o", label="busbw")
    ax.plot(sizes, [row["algbw_gbps"] for row in sweep], marker=".", ls=":", label="algbw")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{s / (1 << 20):g} MiB" for s in sizes], fontsize=8)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("GB/s")
    ax.set_title(f"all_reduce, {fabric.get('backend')} on {fabric.get('device')}, {fabric.get('world_size')} ranks "
                 f"on {fabric.get('nnodes')} nodes", fontsize=9)
    ax.legend(fontsize=8)
    return _png(fig)


def _fabric_section(fabric: dict[str, Any], out: Path) -> list[str]:
    """The fabric check's part of the page: the sweep as a curve and a table, a bar per node."""
    nodes, sweep = plot_fabric_nodes(fabric), plot_fabric_sweep(fabric)
    for name, png in (("fabric_nodes.png", nodes), ("fabric_sweep.png", sweep)):
        if png is not None:
            write_private(out / name, png)
    parts = ["<h2>fabric</h2>", _img("fabric: rate per node", nodes), _img("fabric: all_reduce sweep", sweep)]
    parts.append(_table(["size (B)", "count (elements)", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"],
                        [[r["size_bytes"], r["count"], r["type"], f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.2f}",
                          f"{r['busbw_gbps']:.2f}", r["wrong"]] for r in fabric.get("sweep") or []]))
    slow = {p["node"] for p in fabric.get("slow_nodes") or []}
    parts.append(_table(["node", "send GB/s", "recv GB/s", "send median", "recv median", "status"],
                        [[p["node"], f"{p['send_gbps']:.3f}", f"{p['recv_gbps']:.3f}", f"{p['send_median_gbps']:.3f}",
                          f"{p['recv_median_gbps']:.3f}", "warn" if p["node"] in slow else "ok"]
                         for p in fabric.get("per_node") or []], status_col=5))
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
img{max-width:100%}"""


def node_log_lines(run: RunDir) -> Iterable[str]:
    """Every line of the controller's copies of the node logs (unordered)."""
    for path in sorted((run.path / "nodes").glob("*.log")):
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield from fh


def build_report(run: RunDir, results_csv: Path | None = None) -> Path:
    """Write `report/index.html` and its PNGs into the run directory; return the HTML path."""
    info = run.read()
    checks = run.read(CHECK)
    out = run.path / "report"
    out.mkdir(exist_ok=True, mode=0o700)
    timeline = plot_timeline(info)
    results_csv = results_csv or (run.path / "results.csv")
    # results.csv when it could be fetched, else the same columns from the trainer's log lines
    curves = plot_curves(read_results_csv(results_csv) if results_csv.exists() else parse_results(node_log_lines(run)))
    tp = parse_throughput(node_log_lines(run))
    bars = plot_throughput(tp)
    for name, png in (("timeline.png", timeline), ("curves.png", curves), ("throughput.png", bars)):
        if png is not None:
            write_private(out / name, png)
    created = info.get("created")
    wall = (info.get("finished_at") or time.time()) - created if created else None
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>orch run {html.escape(run.run_id)}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>run {html.escape(run.run_id)} — <span class='{html.escape(str(info.get('state')))}'>"
             f"{html.escape(str(info.get('state')))}</span></h1>",
             f"<p>inventory {html.escape(str(info.get('inventory')))}, {len(info.get('nodes', []))} nodes"
             + (f", wall time {wall:.1f} s" if wall is not None else "") + "</p>"]
    failure = info.get("first_failure")
    if failure:
        parts.append("<h2>first failure</h2>")
        ended = (f"signal {failure['signal']}" if failure.get("signal")
                 else f"exit code {failure.get('exit_code')}")
        parts.append(f"<p class='fail'>node {html.escape(str(failure.get('node')))}, rank "
                     f"{html.escape(str(failure.get('rank')))}, {html.escape(ended)}</p>")
        why = failure.get("cause") or failure.get("reason")
        if why:
            parts.append(f"<p class='cause'><b>{html.escape(str(why))}</b></p>")
        if failure.get("hint"):
            parts.append(f"<p class='hint'>hint: {html.escape(str(failure['hint']))}</p>")
        parts.append("<pre>" + html.escape("\n".join(failure.get("excerpt") or [])) + "</pre>")
    parts += ["<h2>timeline</h2>", _img("timeline", timeline),
              "<h2>loss and mAP</h2>", _img("loss and mAP curves", curves),
              "<h2>throughput</h2>", _img("throughput per rank", bars)]
    parts.append("<h2>nodes</h2>")
    parts.append(_table(["node", "node rank", "host", "state", "exit code", "pid"],
                        [[n.get("node"), n.get("node_rank"), n.get("host"), n.get("state"), n.get("exit_code"),
                          n.get("pid")] for n in info.get("nodes", [])], status_col=3))
    if checks.get("fabric"):
        parts += _fabric_section(checks["fabric"], out)
    parts.append("<h2>preflight</h2>")
    if checks.get("results"):
        parts.append(_table(["check", "node", "status", "value", "detail", "hint"],
                            [[r.get("check"), r.get("node"), r.get("status"), r.get("value"), r.get("detail"),
                              r.get("hint")] for r in checks["results"]], status_col=2))
    else:
        parts.append("<p class='none'>no preflight recorded (launched with --skip-checks)</p>")
    parts.append("</body></html>")
    page = out / "index.html"
    write_private(page, "\n".join(parts))
    return page


def fetch_results_csv(run: RunDir, found: str | None) -> Path | None:
    """Copy the results.csv the trainer announced (`found`, on the master) into the run dir."""
    target = run.path / "results.csv"
    if found is None:
        return target if target.exists() else None
    from .transport import open_transport

    inv = run.inventory()
    with open_transport(inv, inv.master) as t:
        result = t.run(["cat", found], timeout=30)
    if not result.ok:
        return target if target.exists() else None
    write_private(target, result.stdout)
    return target


@dataclass(frozen=True)
class ReportOutcome:
    """Where `orch report` wrote the page, and where the run's weights and results are."""

    page: Path
    master: str
    weights: str | None
    """The weights directory the trainer announced, on the master."""
    results_csv: str | None
    """The results.csv the trainer announced, on the master."""
    local_csv: Path | None
    """Its copy in the run directory."""
    fetch_error: str | None = None
    """Why results.csv could not be fetched from the master."""


def make_report(run_id: str | None) -> ReportOutcome:
    """Write the report of a run (the latest by default)."""
    from .errors import OrchError, TransportError
    from .store import RunStore

    run = RunStore().get(run_id)
    weights, remote_csv = announced(node_log_lines(run))
    local_csv, error = None, None
    try:
        local_csv = fetch_results_csv(run, remote_csv)
    except (TransportError, OrchError) as exc:
        error = str(exc)
    page = build_report(run)
    master = (run.read().get("nodes") or [{}])[0].get("node", "the master")
    return ReportOutcome(page, master, weights, remote_csv, local_csv, error)
