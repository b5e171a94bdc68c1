"""`orch up`: the dry run's plan, the live progress (`UpPrinter`, `LiveLine`), a stopped node's
line, how the run ended (`up_outcome`).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..ui import console, may_be_terminal
from .check import check_table, fabric_report
from .common import markup
from .logs import LogPrinter
from .remote import sync_report
from .runs import failure_head, progress_text, stacks_view

if TYPE_CHECKING:
    from ...config.inventory import Inventory
    from ...config.plan import Plan
    from ...logs.lines import LogLine
    from ...logs.teardown import NodeStopped
    from ...preflight.runner import CheckReport
    from ...remote.sync import SyncReport
    from ...run.stacks import StacksReport
    from ...run.straggler import Straggler
    from ...up import UpOutcome


def plan_table(plan: Plan, env_values: bool = False) -> None:
    """The dry-run table: node, address, node rank, global ranks, the exact remote command, the
    inventory's env values hidden (`***`) unless `env_values` (`--show-env`)."""
    from rich.table import Table

    from ...config.plan import HIDDEN

    out = console(stderr=False)
    hidden = not env_values and any(v == HIDDEN for p in plan.nodes for v in p.shown_env().values())
    table = Table(
        title=f"plan for {markup(plan.inventory.path)}: {len(plan.nodes)} nodes, world size "
        f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}",
        caption="env values hidden (***): --show-env prints them" if hidden else None,
        show_lines=True,
    )
    for col in ("node", "address", "node rank", "global ranks", "command"):
        table.add_column(col, overflow="fold")
    for p in plan.nodes:
        env = " ".join(
            f"{k}={v if v == HIDDEN and not env_values else shlex.quote(v)}"
            for k, v in p.shown_env(env_values).items()
            if not k.startswith("ORCH_")
        )
        cmd = (f"cd {p.workdir} && " if p.workdir else "") + (env + " " if env else "") + shlex.join(p.argv)
        ranks = (
            f"{p.global_ranks.start}-{p.global_ranks.stop - 1}"
            if len(p.global_ranks) > 1
            else str(p.global_ranks.start)
        )
        # inventory values (env, args, paths) are shown as written, but never as markup or controls
        table.add_row(
            p.node.name,
            f"{p.node.host}" + (f" ({p.node.addr})" if p.node.addr != p.node.host else ""),
            str(p.node_rank),
            ranks,
            markup(cmd),
        )
    out.print(table)
    for warning in plan.warnings:
        out.print(f"[yellow]{markup(warning)}[/]", soft_wrap=True)


def overrides_note(overrides: Any) -> None:
    """Under the dry-run table: what the command line changed of the inventory for this run."""
    if overrides.empty:
        return
    out = console()
    picked = [
        f"{k} {v}"
        for k, v in (
            ("--include", overrides.include),
            ("--exclude", overrides.exclude),
            ("--nodes", overrides.first),
            ("--master", overrides.master),
        )
        if v is not None
    ]
    if picked:
        out.print("nodes from the command line: " + markup(" ".join(picked)))
    if overrides.env:
        out.print("env from the command line: " + markup(", ".join(overrides.env)))
    if overrides.args:
        out.print(
            "job args from the command line (each replaces the inventory's same setting): "
            + markup(shlex.join(overrides.args))
        )


class LiveLine:
    """One status line kept at the bottom of a terminal's stderr (`orch up`'s training progress):
    everything else written to stderr through `stream`, and every stdout line through `above`,
    first erases it, and `show` draws it again. Nothing of it where stderr is no terminal."""

    def __init__(self, real: Any = None) -> None:
        self.real = real or sys.stderr
        self.on = may_be_terminal(self.real) and self.real.isatty()
        self.text = ""
        self.shown = False
        self.stream = _ClearingStream(self)

    def clear(self) -> None:
        if self.shown:
            self.real.write("\r\033[K")
            self.real.flush()
            self.shown = False

    def show(self, text: str | None = None) -> None:
        if text is not None:
            self.text = text
        if self.on and self.text:
            width = shutil_width()
            self.real.write("\r\033[K" + self.text[: max(10, width - 1)])
            self.real.flush()
            self.shown = True


def shutil_width() -> int:
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


