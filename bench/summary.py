"""Collect bench/results/*.json into summary.md (a table of ratios) and summary.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import RESULTS


def results_files() -> list[Path]:
    """The full runs' results; `--quick` smoke runs write `<name>.quick.json`, left out."""
    return [p for p in sorted(RESULTS.glob("*.json")) if not p.name.endswith(".quick.json")]


def rows() -> list[dict[str, Any]]:
    """Every benchmark's `summary` rows: what, orch, peer, ratio (orch/peer), goal, met."""
    out = []
    for path in results_files():
        data = json.loads(path.read_text())
        for row in data.get("summary", []):
            out.append({"benchmark": data.get("benchmark", path.stem), **row})
    return out


def machine_line() -> str:
    for path in results_files():
        m = json.loads(path.read_text()).get("machine")
        if m:
            return f"{m['cpus']} CPUs, {m['memory_mb']} MB, Python {m['python']}, {m['platform']}, {m['date']}"
    return "unknown machine"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "" if v is None else str(v)


def short_label(text: str, width: int = 80) -> str:
    """A label cut in the middle, so that its end (the sizes, N=32 or 4 nodes) stays readable."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 3] + "…" + text[len(text) - keep // 3 :]


def write_summary() -> Path:
    table = rows()
    lines = [
        f"Measured on: {machine_line()}",
        "",
        "| benchmark | what | orch | peer | ratio | goal | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        met = {True: "yes", False: "no"}.get(r.get("met"), "")
        lines.append(
            f"| {r['benchmark']} | {r.get('what', '')} | {fmt(r.get('orch'))} | {fmt(r.get('peer'))} | "
            f"{fmt(r.get('ratio'))} | {r.get('goal', '')} | {met} |"
        )
    path = RESULTS / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    plotted = [r for r in table if isinstance(r.get("ratio"), (int, float))]
    if plotted:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 0.4 * len(plotted) + 1.2))
        labels = [short_label(f"{r['benchmark']}: {r.get('what', '')}") for r in plotted]
        colours = ["#2ca02c" if r.get("met") else "#d62728" if r.get("met") is False else "#1f77b4" for r in plotted]
        # one bar per row, by position: rows whose labels read alike (4 and 32 nodes) stay apart
        ax.barh(range(len(plotted)), [r["ratio"] for r in plotted], color=colours)
        ax.set_yticks(range(len(plotted)), labels)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")  # ratios span 0.04 to 50: parity (1) in the middle
        ax.invert_yaxis()
        ax.set_xlabel("ratio orch / peer, log scale (green: goal met, red: not met; see the table)")
        fig.savefig(RESULTS / "summary.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
    return path
