"""Everything orch shows people: tables and progress on the terminal, `--json` alone on stdout.

The library never prints: commands return outcome objects (a CheckReport, an up outcome, a status
report...) or yield what to show, and the functions here render them. rich is imported inside
them, so a command that draws nothing (`orch check --json` in a pipe) never loads it.

Text that comes from a node (log lines, a check's value, detail and hint, a failure's excerpt and
reason, errors quoting a node's stderr) is shown through `safe` (`logs.lines.printable`): no
escape sequence a job prints reaches the terminal. Where rich draws it, it is also markup-escaped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..contract import CHECK_STATUSES
from .ui import color_enabled, console, may_be_terminal, styled

if TYPE_CHECKING:
    from rich.console import Console

    from ..config.inventory import Inventory
    from ..config.plan import Plan
    from ..logs.lines import LogLine
    from ..logs.teardown import NodeStopped
    from ..preflight.runner import CheckReport
    from ..remote.exec import ExecReport
    from ..remote.image import ImageReport
    from ..remote.rsync import Transfer
    from ..remote.sync import SyncReport
    from ..report import ReportOutcome
    from ..run.control import DownReport, StatusReport
    from ..run.history import RunsReport
    from ..run.stacks import StacksReport
    from ..run.straggler import Straggler
    from ..top import TopReport
    from ..transport.base import Progress
    from ..up import UpOutcome


def safe(text: object) -> str:
    """Text from a node, made safe for a terminal (`logs.lines.printable`)."""
    from ..logs.lines import printable

    return printable(str(text))


def markup(text: object) -> str:
    """Text from a node for a rich string with markup: safe, and its `[...]` not taken as markup
    (rich's `[link=...]` would write a hyperlink escape)."""
    from rich.markup import escape

    return escape(safe(text))


def orch_error(message: str, hint: str | None = None) -> None:
    """An error orch raised on purpose (or an unexpected one): `orch: MESSAGE` and `  hint: HINT`
    on stderr. The message may quote a node (its stderr, a path it sent): shown safe."""
    message, hint = safe(message), safe(hint) if hint else None
    sys.stderr.write((f"orch: {message}" if "\n" not in message else f"orch:\n{message}") + "\n")
    if hint:
        sys.stderr.write(f"  hint: {hint}\n")
    sys.stderr.flush()


def plan_table(plan: Plan, env_values: bool = False) -> None:
    """The dry-run table: node, address, node rank, global ranks, the exact remote command, the
    inventory's env values hidden (`***`) unless `env_values` (`--show-env`)."""
    from rich.table import Table

    from ..config.plan import HIDDEN

    out = console(stderr=False)
    hidden = not env_values and any(v == HIDDEN for p in plan.nodes for v in p.shown_env().values())
    table = Table(title=f"plan for {markup(plan.inventory.path)}: {len(plan.nodes)} nodes, world size "
                        f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}",
                  caption="env values hidden (***): --show-env prints them" if hidden else None,
                  show_lines=True)
    for col in ("node", "address", "node rank", "global ranks", "command"):
        table.add_column(col, overflow="fold")
    for p in plan.nodes:
        env = " ".join(f"{k}={v if v == HIDDEN and not env_values else shlex.quote(v)}"
                       for k, v in p.shown_env(env_values).items() if not k.startswith("ORCH_"))
        cmd = (f"cd {p.workdir} && " if p.workdir else "") + (env + " " if env else "") + shlex.join(p.argv)
        ranks = f"{p.global_ranks.start}-{p.global_ranks.stop - 1}" if len(p.global_ranks) > 1 else str(p.global_ranks.start)
        # inventory values (env, args, paths) are shown as written, but never as markup or controls
        table.add_row(p.node.name, f"{p.node.host}" + (f" ({p.node.addr})" if p.node.addr != p.node.host else ""),
                      str(p.node_rank), ranks, markup(cmd))
    out.print(table)
    for warning in plan.warnings:
        out.print(f"[yellow]{markup(warning)}[/]", soft_wrap=True)


def overrides_note(overrides: Any) -> None:
    """Under the dry-run table: what the command line changed of the inventory for this run."""
    if overrides.empty:
        return
    out = console()
    picked = [f"{k} {v}" for k, v in (("--include", overrides.include), ("--exclude", overrides.exclude),
                                      ("--nodes", overrides.first), ("--master", overrides.master)) if v is not None]
    if picked:
        out.print("nodes from the command line: " + markup(" ".join(picked)))
    if overrides.env:
        out.print("env from the command line: " + markup(", ".join(overrides.env)))
    if overrides.args:
        out.print("job args from the command line (each replaces the inventory's same setting): "
                  + markup(shlex.join(overrides.args)))