class _ClearingStream:
    """stderr for the console of `orch up`'s messages: the live line is erased before each write."""

    def __init__(self, live: LiveLine) -> None:
        self.live = live

    def write(self, text: str) -> int:
        self.live.clear()
        return int(self.live.real.write(text))

    def flush(self) -> None:
        self.live.real.flush()

    def isatty(self) -> bool:
        return bool(self.live.real.isatty())

    def fileno(self) -> int:
        return int(self.live.real.fileno())

    @property
    def encoding(self) -> str:
        return str(getattr(self.live.real, "encoding", "utf-8"))


class UpPrinter:
    """`orch up` as it goes (an `up.UpProgress`): messages on stderr, the merged log on stdout,
    and on a terminal one live line under them with a trainer run's progress (epoch k/N,
    images/s, the last validation mAP, ETA), read from rank 0's lines."""

    def __init__(self) -> None:
        from ...logs.trainer import Progress

        self.live = LiveLine()
        self.err = console(stream=self.live.stream) if self.live.on else console()
        self.log: LogPrinter | None = None
        self.progress = Progress()
        self.run_id = ""

    def syncing(self, inv: Inventory) -> None:
        self.err.print(f"syncing {len(inv.job.sync)} path(s) of job.sync to {len(inv.nodes)} nodes...")

    def synced(self, report: SyncReport, elapsed_s: float) -> None:
        sync_report(report, sys.stderr)
        if report.ok:
            self.err.print(f"sync done in {elapsed_s:.1f} s")

    def preflight_done(self, report: CheckReport, elapsed_s: float) -> None:
        if not report.ok or any(r.status == "warn" for r in report.results):
            check_table(report, self.err)
        if report.fabric is not None:
            fabric_report(report.fabric, self.err)
        if report.ok:
            self.err.print(f"preflight passed in {elapsed_s:.1f} s")

    def starting(self, plan: Plan) -> None:
        from ...logs.lines import column_widths

        self.log = LogPrinter(column_widths([p.node.name for p in plan.nodes], plan.world_size))
        self.run_id = plan.run_id
        self.err.print(
            f"run [bold]{plan.run_id}[/]: starting {len(plan.nodes)} nodes × "
            f"{plan.nodes[0].node.nproc_per_node} processes (world size {plan.world_size}, "
            f"master {plan.master_addr}:{plan.master_port})"
        )
        for warning in plan.warnings:
            self.err.print(f"[yellow]{markup(warning)}[/]", soft_wrap=True)

    def start_failed(self, failures: Mapping[str, Exception]) -> None:
        from ...errors import OrchError

        for name, exc in failures.items():
            msg = exc.message if isinstance(exc, OrchError) else f"{type(exc).__name__}: {exc}"
            self.err.print(f"[bold red]{markup(name)}: could not start[/]: {markup(msg)}")
            hint = getattr(exc, "hint", None)
            if hint:
                self.err.print(f"  hint: {markup(hint)}")

    def running(self, plan: Plan, startup_s: float) -> None:
        self.err.print(f"all {len(plan.nodes)} nodes running after {startup_s:.1f} s")

    def line(self, line: LogLine) -> None:
        assert self.log is not None
        changed = line.rank == 0 and self.progress.feed(line.text, line.ts)
        self.live.clear()
        sys.stdout.write(self.log.line(line) + "\n")
        sys.stdout.flush()
        self.live.show(progress_text(self.progress) if changed else None)

    def log_event(self, node: str, message: str) -> None:
        self.err.print(f"[dim]{markup(node)}: {markup(message)}[/]")

    def node_stopped(self, stop: NodeStopped) -> None:
        """One line per stopped node, instead of the tracebacks its stop made it print."""
        self.err.print(f"[dim]{node_stopped_text(stop, self.run_id)}[/]", soft_wrap=True)

    def log_stopped(self, exc: Exception) -> None:
        self.err.print(f"[yellow]log streaming stopped: {markup(exc)}[/]")

    def warning(self, message: str) -> None:
        self.err.print(f"[yellow]warning: {markup(message)}[/]")

    def stalled(self, silent_s: float, timeout_s: float) -> None:
        self.err.print(
            f"[bold yellow]no rank wrote a line for {silent_s:.0f} s[/] (stall timeout {timeout_s:g} s): "
            "taking every rank's stack"
        )

    def straggler(self, found: Straggler, stop: bool) -> None:
        self.err.print(f"[bold yellow]{markup(found.line())}[/]")
        if stop:
            self.err.print(
                "job.straggler.action is stop: the run is stopped, naming "
                f"{markup(found.node)} (a retry replaces it with a spare)"
            )

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:

        if report is not None:
            stacks_view(report, self.err)
        if problem:
            self.err.print(f"[yellow]no stacks: {markup(problem)}[/]")
        if not stop:
            self.err.print(
                "job.on_stall is warn: the run goes on; a new silence of the stall timeout is reported again"
            )

    def retrying(self, attempt: int, attempts: int, why: str, excerpt: Sequence[str] = ()) -> None:

        for line in excerpt:
            self.err.print(f"  {markup(line)}", soft_wrap=True)
        self.err.print(
            f"\n[bold yellow]attempt {attempt}/{attempts}[/] after {markup(why)}; "
            "every node was stopped, checking the nodes again"
        )

    def replacing(self, node: str, spare: str, why: str) -> None:

        # `why` says which: a straggler stopped, job.sync failed, else a check of the preflight
        what, detail = (
            ("was stopped as a straggler", why.removeprefix("straggler: "))
            if why.startswith("straggler: ")
            else ("could not receive job.sync", why.removeprefix("sync: "))
            if why.startswith("sync: ")
            else ("failed the preflight", why)
        )
        self.err.print(
            f"[yellow]{markup(node)} {what}[/] ({markup(detail)}): "
            f"spare [bold]{markup(spare)}[/] takes its place, ranks re-planned"
        )

    def resuming(self, how: str) -> None:

        self.err.print(
            f"the trainer is relaunched with {markup(how)}: it continues its own last.pt if it wrote one, "
            "else starts over in the same run directory"
        )

    def allocation(self, message: str) -> None:
        self.live.clear()
        self.err.print(f"[dim]{markup(message)}[/]", soft_wrap=True)


