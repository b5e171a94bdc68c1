"""Everything orch shows people: tables and progress on the terminal, `--json` alone on stdout.

The library never prints: commands return outcome objects (a CheckReport, an up outcome, a status
report...) or yield what to show, and the functions here render them. rich is imported inside
them, so a command that draws nothing (`orch check --json` in a pipe) never loads it.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..contract import CHECK_STATUSES
from .ui import console, may_be_terminal, styled

if TYPE_CHECKING:
    from rich.console import Console

    from ..config.plan import Plan
    from ..preflight.report import CheckReport, Progress
    from ..remote.exec import ExecReport
    from ..remote.rsync import Transfer
    from ..remote.sync import SyncReport


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


# Control characters a node's output must not send to the terminal raw: C0 but TAB and newline
# (ESC starts escape sequences that retitle a window, move the cursor, or worse), DEL, C1, and the
# bidirectional overrides that make text read otherwise than it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text from a node, safe for a terminal: every control character but TAB and newline shown as
    its escape (`\\x1b`, `\\r`, `\\u202e`), so output can neither hide itself nor drive the terminal."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def exec_output(report: ExecReport, color: bool) -> None:
    """`orch exec`'s output on stdout, grouped like `dshbak -c`: one block per distinct answer
    under the folded set of the nodes that gave it, its exit code when not 0; then, on stderr,
    which nodes failed."""
    from ..config.nodeset import fold

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
        for text in (answer.stdout, answer.stderr):
            if text:
                out.append(printable(text) + ("" if text.endswith("\n") else "\n"))
        if answer.hint:
            out.append(f"hint: {printable(answer.hint)}\n")
    sys.stdout.write("".join(out))
    sys.stdout.flush()
    failed = report.failed()
    if failed:
        by_code: dict[int, list[str]] = {}
        for n in failed:
            by_code.setdefault(n.exit_code, []).append(n.node)
        detail = "; ".join(f"exit {code}: {fold(names)}" for code, names in sorted(by_code.items(), reverse=True))
        sys.stderr.write(f"orch exec: {len(failed)} of {len(report.nodes)} nodes failed ({detail})\n")


@contextlib.contextmanager
def exec_progress(nodes: int) -> Iterator[Callable[[int, int], None] | None]:
    """`done/total` on stderr while nodes answer, erased at the end; None where stderr is no terminal."""
    if not may_be_terminal(sys.stderr) or not sys.stderr.isatty():
        yield None
        return

    def progress(done: int, total: int) -> None:
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
        parts.append(f"{'would update' if dry else 'updated'} {others} other item(s) (directories, links, times)")
    return ", ".join(parts)


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
    failed = report.failed()
    if failed:
        sys.stderr.write(f"orch sync: failed on {len(failed)} of {len(report.nodes)} nodes: "
                         f"{fold(n.node for n in failed)}\n")