def check_table(report: CheckReport, out: Console | None = None) -> None:
    """One table grouped by check, a row per node: status, value, detail, hint; then the verdict.
    A node that could not be probed has its `ssh` row (with why) and, instead of a `skip` row in
    every other check, one line under the table. Values, details and hints quote what nodes said:
    all shown `markup` (safe, no markup)."""
    from rich.table import Table

    from ..config.nodeset import fold

    out = out or console(stderr=False)
    table = Table(show_lines=False, pad_edge=False, expand=False)
    for col, kw in (("check", {"no_wrap": True}), ("node", {"no_wrap": True}), ("status", {"no_wrap": True}),
                    ("value", {"overflow": "fold", "max_width": 28}), ("detail", {"overflow": "fold"}),
                    ("hint", {"overflow": "fold"})):
        table.add_column(col, **kw)
    down = report.not_probed
    shown = [r for r in report.results if not (r.node in down and r.check != "ssh" and r.status == "skip")]
    last = None
    for r in shown:
        if last is not None and r.check != last:
            table.add_section()
        table.add_row(r.check if r.check != last else "", markup(r.node), styled(r.status), markup(r.value),
                      markup(r.detail), markup(r.hint))
        last = r.check
    out.print(table)
    hidden = [r for r in report.results if r not in shown]
    if hidden:
        checks = list(dict.fromkeys(r.check for r in hidden))
        nodes = list(dict.fromkeys(r.node for r in hidden))
        out.print(markup(f"not probed, so {len(hidden)} other results skipped: {len(checks)} checks "
                         f"({', '.join(checks)}) on {fold(nodes)} (why: their ssh rows)"))
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
    from ..config.nodeset import fold

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
    from ..preflight.busbw import sweep_table

    shown = out or console(stderr=False)

    def say(text: str) -> None:  # every name and reason in it is the node's: shown safe
        shown.print(safe(text), markup=False, highlight=False, soft_wrap=True)

    if not fabric.get("sweep"):
        say(f"fabric: no measurement ({fabric.get('backend')}, run {fabric.get('run')})")
        return
    say(f"\nfabric: {fabric['backend']} on {fabric['device']}, {fabric['world_size']} ranks on "
        f"{fabric['nnodes']} nodes (job {fabric.get('job_s', 0):.1f} s, with launch and teardown "
        f"{fabric.get('wall_s', 0):.1f} s)")
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
            say(f"{p['node']:<{width}}  {_rate(p['send_gbps'], 9)}  {_rate(p['recv_gbps'], 9)}   "
                f"({_rate(p['send_median_gbps'])} / {_rate(p['recv_median_gbps'])}){note}")
    for link in fabric.get("slow_links") or []:
        say(f"slow link {link['src']}->{link['dst']}: {link['gbps']:.3f} GB/s, its ends reach "
            f"{link['expected_gbps']:.3f} GB/s")


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


def strict(data: Any) -> Any:
    """`data` with every float that is not finite made null: JSON has no NaN or Infinity."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict(v) for v in data]
    return data


def json_out(data: Any) -> None:
    """`--json`: the document alone on stdout, strict JSON (RFC 8259: no NaN, no Infinity)."""
    sys.stdout.write(json.dumps(strict(data), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- orch logs


class LogPrinter:
    """Log lines on stdout: `TIME NODE RANK TEXT` in aligned columns (coloured on a terminal), or
    one JSON object a line with --json."""

    def __init__(self, widths: tuple[int, int], as_json: bool = False, raw: bool = False) -> None:
        from ..logs.lines import format_line, to_json

        self.widths = widths
        self.as_json = as_json
        self.raw = raw
        """Each text as the job wrote it (`orch logs --raw`): never coloured, nothing escaped."""
        self.color = color_enabled(sys.stdout) and not as_json and not raw
        self._format, self._json = format_line, to_json

    @property
    def plain(self) -> bool:
        """Plain text: what merged.log holds, so its bytes can be written as they are."""
        return not (self.as_json or self.color)

    def line(self, line: LogLine) -> str:
        if self.as_json:
            return self._json(line)
        return self._format(line, self.color, node_width=self.widths[0], rank_width=self.widths[1], raw=self.raw)

    def lines(self, lines: Iterable[LogLine], flush_each: bool = False) -> None:
        out = sys.stdout
        for line in lines:
            out.write(self.line(line) + "\n")
            if flush_each:
                out.flush()
        out.flush()

    def chunks(self, chunks: Iterable[bytes]) -> None:
        """Plain text already merged into chunks of UTF-8 bytes, written as they are."""
        from ..logs.stored import binary, write_chunk

        out = sys.stdout
        raw = binary(out)
        for chunk in chunks:
            write_chunk(chunk, out, raw)
        (raw or out).flush()


def skew_note(offsets: Mapping[str, float], origin: str | None, reference: str | None = None,
              controller_ms: float | None = None, every: bool = False) -> None:
    """How `orch logs` orders lines: each node's offset (`every`, or up to 4 nodes), else the two
    farthest apart; and what they were measured against."""
    ranked = sorted(offsets.items(), key=lambda kv: (kv[1], kv[0]))
    if every or len(ranked) <= 4:
        shown = ", ".join(f"{n} {v:+.1f} ms" for n, v in sorted(offsets.items()))
    else:
        shown = (f"from {ranked[0][0]} {ranked[0][1]:+.1f} ms to {ranked[-1][0]} {ranked[-1][1]:+.1f} ms "
                 f"over {len(ranked)} nodes (-v: each)")
    against = ""
    if reference and controller_ms is not None:
        against = f" against {reference}, which this controller was {controller_ms:+.1f} ms off"
    elif reference:
        against = f" against {reference}" + (
            "; they are relative to this controller's own clock" if reference.startswith("the controller") else "")
    console().print(f"orch: ordering lines by node time minus the clock offsets measured by orch check "
                    f"({origin}){against}: {shown}; printed times are each node's own clock. "
                    "--no-skew-correct to turn off", markup=False)


def fetch_failed(node: str, exc: Exception) -> None:
    console().print(f"orch: {node}: cannot fetch its log ({safe(exc)}); showing the copy fetched earlier",
                    markup=False, style="yellow")


def log_event(node: str, msg: str) -> None:
    """What the follower says about a node's stream (reconnects, given up) while following."""
    console().print(f"orch: {node}: {safe(msg)}", markup=False, style="yellow")


