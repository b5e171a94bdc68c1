"""`orch check` (and the preflight of `orch up`): the check table, the failures' recap, the
fabric check's report, the probe's progress.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ...contract import CHECK_STATUSES
from ..ui import console, may_be_terminal, styled
from .common import markup, safe

if TYPE_CHECKING:
    from rich.console import Console

    from ...preflight.runner import CheckReport
    from ...transport.base import Progress


def check_table(report: CheckReport, out: Console | None = None) -> None:
    """One table grouped by check, a row per node: status, value, detail, hint; then the verdict.
    A node that could not be probed has its `ssh` row (with why) and, instead of a `skip` row in
    every other check, one line under the table. Values, details and hints quote what nodes said:
    all shown `markup` (safe, no markup)."""
    from rich.table import Table

    from ...config.nodeset import fold

    out = out or console(stderr=False)
    table = Table(show_lines=False, pad_edge=False, expand=False)
    for col, kw in (
        ("check", {"no_wrap": True}),
        ("node", {"no_wrap": True}),
        ("status", {"no_wrap": True}),
        ("value", {"overflow": "fold", "max_width": 28}),
        ("detail", {"overflow": "fold"}),
        ("hint", {"overflow": "fold"}),
    ):
        table.add_column(col, **kw)
    down = report.not_probed
    shown = [r for r in report.results if not (r.node in down and r.check != "ssh" and r.status == "skip")]
    last = None
    for r in shown:
        if last is not None and r.check != last:
            table.add_section()
        table.add_row(
            r.check if r.check != last else "",
            markup(r.node),
            styled(r.status),
            markup(r.value),
            markup(r.detail),
            markup(r.hint),
        )
        last = r.check
    out.print(table)
    hidden = [r for r in report.results if r not in shown]
    if hidden:
        checks = list(dict.fromkeys(r.check for r in hidden))
        nodes = list(dict.fromkeys(r.node for r in hidden))
        out.print(
            markup(
                f"not probed, so {len(hidden)} other results skipped: {len(checks)} checks "
                f"({', '.join(checks)}) on {fold(nodes)} (why: their ssh rows)"
            )
        )
    failures_recap(report, out)
    counts = {s: sum(1 for r in report.results if r.status == s) for s in CHECK_STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "[bold red]preflight failed[/]" if not report.ok else "[green]preflight passed[/]"
    out.print(f"{verdict}: {summary} ({report.elapsed_s:.1f} s)")


RECAP_LINES = 10
"""At most this many failure lines under the check table; the rest are counted."""


def failures_recap(report: CheckReport, out: Console) -> None:
    """The failures again, under the table, one line per check and reason with its nodes folded
    (clubak -b style): on a big cluster the table is hundreds of rows and a failure scrolls away."""
    from ...config.nodeset import fold

    groups: dict[tuple[str, str], list[str]] = {}
    for r in report.results:
        if r.status == "fail":
            groups.setdefault((r.check, r.detail), []).append(r.node)
    if not groups:
        return
    out.print("[bold red]failed:[/]")
    for (check, detail), nodes in list(groups.items())[:RECAP_LINES]:
        out.print(f"  {markup(check)} on {markup(fold(nodes))}: {markup(detail)}", soft_wrap=True)
    if len(groups) > RECAP_LINES:
        out.print(f"  and {len(groups) - RECAP_LINES} more (in the table above)")


def fabric_report(fabric: Mapping[str, Any], out: Console | None = None) -> None:
    """The fabric check's measurements: the all_reduce sweep as all_reduce_perf prints it (same
    columns and units), then each node's send/recv rate and what is slow."""
    from ...preflight.fabric.busbw import sweep_table

    shown = out or console(stderr=False)

    def say(text: str) -> None:  # every name and reason in it is the node's: shown safe
        shown.print(safe(text), markup=False, highlight=False, soft_wrap=True)

    if not fabric.get("sweep"):
        say(f"fabric: no measurement ({fabric.get('backend')}, run {fabric.get('run')})")
        return
    say(
        f"\nfabric: {fabric['backend']} on {fabric['device']}, {fabric['world_size']} ranks on "
        f"{fabric['nnodes']} nodes (job {fabric.get('job_s', 0):.1f} s, with launch and teardown "
        f"{fabric.get('wall_s', 0):.1f} s)"
    )
    say(sweep_table(fabric))
    for skipped in fabric.get("skipped") or []:
        say(f"# size {skipped['size_bytes']} left out: {skipped['reason']}")
    per_node = fabric.get("per_node") or []
    if per_node:
        width = max(len(p["node"]) for p in per_node)
        say(f"{'node':<{width}}  send GB/s  recv GB/s   (best pair; medians over its pairs)")
        slow = {(p["node"], p["direction"]) for p in fabric.get("slow_nodes") or []}
        for p in per_node:
            marks = [d for d in ("send", "recv") if (p["node"], d) in slow]
            note = f"   slow {'/'.join(marks)}" if marks else ""
            say(
                f"{p['node']:<{width}}  {_rate(p['send_gbps'], 9)}  {_rate(p['recv_gbps'], 9)}   "
                f"({_rate(p['send_median_gbps'])} / {_rate(p['recv_median_gbps'])}){note}"
            )
    for link in fabric.get("slow_links") or []:
        say(
            f"slow link {link['src']}->{link['dst']}: {link['gbps']:.3f} GB/s, its ends reach "
            f"{link['expected_gbps']:.3f} GB/s"
        )


def _rate(gbps: float | None, width: int = 0) -> str:
    """A rate in GB/s to 3 decimals, `-` for a direction nothing was measured in."""
    return f"{gbps:{width}.3f}" if gbps is not None else "-".rjust(width)


def preload_check_table() -> None:
    """Import what `check_table` draws with (run beside the probe, see `run_preflight`)."""
    import rich.table  # noqa: F401


@contextlib.contextmanager
def probe_progress(nodes: int) -> Iterator[Progress | None]:
    """A spinner on stderr while the nodes are probed, updated by the preflight's progress calls;
    None (and rich never imported) where stderr is not a terminal."""
    err = console(stderr=True) if may_be_terminal(sys.stderr) else None
    if err is None or not err.is_terminal:
        yield None
        return
    with err.status(f"probing {nodes} nodes...") as status:

        def progress(label: str, done: int, total: int) -> None:
            status.update(f"{label} ({done}/{total})")

        yield progress
