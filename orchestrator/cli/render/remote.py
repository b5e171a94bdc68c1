"""`orch exec`, `orch sync`, `orch image push`: grouped answers, progress, transfers, failures."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..ui import may_be_terminal
from .common import printable, silence_stdout

if TYPE_CHECKING:
    from ...remote.chain import ChainSummary, Leg, View, Watch
    from ...remote.exec import ExecReport
    from ...remote.image import ImageReport
    from ...remote.sync import SyncReport
    from ...transport import Transfer
    from ...transport.base import Progress


def exec_output(report: ExecReport, color: bool) -> None:
    """`orch exec`'s output on stdout, grouped like `dshbak -c`: one block per distinct answer
    under the folded set of the nodes that gave it, its exit code when not 0; then, on stderr,
    which nodes failed."""
    from ...config.nodeset import fold
    from ...remote.exec import KEPT_BYTES

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
        for name, text, dropped in (
            ("stdout", answer.stdout, answer.dropped[0]),
            ("stderr", answer.stderr, answer.dropped[1]),
        ):
            if text:
                out.append(printable(text) + ("" if text.endswith("\n") else "\n"))
            if dropped:
                out.append(
                    f"[orch: {dropped} more bytes of {name} not kept: -b keeps the first "
                    f"{KEPT_BYTES >> 20} MiB of each node's stdout and stderr]\n"
                )
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
    from ...config.nodeset import fold

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


@contextlib.contextmanager
def chain_progress() -> Iterator[Watch | None]:
    """The copy chain's progress on stderr, a line per node (its role, bytes verified, rate, state),
    redrawn in place and erased at the end; None where stderr is no terminal."""
    if not may_be_terminal(sys.stderr) or not sys.stderr.isatty():
        yield None
        return
    drawn = [0]

    def watch(views: Sequence[View]) -> None:
        width = max((len(v.node) for v in views), default=0)
        lines = []
        for v in views:
            if v.role is None and v.total == 0:
                continue
            rate = f"{human_bytes(int(v.bytes_per_s))}/s" if v.bytes_per_s else ""
            lines.append(
                f"{printable(v.node):<{width}}  {v.role or '-':<5}  {human_bytes(v.got):>9} of "
                f"{human_bytes(v.total):<9} {rate:>11}  {v.state}"
            )
        up = f"\033[{drawn[0]}F" if drawn[0] else ""
        sys.stderr.write(up + "".join(f"\033[K{line}\n" for line in lines))
        sys.stderr.flush()
        drawn[0] = len(lines)

    try:
        yield watch
    finally:
        if drawn[0]:
            sys.stderr.write(f"\033[{drawn[0]}F\033[J")
            sys.stderr.flush()


def chain_lines(summary: ChainSummary, legs: list[tuple[str, Leg | None]]) -> list[str]:
    """The chain's part of a report: its order, each node's role and rate, what happened to it,
    and the hop that set its pace."""
    order = " | ".join(" → ".join(printable(n) for n in chain) for chain in summary.last) or "(no node needed it)"
    lines = [f"  chain: this machine → {order} ({human_bytes(summary.bytes)} sent once from here)"]
    width = max((len(n) for n, _ in legs), default=0)
    for name, leg in legs:
        if leg is None or leg.role is None:
            continue
        speed = f" at {human_bytes(int(leg.bytes_per_s))}/s" if leg.bytes_per_s else ""
        lines.append(
            f"    {printable(name):<{width}}  {leg.role:<5}  {human_bytes(leg.received)} in {leg.seconds:.1f} s{speed}"
        )
    lines.extend(f"    {printable(note)}" for note in summary.notes)
    if summary.limited_by:
        src, dst, rate = summary.limited_by
        lines.append(
            f"  limited by the hop {printable(src or 'this machine')} → {printable(dst)}: {human_bytes(int(rate))}/s"
        )
    return lines


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
    from ...remote.image import short_id as raw_id

    def short_id(image_id: str | None) -> str:  # what a node said it holds: its words
        return printable(raw_id(image_id))

    stream = stream or sys.stdout
    size = f", {human_bytes(report.size)}" if report.size else ""
    lines = [
        f"push {printable(report.image)} ({report.runtime}, {short_id(report.image_id)}{size}) → "
        f"{len(report.nodes)} node(s) in {report.elapsed_s:.1f} s"
        + (f", {report.method} ({printable(report.why)})" if report.why else "")
    ]
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
    if report.chain is not None:
        lines += chain_lines(report.chain, [(n.node, n.leg) for n in report.nodes])
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    failed_tail("orch image push", [n.node for n in report.failed()], len(report.nodes))


def failed_tail(command: str, failed: list[str], total: int) -> None:
    """The last line of a fan-out command with failed nodes: how many of all, their names folded."""
    from ...config.nodeset import fold

    if failed:
        sys.stderr.write(f"{command}: failed on {len(failed)} of {total} nodes: {fold(failed)}\n")


def sync_report(report: SyncReport, stream: Any = None) -> None:
    """`orch sync`'s outcome, nodes with the same outcome on one line under their folded names;
    with --dry-run, the changes rsync would make. Failures name the reason and the fix."""
    from ...config.nodeset import fold

    stream = stream or sys.stdout
    dry = report.options.dry_run
    how = f", {report.method} ({printable(report.why)})" if report.why else ""
    lines = [f"{'would sync' if dry else 'sync'} {', '.join(report.paths)} → {len(report.nodes)} node(s){how}"]
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
    if report.chain is not None:
        lines += chain_lines(report.chain, [(n.node, n.leg) for n in report.nodes])
    stream.write("\n".join(lines) + "\n")
    stream.flush()
    failed_tail("orch sync", [n.node for n in report.failed()], len(report.nodes))