def logs_drained(run_id: str, state: str) -> None:
    console().print(f"orch: every node's log is drained (run {run_id}: {state})", markup=False)


def silence_stdout() -> None:
    """The reader of stdout went away (`orch logs | head`): drop what is left quietly."""
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit


# ----------------------------------------------------------------------------- orch up


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
            self.real.write("\r\033[K" + self.text[:max(10, width - 1)])
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
        from ..logs.trainer import Progress

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
        from ..logs.lines import column_widths

        self.log = LogPrinter(column_widths([p.node.name for p in plan.nodes], plan.world_size))
        self.run_id = plan.run_id
        self.err.print(f"run [bold]{plan.run_id}[/]: starting {len(plan.nodes)} nodes × "
                       f"{plan.nodes[0].node.nproc_per_node} processes (world size {plan.world_size}, "
                       f"master {plan.master_addr}:{plan.master_port})")
        for warning in plan.warnings:
            self.err.print(f"[yellow]{markup(warning)}[/]", soft_wrap=True)

    def start_failed(self, failures: Mapping[str, Exception]) -> None:
        from ..errors import OrchError

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
        self.err.print(f"[bold yellow]no rank wrote a line for {silent_s:.0f} s[/] (stall timeout {timeout_s:g} s): "
                       "taking every rank's stack")

    def straggler(self, found: Straggler, stop: bool) -> None:
        self.err.print(f"[bold yellow]{markup(found.line())}[/]")
        if stop:
            self.err.print("job.straggler.action is stop: the run is stopped, naming "
                           f"{markup(found.node)} (a retry replaces it with a spare)")

    def stacks(self, report: StacksReport | None, problem: str | None, stop: bool) -> None:

        if report is not None:
            stacks_view(report, self.err)
        if problem:
            self.err.print(f"[yellow]no stacks: {markup(problem)}[/]")
        if not stop:
            self.err.print("job.on_stall is warn: the run goes on; a new silence of the stall timeout is reported again")

    def retrying(self, attempt: int, attempts: int, why: str, excerpt: Sequence[str] = ()) -> None:

        for line in excerpt:
            self.err.print(f"  {markup(line)}", soft_wrap=True)
        self.err.print(f"\n[bold yellow]attempt {attempt}/{attempts}[/] after {markup(why)}; "
                       "every node was stopped, checking the nodes again")

    def replacing(self, node: str, spare: str, why: str) -> None:

        # `why` says which: a straggler stopped, job.sync failed, else a check of the preflight
        what, detail = ("was stopped as a straggler", why.removeprefix("straggler: ")) if why.startswith("straggler: ") \
            else ("could not receive job.sync", why.removeprefix("sync: ")) if why.startswith("sync: ") \
            else ("failed the preflight", why)
        self.err.print(f"[yellow]{markup(node)} {what}[/] ({markup(detail)}): "
                       f"spare [bold]{markup(spare)}[/] takes its place, ranks re-planned")

    def resuming(self, how: str) -> None:

        self.err.print(f"the trainer is relaunched with {markup(how)}: it continues its own last.pt if it wrote one, "
                       "else starts over in the same run directory")