def node_stopped_text(stop: NodeStopped, run_id: str) -> str:
    """`n0: stopped 0.4 s after its agent got SIGTERM (torchrun exited with code 1); the 31 lines it
    printed meanwhile are in its log: orch logs RUN --node n0`, as markup."""
    node = markup(stop.node)
    ended = (
        f"torchrun ended by {markup(stop.exit_signal)}"
        if stop.exit_signal
        else f"torchrun exited with code {stop.exit_code}"
    )
    if stop.exit_code is None:
        how = "stopping (its end is not in the log yet)"
    elif stop.received is None:
        how = f"ended while the run was being stopped ({ended})"
    else:
        how = f"stopped {stop.seconds or 0:.1f} s after its agent got {markup(stop.received)} ({ended})"
    if not stop.held:
        return f"{node}: {how}"
    what = "the line it printed meanwhile is" if stop.held == 1 else f"the {stop.held} lines it printed meanwhile are"
    return f"{node}: {how}; {what} in its log: orch logs {markup(run_id)} --node {node}"


def launch_lines(lines: list[list[str]], planned: bool) -> None:
    """The commands of this machine `orch up` would run to get the nodes and launch (a Slurm
    allocation's sbatch and srun), one per line, quoted as a shell would take them."""
    if not lines:
        return
    out = console(stderr=False)
    if not planned:
        out.print(
            "the nodes are the allocation's: node ranks follow its order, its first node is the master "
            "(run inside salloc, or orch up, to see the plan)"
        )
    for line in lines:
        out.print(markup(shlex.join(line)), soft_wrap=True)


def allocation_line(message: str) -> None:
    """A line on stderr about the nodes' allocation (`orch check` with `transport: slurm`)."""
    console().print(f"[dim]{markup(message)}[/]", soft_wrap=True)


