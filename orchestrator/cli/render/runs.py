"""A run's commands: `orch status`, `orch runs`, `orch down`, `orch stacks`, `orch report`; the
first failure's head line and the trainer's progress, which `orch up` shows too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..ui import console, styled
from .common import click_stdout, markup, safe

if TYPE_CHECKING:
    from rich.console import Console

    from ...report import ReportOutcome
    from ...run.control import DownReport, StatusReport
    from ...run.history import RunsReport
    from ...run.stacks import StacksReport


def stacks_view(report: StacksReport, out: Console | None = None) -> None:
    """`orch stacks`: one line per group of ranks on the same frames (ranks folded, dshbak-style),
    the odd group marked, then every node or rank whose stack could not be taken and why."""

    from ...run.stacks import odd_ranks

    out = out or console(stderr=False)
    groups = report.groups
    odd = odd_ranks(groups)
    width = max((len(g.label) for g in groups), default=0)
    for g in groups:
        mark = "[bold red]" if g.ranks == odd else "[bold]"
        where = f" on {', '.join(g.nodes)}" if len(g.nodes) <= 2 else f" on {len(g.nodes)} nodes"
        out.print(f"{mark}{markup(g.label):<{width}}[/]  {markup(g.summary)}[dim]{markup(where)}[/]", soft_wrap=True)
    for where, why in report.problems.items():
        out.print(f"[yellow]{markup(where)}[/]: {markup(why)}", soft_wrap=True)
    for r in report.ranks:
        if r.error is not None:
            out.print(f"[yellow]rank {r.rank} on {markup(r.node)}[/]: {markup(r.error)}", soft_wrap=True)
    if not groups and not report.problems:
        out.print("no rank process found")
    for path in report.saved[:1]:
        out.print(f"saved: {markup(str(path))} (and {markup(path.with_suffix('.txt').name)})", soft_wrap=True)


def failure_head(ff: Mapping[str, Any]) -> str:
    """`NODE (node rank N, rank R, exit code C): CAUSE` of a first failure (its JSON), as rich markup.
    A process a signal ended shows the signal as its cause, never torchrun's exit code."""
    rank = f"rank {ff['rank']}" if ff.get("rank") is not None else "rank unknown"
    code = f", exit code {ff.get('exit_code')}" if not ff.get("signal") else ""
    node_rank = f"node rank {ff['node_rank']}, " if ff.get("node_rank") is not None else ""
    why = ff.get("cause") or ff.get("reason") or ""
    return f"[bold]{markup(ff.get('node'))}[/] ({node_rank}{rank}{code}): {markup(why)}"


def status_table(report: StatusReport) -> None:
    """One row per node: state, exit code, pid, uptime, last log; then the first failure."""
    from rich.table import Table

    out = console(stderr=False)
    attempt = f" (attempt {report.attempt} of {report.max_attempts})" if report.max_attempts > 1 else ""
    # the headline on a line of its own, never wrapped: as a table title it wrapped to the table's
    # width once run ids carried the controller's name, and `orch status | head -1` lost the attempt
    out.print(f"run {markup(report.run)}: {styled(str(report.state))}{attempt}", soft_wrap=True)
    table = Table()
    for col in ("node", "rank", "state", "exit", "pid", "uptime", "last log"):
        table.add_column(col)
    for n in report.nodes:
        up = "" if n.uptime_s is None else f"{n.uptime_s:.0f} s"
        last = "" if n.last_log_age_s is None else f"{n.last_log_age_s:.0f} s ago"
        table.add_row(
            n.node,
            str(n.node_rank),
            styled(str(n.state)),
            "" if n.exit_code is None else str(n.exit_code),
            str(n.pid or ""),
            up,
            last if not n.error else markup(safe(n.error)[:80]),
        )
    out.print(table)
    for n in report.nodes:
        if n.disk_full:
            out.print(f"[yellow]node {markup(n.node)}: {markup(safe(n.disk_full))}[/]", soft_wrap=True)
    for found in report.stragglers:
        out.print(f"[bold yellow]{markup(found.get('line', ''))}[/]")
    if report.reason:  # the nodes stopped on their own: why, in their words
        out.print(f"{styled(str(report.state))}: {markup(safe(report.reason))}", soft_wrap=True)
    ff = report.first_failure
    if ff:
        out.print("first failure: " + failure_head(ff), soft_wrap=True)
        if ff.get("hint"):
            out.print(f"  hint: {markup(ff['hint'])}", soft_wrap=True)
        out.print(f"  its log: orch logs {markup(report.run)} --node {markup(ff.get('node'))}", soft_wrap=True)