def node_stopped_text(stop: NodeStopped, run_id: str) -> str:
    """`n0: stopped 0.4 s after its agent got SIGTERM (torchrun exited with code 1); the 31 lines it
    printed meanwhile are in its log: orch logs RUN --node n0`, as markup."""
    node = markup(stop.node)
    ended = (f"torchrun ended by {markup(stop.exit_signal)}" if stop.exit_signal
             else f"torchrun exited with code {stop.exit_code}")
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


def stacks_view(report: StacksReport, out: Console | None = None) -> None:
    """`orch stacks`: one line per group of ranks on the same frames (ranks folded, dshbak-style),
    the odd group marked, then every node or rank whose stack could not be taken and why."""

    from ..run.stacks import odd_ranks

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


def up_outcome(outcome: UpOutcome) -> None:
    """How `orch up` ended: success, the first failure with its excerpt, or what was left."""
    out = console()
    run = outcome.run_id
    unconfirmed = markup(", ".join(outcome.not_stopped))
    attempt = f" (attempt {outcome.attempt} of {outcome.attempts})" if outcome.attempts > 1 else ""
    if outcome.result == "retry_preflight_failed":
        nodes = "; ".join(f"{n}: {why}" for n, why in outcome.retry_failed.items())
        step = "the sync" if any(why.startswith("sync: ") for why in outcome.retry_failed.values()) else "the preflight"
        out.print(f"\n[bold red]run {run} failed[/]: attempt {outcome.attempt} of {outcome.attempts} was not "
                  f"launched: {step} failed on {markup(nodes)} ({markup(outcome.no_retry or '')})")
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
        out.print("[bold red]job.sync could not be copied to every node: nothing was launched[/] (fix it, "
                  "or pass --skip-sync to launch with what the nodes have)")
    elif outcome.result == "preflight_failed":
        # a node that cannot be reached is left out with --exclude: --skip-checks cannot launch there
        from ..config.nodeset import fold

        failed = outcome.preflight.failed() if outcome.preflight is not None else []
        down = sorted({r.node for r in failed if r.check == "ssh"})
        rest = [r for r in failed if r.node not in down]
        if down:
            names = markup(fold(down))
            out.print(f"[bold red]preflight failed: nothing was launched[/]; {names} cannot be reached: leave "
                      f"{'them' if len(down) > 1 else 'it'} out with --exclude {names}"
                      + (" (and fix the other failures above, or pass --skip-checks to launch anyway)" if rest else ""))
        else:
            out.print("[bold red]preflight failed: nothing was launched[/] (fix the failures above, "
                      "or pass --skip-checks to launch anyway)")
    elif outcome.result == "start_failed":
        out.print(f"stopped every node that had started ({outcome.teardown_s or 0:.1f} s); nothing was left running"
                  if not unconfirmed else f"[bold red]could not confirm the stop on: {unconfirmed}[/] "
                  f"(run: orch down {run})")
        for node, why in outcome.never_started.items():
            out.print(f"{markup(node)} never started ({markup(why)}): launch without it with --exclude {markup(node)}",
                      soft_wrap=True)
    elif outcome.result == "detached":
        out.print(f"detached. Follow: orch logs --follow {run} · state: orch status {run} · stop: orch down {run}")
    elif outcome.result == "interrupted":
        out.print(f"interrupted: stopped every node in {outcome.teardown_s or 0:.1f} s" if not unconfirmed
                  else f"[bold red]interrupted; could not confirm the stop on {unconfirmed}[/]")
    elif outcome.result == "stopped":
        out.print(f"run {run} stopped by orch down{attempt}: every node stopped, nothing relaunched" if not unconfirmed
                  else f"[bold red]run {run} stopped by orch down; could not confirm the stop on {unconfirmed}[/]")
    elif outcome.result == "succeeded":
        out.print(f"[green]run {run} succeeded on every node[/] in {outcome.wall_s or 0:.1f} s{attempt}")
        for node, why in outcome.not_stopped.items():
            out.print(f"[bold yellow]{markup(node)}: {markup(why)}[/] (run: orch down {run})")
    else:
        # the excerpt first, the cause last: the last lines on the screen say why
        f = outcome.failure
        assert f is not None
        if f.excerpt:
            out.print(f"\n[bold red]run {run} failed{attempt}[/]; the last lines of {markup(f.node)} "
                      f"(all of them: orch logs {run} --node {markup(f.node)}):", soft_wrap=True)
        for line in f.excerpt:
            out.print(f"  {markup(line)}", soft_wrap=True)
        out.print(f"stopped every other node in {outcome.teardown_s or 0:.1f} s" if not unconfirmed else
                  f"[bold red]could not confirm the stop on {unconfirmed}[/]: run `orch down {run}` once they "
                  "are reachable")
        if outcome.no_retry:
            out.print(f"[bold red]{markup(outcome.no_retry)}[/]")
        out.print(f"[bold red]run {run} failed{attempt}[/]: first failure on " + failure_head(f.to_json()),
                  soft_wrap=True)
        if f.hint:
            out.print(f"  hint: {markup(f.hint)}", soft_wrap=True)