def up_outcome(outcome: UpOutcome) -> None:
    """How `orch up` ended: success, the first failure with its excerpt, or what was left."""
    out = console()
    run = outcome.run_id
    unconfirmed = markup(", ".join(outcome.not_stopped))
    attempt = f" (attempt {outcome.attempt} of {outcome.attempts})" if outcome.attempts > 1 else ""
    if outcome.result == "retry_preflight_failed":
        nodes = "; ".join(f"{n}: {why}" for n, why in outcome.retry_failed.items())
        step = "the sync" if any(why.startswith("sync: ") for why in outcome.retry_failed.values()) else "the preflight"
        out.print(
            f"\n[bold red]run {run} failed[/]: attempt {outcome.attempt} of {outcome.attempts} was not "
            f"launched: {step} failed on {markup(nodes)} ({markup(outcome.no_retry or '')})"
        )
        if outcome.sync_error is not None and outcome.sync_error.hint:
            out.print(f"  hint: {markup(outcome.sync_error.hint)}")
        f = outcome.failure
        if f is not None:
            out.print("the failure it was to retry: " + failure_head(f.to_json()), soft_wrap=True)
        return
    if outcome.result == "sync_failed":
        if outcome.sync_error is not None:
            out.print(f"orch: {markup(outcome.sync_error.message)}")
            if outcome.sync_error.hint:
                out.print(f"  hint: {markup(outcome.sync_error.hint)}")
        out.print(
            "[bold red]job.sync could not be copied to every node: nothing was launched[/] (fix it, "
            "or pass --skip-sync to launch with what the nodes have)"
        )
    elif outcome.result == "preflight_failed":
        # a node that cannot be reached is left out with --exclude: --skip-checks cannot launch there
        from ...config.nodeset import fold

        failed = outcome.preflight.failed() if outcome.preflight is not None else []
        down = sorted({r.node for r in failed if r.check == "ssh"})
        rest = [r for r in failed if r.node not in down]
        if down:
            names = markup(fold(down))
            out.print(
                f"[bold red]preflight failed: nothing was launched[/]; {names} cannot be reached: leave "
                f"{'them' if len(down) > 1 else 'it'} out with --exclude {names}"
                + (" (and fix the other failures above, or pass --skip-checks to launch anyway)" if rest else "")
            )
        else:
            out.print(
                "[bold red]preflight failed: nothing was launched[/] (fix the failures above, "
                "or pass --skip-checks to launch anyway)"
            )
    elif outcome.result == "start_failed":
        out.print(
            f"stopped every node that had started ({outcome.teardown_s or 0:.1f} s); nothing was left running"
            if not unconfirmed
            else f"[bold red]could not confirm the stop on: {unconfirmed}[/] (run: orch down {run})"
        )
        for node, why in outcome.never_started.items():
            out.print(
                f"{markup(node)} never started ({markup(why)}): launch without it with --exclude {markup(node)}",
                soft_wrap=True,
            )
    elif outcome.result == "detached":
        out.print(f"detached. Follow: orch logs --follow {run} · state: orch status {run} · stop: orch down {run}")
    elif outcome.result == "interrupted":
        out.print(
            f"interrupted: stopped every node in {outcome.teardown_s or 0:.1f} s"
            if not unconfirmed
            else f"[bold red]interrupted; could not confirm the stop on {unconfirmed}[/]"
        )
    elif outcome.result == "stopped":
        out.print(
            f"run {run} stopped by orch down{attempt}: every node stopped, nothing relaunched"
            if not unconfirmed
            else f"[bold red]run {run} stopped by orch down; could not confirm the stop on {unconfirmed}[/]"
        )
    elif outcome.result == "succeeded":
        out.print(f"[green]run {run} succeeded on every node[/] in {outcome.wall_s or 0:.1f} s{attempt}")
        for node, why in outcome.not_stopped.items():
            out.print(f"[bold yellow]{markup(node)}: {markup(why)}[/] (run: orch down {run})")
    else:
        # the excerpt first, the cause last: the last lines on the screen say why
        f = outcome.failure
        assert f is not None
        if f.excerpt:
            out.print(
                f"\n[bold red]run {run} failed{attempt}[/]; the last lines of {markup(f.node)} "
                f"(all of them: orch logs {run} --node {markup(f.node)}):",
                soft_wrap=True,
            )
        for line in f.excerpt:
            out.print(f"  {markup(line)}", soft_wrap=True)
        out.print(
            f"stopped every other node in {outcome.teardown_s or 0:.1f} s"
            if not unconfirmed
            else f"[bold red]could not confirm the stop on {unconfirmed}[/]: run `orch down {run}` once they "
            "are reachable"
        )
        if outcome.no_retry:
            out.print(f"[bold red]{markup(outcome.no_retry)}[/]")
        out.print(
            f"[bold red]run {run} failed{attempt}[/]: first failure on " + failure_head(f.to_json()), soft_wrap=True
        )
        if f.hint:
            out.print(f"  hint: {markup(f.hint)}", soft_wrap=True)


def not_retried_detached(retries: int) -> None:
    """The inventory asks for retries, but a detached run has nobody to relaunch it (or to watch for a hang)."""
    console().print(
        f"[yellow]note:[/] job.retries ({retries}) and the hang watchdog apply to an attached orch up "
        "only: this detached run is not relaunched when it fails, nor stopped when it hangs"
    )