def duration(seconds: float | None) -> str:
    """`52.4 s`, `12m05s`, `3h07m`: a wall time for a person."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def short(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters (`…` where cut): a table cell."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def runs_table(report: RunsReport) -> None:
    """`orch runs`: one row per run, newest first; then how many older ones were left out."""
    import time

    from rich.table import Table

    out = console(stderr=False)
    if not report.runs:
        console().print(f"no runs yet in {markup(report.home)}/runs (start one with: orch up INVENTORY)")
        return
    table = Table(title=f"runs in {markup(report.home)}", title_justify="left")
    for col in (
        "run",
        "inventory",
        "state",
        "attempt",
        "started",
        "wall time",
        "nodes×procs",
        "first failure / reason",
    ):
        table.add_column(col)
    for r in report.runs:
        started = "" if r.started is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
        wall = ("running for " if r.running else "") + duration(r.wall_s)
        table.add_row(
            markup(r.run),
            markup(r.inventory or "") + (f" (Slurm job {markup(r.slurm_job)})" if r.slurm_job else ""),
            styled(r.state),
            f"{r.attempt}/{r.max_attempts}",
            started,
            wall,
            r.shape,
            markup(r.failure or short(safe(r.reason or ""))),
        )
    out.print(table)
    if report.left_out:
        console().print(f"{report.left_out} older runs not shown (orch runs --all)")


def progress_text(p: Any) -> str:
    """`epoch 3/10 (batch 40/120) · 512.3 images/s · data 4% · mAP50-95 0.412 (epoch 2) · ETA 14m35s`."""
    parts = [f"epoch {p.epoch}/{p.epochs}" + (f" (batch {p.batch}/{p.batches})" if p.batches else "")]
    if p.images_per_s is not None:
        parts.append(f"{p.images_per_s:.1f} images/s")
    if p.data_wait is not None:
        parts.append(f"data {p.data_wait:.0%}")
    if p.map50_95 is not None:
        parts.append(f"mAP50-95 {p.map50_95:.3f} (epoch {p.val_epoch})")
    if p.done:
        parts.append("done")
    elif p.eta_s is not None:
        parts.append(f"ETA {duration(p.eta_s)}")
    return " · ".join(parts)


def progress_note(progress: Any, state: str) -> None:
    """Under the status table: where the training is (or was, for a run that ended)."""
    from ...contract import FINAL_STATES

    label = "training" if str(state) not in FINAL_STATES else "training (last seen)"
    if str(state) in FINAL_STATES and not progress.done:
        import dataclasses

        progress = dataclasses.replace(progress, eta_s=None)
    console(stderr=False).print(f"{label}: {markup(progress_text(progress))}")


def down_report(result: DownReport) -> None:
    """Per node: what was stopped, or why not; then whether anything is left."""
    out = console()
    done, failed = result.results.succeeded, result.results.failed
    for name in result.results:
        res = done.get(name)
        if res is None:
            out.print(f"[bold red]{markup(name)}: not stopped[/]: {markup(failed[name])}")
        elif res.remaining:
            out.print(f"[bold red]{markup(name)}: processes still running[/]: {list(res.remaining)}")
        elif res.foreign:
            out.print(f"[yellow]{markup(name)}: {markup(safe(res.note or 'another launch of this run id'))}[/]")
        elif res.status is None and res.note:  # nothing to ask there: never started, or its allocation ended
            out.print(f"{markup(name)}: {markup(safe(res.note))}")
        else:
            n = len(res.stopped)
            out.print(f"{markup(name)}: " + (f"stopped {n} processes (none is left)" if n else "nothing running"))
        if res is not None and res.status is not None and res.status.disk_full:
            out.print(f"[yellow]{markup(name)}: {markup(safe(res.status.disk_full))}[/]")
        if res is not None and res.strangers:
            out.print(
                f"[yellow]{markup(name)}: left alone {len(res.strangers)} processes that hold ids the run "
                f"recorded but are not the job's (pid reuse): {list(res.strangers)}[/]"
            )
    if not result.complete:
        out.print(
            f"run {result.run}: some nodes could not be stopped; run `orch down {result.run}` again "
            "when they are reachable"
        )
    else:
        out.print(f"run {result.run}: nothing left running on {len(done)} nodes ({result.elapsed_s:.1f} s)")
    if result.released:
        out.print(f"run {result.run}: {markup(result.released)}")


def report_outcome(outcome: ReportOutcome) -> None:
    out = console()
    if outcome.fetch_error:
        out.print(f"[yellow]results.csv not fetched[/]: {markup(outcome.fetch_error)}")
    if outcome.weights:
        out.print(f"weights: {markup(outcome.weights.text(outcome.master))}")
    if outcome.results_csv:
        copy = f", copy in {outcome.local_csv.resolve()}" if outcome.local_csv else ""
        out.print(f"results: {markup(outcome.results_csv.text(outcome.master))}" + markup(copy))
    out.print(f"report:  {outcome.page.resolve()}")
    click_stdout(str(outcome.page.resolve()))