def failure_head(ff: Mapping[str, Any]) -> str:
    """`NODE (node rank N, rank R, exit code C): CAUSE` of a first failure (its JSON), as rich markup.
    A process a signal ended shows the signal as its cause, never torchrun's exit code."""
    rank = f"rank {ff['rank']}" if ff.get("rank") is not None else "rank unknown"
    code = f", exit code {ff.get('exit_code')}" if not ff.get("signal") else ""
    node_rank = f"node rank {ff['node_rank']}, " if ff.get("node_rank") is not None else ""
    why = ff.get("cause") or ff.get("reason") or ""
    return f"[bold]{markup(ff.get('node'))}[/] ({node_rank}{rank}{code}): {markup(why)}"


def not_retried_detached(retries: int) -> None:
    """The inventory asks for retries, but a detached run has nobody to relaunch it (or to watch for a hang)."""
    console().print(f"[yellow]note:[/] job.retries ({retries}) and the hang watchdog apply to an attached orch up "
                    "only: this detached run is not relaunched when it fails, nor stopped when it hangs")


# ----------------------------------------------------------------------------- orch status, down, report


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
        table.add_row(n.node, str(n.node_rank), styled(str(n.state)), "" if n.exit_code is None else str(n.exit_code),
                      str(n.pid or ""), up, last if not n.error else markup(safe(n.error)[:80]))
    out.print(table)
    for n in report.nodes:
        if n.disk_full:
            out.print(f"[yellow]node {markup(n.node)}: {markup(safe(n.disk_full))}[/]", soft_wrap=True)
    for found in report.stragglers:
        out.print(f"[bold yellow]{markup(found.get('line', ''))}[/]")
    ff = report.first_failure
    if ff:
        out.print("first failure: " + failure_head(ff), soft_wrap=True)
        if ff.get("hint"):
            out.print(f"  hint: {markup(ff['hint'])}", soft_wrap=True)
        out.print(f"  its log: orch logs {markup(report.run)} --node {markup(ff.get('node'))}", soft_wrap=True)


def _num(value: Any, fmt: str = "{:.0f}", unit: str = "") -> str:
    return "" if value is None else fmt.format(value) + unit


def _age(seconds: Any) -> str:
    return "" if seconds is None else f"{seconds:.0f} s"


def _flags(flags: Sequence[str], why: str | None = None) -> str:
    """The flags as markup; `why`: the words of the straggler's kind (`straggler (waiting on others)`)."""
    return " ".join((f"[bold red]{f} ({markup(why)})[/]" if f == "straggler" and why else f"[bold red]{f}[/]")
                    if f in ("straggler", "gpu-error", "error") else f"[yellow]{f}[/]" for f in flags)


def _straggler_words(report: TopReport) -> tuple[dict[str, str], dict[int, str]]:
    """What each node's and each rank's latest straggler was named for (`straggler.KINDS`)."""
    from ..run.straggler import KINDS

    by_node: dict[str, str] = {}
    by_rank: dict[int, str] = {}
    for s in report.stragglers:
        by_node[s.node] = by_rank[s.rank] = KINDS.get(s.kind, s.kind)
    return by_node, by_rank


