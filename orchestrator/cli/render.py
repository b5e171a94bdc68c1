"""Everything orch shows people: tables and progress on the terminal, `--json` alone on stdout.

The library never prints: commands return outcome objects (a CheckReport, an up outcome, a status
report...) or yield what to show, and the functions here render them. rich is imported inside
them, so a command that draws nothing (`orch check --json` in a pipe) never loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..contract import CHECK_STATUSES
from .ui import color_enabled, console, may_be_terminal, styled

if TYPE_CHECKING:
    from rich.console import Console

    from ..config.plan import Plan
    from ..logs.lines import LogLine
    from ..preflight.report import CheckReport, Progress


def plan_table(plan: Plan) -> None:
    """The dry-run table: node, address, node rank, global ranks, the exact remote command."""
    from rich.table import Table

    out = console(stderr=False)
    table = Table(title=f"plan for {plan.inventory.path}: {len(plan.nodes)} nodes, world size "
                        f"{plan.world_size}, master {plan.master_addr}:{plan.master_port}",
                  show_lines=True)
    for col in ("node", "address", "node rank", "global ranks", "command"):
        table.add_column(col, overflow="fold")
    for p in plan.nodes:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in p.env.items() if not k.startswith("ORCH_"))
        cmd = (f"cd {p.workdir} && " if p.workdir else "") + (env + " " if env else "") + shlex.join(p.argv)
        ranks = f"{p.global_ranks.start}-{p.global_ranks.stop - 1}" if len(p.global_ranks) > 1 else str(p.global_ranks.start)
        table.add_row(p.node.name, f"{p.node.host}" + (f" ({p.node.addr})" if p.node.addr != p.node.host else ""),
                      str(p.node_rank), ranks, cmd)
    out.print(table)


def check_table(report: CheckReport, out: Console | None = None) -> None:
    """One table grouped by check, a row per node: status, value, detail, hint; then the verdict."""
    from rich.markup import escape
    from rich.table import Table

    out = out or console(stderr=False)
    table = Table(show_lines=False, pad_edge=False, expand=False)
    for col, kw in (("check", {"no_wrap": True}), ("node", {"no_wrap": True}), ("status", {"no_wrap": True}),
                    ("value", {"overflow": "fold", "max_width": 28}), ("detail", {"overflow": "fold"}),
                    ("hint", {"overflow": "fold"})):
        table.add_column(col, **kw)
    last = None
    for r in report.results:
        if last is not None and r.check != last:
            table.add_section()
        table.add_row(r.check if r.check != last else "", r.node, styled(r.status), r.value,
                      escape(r.detail), escape(r.hint))
        last = r.check
    out.print(table)
    counts = {s: sum(1 for r in report.results if r.status == s) for s in CHECK_STATUSES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    verdict = "[bold red]preflight failed[/]" if not report.ok else "[green]preflight passed[/]"
    out.print(f"{verdict}: {summary} ({report.elapsed_s:.1f} s)")


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


def json_out(data: Any) -> None:
    """`--json`: the document alone on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------- orch logs


class LogPrinter:
    """Log lines on stdout: `TIME NODE RANK TEXT` in aligned columns (coloured on a terminal), or
    one JSON object a line with --json."""

    def __init__(self, widths: tuple[int, int], as_json: bool = False) -> None:
        from ..logs.lines import format_line, to_json

        self.widths = widths
        self.as_json = as_json
        self.color = color_enabled(sys.stdout) and not as_json
        self._format, self._json = format_line, to_json

    @property
    def plain(self) -> bool:
        """Plain text: what merged.log holds, so its bytes can be written as they are."""
        return not (self.as_json or self.color)

    def line(self, line: LogLine) -> str:
        if self.as_json:
            return self._json(line)
        return self._format(line, self.color, node_width=self.widths[0], rank_width=self.widths[1])

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


def skew_note(offsets: Mapping[str, float], origin: str | None) -> None:
    shown = ", ".join(f"{n} {v:+.1f} ms" for n, v in sorted(offsets.items()))
    console().print(f"orch: ordering lines by node time minus the clock offsets measured by orch check "
                    f"({origin}): {shown}; printed times are each node's own clock. "
                    "--no-skew-correct to turn off", markup=False)


def fetch_failed(node: str, exc: Exception) -> None:
    console().print(f"orch: {node}: cannot fetch its log ({exc}); showing the copy fetched earlier",
                    markup=False, style="yellow")


def log_event(node: str, msg: str) -> None:
    """What the follower says about a node's stream (reconnects, given up) while following."""
    console().print(f"orch: {node}: {msg}", markup=False, style="yellow")


def logs_drained(run_id: str, state: str) -> None:
    console().print(f"orch: every node's log is drained (run {run_id}: {state})", markup=False)


def silence_stdout() -> None:
    """The reader of stdout went away (`orch logs | head`): drop what is left quietly."""
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
