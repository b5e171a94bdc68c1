"""`orch top`: the table of nodes, GPUs and ranks, once or live."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..ui import console, styled
from .common import markup, safe

if TYPE_CHECKING:
    from ...top import TopReport


def _num(value: Any, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "" if value is None else fmt.format(value) + unit


def _age(seconds: Any) -> str:
    return "" if seconds is None else f"{seconds:.0f} s"


def _flags(flags: Sequence[str], why: str | None = None) -> str:
    """The flags as markup; `why`: the words of the straggler's kind (`straggler (waiting on others)`)."""
    return " ".join(
        (f"[bold red]{f} ({markup(why)})[/]" if f == "straggler" and why else f"[bold red]{f}[/]")
        if f in ("straggler", "gpu-error", "error")
        else f"[yellow]{f}[/]"
        for f in flags
    )


def _straggler_words(report: TopReport) -> tuple[dict[str, str], dict[int, str]]:
    """What each node's and each rank's latest straggler was named for (`straggler.KINDS`)."""
    from ...run.straggler import KINDS

    by_node: dict[str, str] = {}
    by_rank: dict[int, str] = {}
    for s in report.stragglers:
        by_node[s.node] = by_rank[s.rank] = KINDS.get(s.kind, s.kind)
    return by_node, by_rank


def _no_gpus(n: dict[str, Any], none_yet: str) -> str:
    """The GPU column of a node that lists no GPU: a CPU node says so (no nvidia-smi, none declared),
    anything else is why its GPUs could not be read."""
    return "no GPU (CPU node)" if n.get("no_gpu") else safe(n["gpu_error"] or none_yet)


def top_renderable(report: TopReport, gpus: bool) -> Any:
    """`orch top`'s screen: a row per node (or per GPU with `gpus`), then the stragglers named."""
    import time

    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    when = time.strftime("%H:%M:%S", time.gmtime(report.taken_at))
    table = Table(
        title=f"run {report.run}: {styled(report.state)} · {when} UTC · telemetry every {report.telemetry_s:g} s",
        title_justify="left",
    )
    cols: tuple[str, ...]
    if gpus:
        cols = ("node", "gpu", "rank", "util", "mem", "power", "temp", "SM", "CPU", "img/s", "data", "flags")
    else:
        cols = (
            "node",
            "state",
            "gpus",
            "util",
            "mem",
            "power",
            "temp",
            "CPU",
            "load",
            "rank CPU",
            "img/s",
            "data",
            "last line",
            "flags",
        )
    for col in cols:
        table.add_column(col, justify="right" if col not in ("node", "state", "flags", "gpus") else "left")
    node_why, rank_why = _straggler_words(report)
    for n in report.nodes:
        node = markup(n["node"])
        cpu = _num(n["cpu_pct"], unit=" %")
        ranks = {r["rank"]: r for r in n["ranks"]}
        if gpus:
            if not n["gpus"]:
                table.add_row(
                    node,
                    "-",
                    "",
                    markup(_no_gpus(n, "no GPU sample")[:40]),
                    "",
                    "",
                    "",
                    "",
                    cpu,
                    _num(n["images_per_s"], "{:.1f}"),
                    _num(n["data_share"], "{:.0%}"),
                    _flags(n["flags"], node_why.get(n["node"])),
                )
            for g in n["gpus"]:
                r = ranks.get(g["rank"]) if g["rank"] is not None else None
                table.add_row(
                    node,
                    _num(g["index"], "{}"),
                    "" if g["rank"] is None else str(g["rank"]),
                    _num(g["util_pct"], unit=" %"),
                    f"{_num(g['mem_used_mb'], '{:.0f}')}/{_num(g['mem_total_mb'], '{:.0f}')} MiB",
                    _num(g["power_w"], unit=" W"),
                    _num(g["temp_c"], unit=" °C"),
                    _num(g["sm_mhz"], unit=" MHz"),
                    _num(r["cpu_pct"], unit=" %") if r else "",
                    _num(r["images_per_s"], "{:.1f}") if r else "",
                    _num(r["data_share"], "{:.0%}") if r and r["data_share"] is not None else "",
                    _flags(g["flags"] + (r["flags"] if r else []), rank_why.get(g["rank"])),
                )
            continue
        gs = n["gpus"]
        utils = [g["util_pct"] for g in gs if g["util_pct"] is not None]
        used = [g["mem_used_mb"] for g in gs if g["mem_used_mb"] is not None]
        total = [g["mem_total_mb"] for g in gs if g["mem_total_mb"] is not None]
        power = [g["power_w"] for g in gs if g["power_w"] is not None]
        temps = [g["temp_c"] for g in gs if g["temp_c"] is not None]
        what = f"{len(gs)}× {gs[0]['name'] or 'GPU'}" if gs else _no_gpus(n, "no sample yet")[:32]
        rank_cpu = [r["cpu_pct"] for r in n["ranks"] if r["cpu_pct"] is not None]
        table.add_row(
            node,
            styled(n["state"]),
            markup(what),
            f"{min(utils):.0f}-{max(utils):.0f} %"
            if utils and min(utils) != max(utils)
            else _num(utils[0] if utils else None, unit=" %"),
            f"{sum(used) / 1024:.0f}/{sum(total) / 1024:.0f} GiB" if used and total else "",
            f"{sum(power):.0f} W" if power else "",
            f"{max(temps):.0f} °C" if temps else "",
            cpu,
            _num(n["load1"], "{:.1f}"),
            (f"{min(rank_cpu):.0f}-{max(rank_cpu):.0f} %" if min(rank_cpu) != max(rank_cpu) else f"{rank_cpu[0]:.0f} %")
            if rank_cpu
            else "",
            _num(n["images_per_s"], "{:.1f}"),
            _num(n["data_share"], "{:.0%}"),
            _age(n["last_line_age_s"]),
            _flags(n["flags"], node_why.get(n["node"])),
        )
    parts: list[Any] = [table]
    for s in report.stragglers:
        parts.append(Text(s.line(), style="bold red"))
    if report.ignored_lines:
        parts.append(
            Text(
                f"{_lines(report.ignored_lines)} of the node logs ignored: not a finite telemetry or timing record",
                style="yellow",
            )
        )
    for n in report.nodes:
        if n["fetch_error"]:
            parts.append(
                Text(
                    f"{n['node']}: log not fetched ({safe(n['fetch_error'])[:100]}); showing the last copy",
                    style="yellow",
                )
            )
    return Group(*parts)


def _lines(n: int) -> str:
    return f"{n} line" + ("" if n == 1 else "s")


def top_table(report: TopReport, gpus: bool) -> None:
    """`orch top --once`: the screen, printed once on stdout."""
    console(stderr=False).print(top_renderable(report, gpus))


def top_live(frames: Iterable[TopReport], gpus: bool) -> None:
    """`orch top`: the screen redrawn for each refresh (on a terminal; else printed after each)."""
    out = console(stderr=False)
    if not out.is_terminal:
        for report in frames:
            out.print(top_renderable(report, gpus))
        return
    from rich.live import Live

    with Live(console=out, auto_refresh=False, screen=False) as live:
        for report in frames:
            live.update(top_renderable(report, gpus), refresh=True)