def top_renderable(report: TopReport, gpus: bool) -> Any:
    """`orch top`'s screen: a row per node (or per GPU with `gpus`), then the stragglers named."""
    import time

    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    when = time.strftime("%H:%M:%S", time.gmtime(report.taken_at))
    table = Table(title=f"run {report.run}: {styled(report.state)} · {when} UTC · telemetry every "
                        f"{report.telemetry_s:g} s", title_justify="left")
    cols: tuple[str, ...]
    if gpus:
        cols = ("node", "gpu", "rank", "util", "mem", "power", "temp", "SM", "CPU", "img/s", "data", "flags")
    else:
        cols = ("node", "state", "gpus", "util", "mem", "power", "temp", "CPU", "load", "rank CPU", "img/s", "data",
                "last line", "flags")
    for col in cols:
        table.add_column(col, justify="right" if col not in ("node", "state", "flags", "gpus") else "left")
    node_why, rank_why = _straggler_words(report)
    for n in report.nodes:
        node = markup(n["node"])
        cpu = _num(n["cpu_pct"], unit=" %")
        ranks = {r["rank"]: r for r in n["ranks"]}
        if gpus:
            if not n["gpus"]:
                table.add_row(node, "-", "", markup(safe(n["gpu_error"] or "no GPU sample")[:40]), "", "", "", "",
                              cpu, _num(n["images_per_s"], "{:.1f}"), _num(n["data_share"], "{:.0%}"),
                              _flags(n["flags"], node_why.get(n["node"])))
            for g in n["gpus"]:
                r = ranks.get(g["rank"]) if g["rank"] is not None else None
                table.add_row(node, _num(g["index"], "{}"), "" if g["rank"] is None else str(g["rank"]),
                              _num(g["util_pct"], unit=" %"),
                              f"{_num(g['mem_used_mb'], '{:.0f}')}/{_num(g['mem_total_mb'], '{:.0f}')} MiB",
                              _num(g["power_w"], unit=" W"), _num(g["temp_c"], unit=" °C"), _num(g["sm_mhz"], unit=" MHz"),
                              _num(r["cpu_pct"], unit=" %") if r else "", _num(r["images_per_s"], "{:.1f}") if r else "",
                              _num(r["data_share"], "{:.0%}") if r and r["data_share"] is not None else "",
                              _flags(g["flags"] + (r["flags"] if r else []), rank_why.get(g["rank"])))
            continue
        gs = n["gpus"]
        utils = [g["util_pct"] for g in gs if g["util_pct"] is not None]
        used = [g["mem_used_mb"] for g in gs if g["mem_used_mb"] is not None]
        total = [g["mem_total_mb"] for g in gs if g["mem_total_mb"] is not None]
        power = [g["power_w"] for g in gs if g["power_w"] is not None]
        temps = [g["temp_c"] for g in gs if g["temp_c"] is not None]
        what = f"{len(gs)}× {gs[0]['name'] or 'GPU'}" if gs else safe(n["gpu_error"] or "no sample yet")[:32]
        rank_cpu = [r["cpu_pct"] for r in n["ranks"] if r["cpu_pct"] is not None]
        table.add_row(node, styled(n["state"]), markup(what),
                      f"{min(utils):.0f}-{max(utils):.0f} %" if utils and min(utils) != max(utils)
                      else _num(utils[0] if utils else None, unit=" %"),
                      f"{sum(used) / 1024:.0f}/{sum(total) / 1024:.0f} GiB" if used and total else "",
                      f"{sum(power):.0f} W" if power else "", f"{max(temps):.0f} °C" if temps else "",
                      cpu, _num(n["load1"], "{:.1f}"),
                      (f"{min(rank_cpu):.0f}-{max(rank_cpu):.0f} %" if min(rank_cpu) != max(rank_cpu)
                       else f"{rank_cpu[0]:.0f} %") if rank_cpu else "",
                      _num(n["images_per_s"], "{:.1f}"),
                      _num(n["data_share"], "{:.0%}"), _age(n["last_line_age_s"]), _flags(n["flags"], node_why.get(n["node"])))
    parts: list[Any] = [table]
    for s in report.stragglers:
        parts.append(Text(s.line(), style="bold red"))
    if report.ignored_lines:
        parts.append(Text(f"{_lines(report.ignored_lines)} of the node logs ignored: not a finite telemetry or "
                          "timing record", style="yellow"))
    for n in report.nodes:
        if n["fetch_error"]:
            parts.append(Text(f"{n['node']}: log not fetched ({safe(n['fetch_error'])[:100]}); showing the last copy",
                              style="yellow"))
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


def runs_table(report: RunsReport) -> None:
    """`orch runs`: one row per run, newest first; then how many older ones were left out."""
    import time

    from rich.table import Table

    out = console(stderr=False)
    if not report.runs:
        console().print(f"no runs yet in {markup(report.home)}/runs (start one with: orch up INVENTORY)")
        return
    table = Table(title=f"runs in {markup(report.home)}", title_justify="left")
    for col in ("run", "inventory", "state", "attempt", "started", "wall time", "nodes×procs", "first failure"):
        table.add_column(col)
    for r in report.runs:
        started = "" if r.started is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
        wall = ("running for " if r.running else "") + duration(r.wall_s)
        table.add_row(markup(r.run), markup(r.inventory or ""), styled(r.state), f"{r.attempt}/{r.max_attempts}",
                      started, wall, r.shape, markup(r.failure or ""))
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
    from ..contract import FINAL_STATES

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
        else:
            n = len(res.stopped)
            out.print(f"{markup(name)}: " + (f"stopped {n} processes (none is left)" if n else "nothing running"))
        if res is not None and res.status is not None and res.status.disk_full:
            out.print(f"[yellow]{markup(name)}: {markup(safe(res.status.disk_full))}[/]")
        if res is not None and res.strangers:
            out.print(f"[yellow]{markup(name)}: left alone {len(res.strangers)} processes that hold ids the run "
                      f"recorded but are not the job's (pid reuse): {list(res.strangers)}[/]")
    if not result.complete:
        out.print(f"run {result.run}: some nodes could not be stopped; run `orch down {result.run}` again "
                  "when they are reachable")
    else:
        out.print(f"run {result.run}: nothing left running on {len(done)} nodes ({result.elapsed_s:.1f} s)")


