"""Collect bench/results/*.json into summary.md (a table of ratios) and summary.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS


def rows() -> list[dict[str, Any]]:
    """Every benchmark's `summary` rows: what, orch, peer, ratio (orch/peer), goal, met."""
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        for row in data.get("summary", []):
            out.append({"benchmark": data.get("benchmark", path.stem), **row})
    return out


def machine_line() -> str:
    for path in sorted(RESULTS.glob("*.json")):
        m = json.loads(path.read_text()).get("machine")
        if m:
            return f"{m['cpus']} CPUs, {m['memory_mb']} MB, Python {m['python']}, {m['platform']}, {m['date']}"
    return "unknown machine"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def write_summary() -> Path:
    table = rows()
    lines = [f"Measured on: {machine_line()}", "",
             "| benchmark | what | orch | peer | ratio | goal | met |", "|---|---|---|---|---|---|---|"]
    for r in table:
        met = {True: "yes", False: "no"}.get(r.get("met"), "")
        lines.append(f"| {r['benchmark']} | {r.get('what', '')} | {fmt(r.get('orch'))} | {fmt(r.get('peer'))} | "
                     f"{fmt(r.get('ratio'))} | {r.get('goal', '')} | {met} |")
    path = RESULTS / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    plotted = [r for r in table if isinstance(r.get("ratio"), (int, float))]
    if plotted:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 0.4 * len(plotted) + 1.2))
        labels = [f"{r['benchmark']}: {r.get('what', '')}"[:70] for r in plotted]
        colours = ["#2ca02c" if r.get("met") else "#d62728" if r.get("met") is False else "#1f77b4" for r in plotted]
        ax.barh(labels, [r["ratio"] for r in plotted], color=colours)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("ratio orch / peer (see the table for which way is better)")
        fig.savefig(RESULTS / "summary.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return path