def report_outcome(outcome: ReportOutcome) -> None:
    out = console()
    if outcome.fetch_error:
        out.print(f"[yellow]results.csv not fetched[/]: {markup(outcome.fetch_error)}")
    if outcome.weights:
        out.print(f"weights: {markup(outcome.weights)} (on {outcome.master})")
    if outcome.results_csv:
        copy = f", copy in {outcome.local_csv.resolve()}" if outcome.local_csv else ""
        out.print(f"results: {markup(outcome.results_csv)} (on {outcome.master})" + markup(copy))
    out.print(f"report:  {outcome.page.resolve()}")
    click_stdout(str(outcome.page.resolve()))


def click_stdout(text: str) -> None:
    """One line on stdout, alone: what a script captures (`xdg-open "$(orch report)"`)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()

def printable(text: str) -> str:
    """Text from a node, safe for a terminal: the one `logs.lines.printable` every output uses."""
    return safe(text)


def exec_output(report: ExecReport, color: bool) -> None:
    """`orch exec`'s output on stdout, grouped like `dshbak -c`: one block per distinct answer
    under the folded set of the nodes that gave it, its exit code when not 0; then, on stderr,
    which nodes failed."""
    from ..config.nodeset import fold
    from ..remote.exec import KEPT_BYTES

    bold, red, reset = ("\033[1m", "\033[1;31m", "\033[0m") if color else ("", "", "")
    rule = "-" * 16
    out = []
    for group in report.groups():
        answer = group.answer
        status = ""
        if answer.error:
            status = f": {answer.error} (exit {answer.exit_code})"
        elif answer.exit_code:
            status = f": exit {answer.exit_code}"
        head = f"{fold(group.nodes)} ({len(group.nodes)})"
        out.append(f"{rule}\n{bold}{head}{reset}{red}{printable(status)}{reset}\n{rule}\n")
        for name, text, dropped in (("stdout", answer.stdout, answer.dropped[0]),
                                    ("stderr", answer.stderr, answer.dropped[1])):
            if text:
                out.append(printable(text) + ("" if text.endswith("\n") else "\n"))
            if dropped:
                out.append(f"[orch: {dropped} more bytes of {name} not kept: -b keeps the first "
                           f"{KEPT_BYTES >> 20} MiB of each node's stdout and stderr]\n")
        if answer.hint:
            out.append(f"hint: {printable(answer.hint)}\n")
    sys.stdout.write("".join(out))
    sys.stdout.flush()
    exec_failures(report)


class ExecLines:
    """`orch exec`'s live output, as pdsh and clush print it: `node: line` the moment a node's
    line is complete, stdout lines on stdout and stderr lines on stderr; lines of one node in
    order, nodes interleaved as they answer. Text from the nodes is made safe for a terminal."""

    def __init__(self, color: bool) -> None:
        import threading

        self.lock = threading.Lock()
        self.bold, self.reset = ("\033[1m", "\033[0m") if color else ("", "")

    def __call__(self, node: str, stream: str, line: str) -> None:
        text = f"{self.bold}{printable(node)}:{self.reset} {printable(line)}\n"
        with self.lock:
            out = sys.stdout if stream == "out" else sys.stderr
            try:
                out.write(text)
                out.flush()
            except BrokenPipeError:
                silence_stdout()

    def ended(self, report: ExecReport) -> None:
        """After every node answered: each node whose command has no exit code of its own
        (unreachable, timed out, killed) with why, on stderr; then which nodes failed."""
        for n in report.nodes:
            if n.error:
                sys.stderr.write(f"{printable(n.node)}: {printable(n.error)} (exit {n.exit_code})\n")
                if n.hint:
                    sys.stderr.write(f"{printable(n.node)}: hint: {printable(n.hint)}\n")
        exec_failures(report)


def exec_failures(report: ExecReport) -> None:
    """On stderr: how many nodes failed, by exit code (nothing when none did)."""
    from ..config.nodeset import fold

    failed = report.failed()
    if failed:
        by_code: dict[int, list[str]] = {}
        for n in failed:
            by_code.setdefault(n.exit_code, []).append(n.node)
        detail = "; ".join(f"exit {code}: {fold(names)}" for code, names in sorted(by_code.items(), reverse=True))
        sys.stderr.write(f"orch exec: {len(failed)} of {len(report.nodes)} nodes failed ({detail})\n")


@contextlib.contextmanager
def exec_progress(nodes: int) -> Iterator[Progress | None]:
    """`done/total` on stderr while nodes answer, erased at the end; None where stderr is no terminal."""
    if not may_be_terminal(sys.stderr) or not sys.stderr.isatty():
        yield None
        return

    def progress(label: str, done: int, total: int) -> None:  # the label is the command's own word
        sys.stderr.write(f"\r{done}/{total} nodes done")
        sys.stderr.flush()

    try:
        yield progress
    finally:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


def human_bytes(n: int) -> str:
    """1234567 → `1.2 MB` (powers of 1000, as rsync -h and df -H)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def describe_transfer(t: Transfer, dry: bool) -> str:
    """`copied 12 file(s), 3.4 MB, deleted 2` / `up to date` (`would copy ...` with --dry-run)."""
    if t.up_to_date:
        return "up to date"
    parts = []
    if t.files:
        parts.append(f"{'would copy' if dry else 'copied'} {t.files} file(s), {human_bytes(t.bytes)}")
    if t.deleted:
        parts.append(f"{'would delete' if dry else 'deleted'} {t.deleted}")
    others = len(t.changes) - t.deleted - t.files
    if others > 0:
        parts.append(f"{'would make' if dry else 'made'} {others} other change(s) (directories, links, modes)")
    return ", ".join(parts)


def image_report(report: ImageReport, stream: Any = None) -> None:
    """`orch image push`'s outcome: a line for the image, then one line per node (present,
    loaded or copied with its time, or FAILED with the reason and the fix)."""
    from ..remote.image import short_id

    stream = stream or sys.stdout
    size = f", {human_bytes(report.size)}" if report.size else ""
    lines = [f"push {printable(report.image)} ({report.runtime}, {short_id(report.image_id)}{size}) → "
             f"{len(report.nodes)} node(s) in {report.elapsed_s:.1f} s"]
    width = max((len(n.node) for n in report.nodes), default=0)
    for n in report.nodes:
        head = f"  {printable(n.node):<{width}}  "
        if not n.ok:
            lines.append(head + f"FAILED: {printable(n.error or '')} (exit {n.exit_code})")
            if n.hint:
                lines.append(f"  {'':<{width}}  hint: {printable(n.hint)}")
        elif n.action == "present":
            lines.append(head + f"present {short_id(n.image_id)}, skipped")
        else:
            was = f" (was {short_id(n.before)})" if n.before else ""
            lines.append(head + f"{n.action} {short_id(n.image_id)} in {n.elapsed_s:.1f} s, verified{was}")
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    failed_tail("orch image push", [n.node for n in report.failed()], len(report.nodes))


def failed_tail(command: str, failed: list[str], total: int) -> None:
    """The last line of a fan-out command with failed nodes: how many of all, their names folded."""
    from ..config.nodeset import fold

    if failed:
        sys.stderr.write(f"{command}: failed on {len(failed)} of {total} nodes: {fold(failed)}\n")


def sync_report(report: SyncReport, stream: Any = None) -> None:
    """`orch sync`'s outcome, nodes with the same outcome on one line under their folded names;
    with --dry-run, the changes rsync would make. Failures name the reason and the fix."""
    from ..config.nodeset import fold

    stream = stream or sys.stdout
    dry = report.options.dry_run
    lines = [f"{'would sync' if dry else 'sync'} {', '.join(report.paths)} → {len(report.nodes)} node(s)"]
    if report.skipped:
        lines.append(f"nothing copied: {report.skipped}")
    else:
        groups: dict[tuple[Any, ...], list[str]] = {}
        for n in report.nodes:
            what = (describe_transfer(n.transfer, dry), n.transfer.changes if dry else ()) if n.transfer else None
            groups.setdefault((n.error, n.hint, what), []).append(n.node)
        for (error, hint, what), names in groups.items():
            head = f"  {fold(names)} ({len(names)}): "
            if error:
                lines.append(head + "FAILED: " + printable(error))
                if hint:
                    lines.append(f"    hint: {printable(hint)}")
                continue
            lines.append(head + what[0])
            lines.extend(f"    {printable(c)}" for c in what[1])
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    failed_tail("orch sync", [n.node for n in report.failed()], len(report.nodes))
