"""`orch logs`: the merged log's lines (`LogPrinter`), the clock skew note, the follow's events."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..ui import color_enabled, console
from .common import safe

if TYPE_CHECKING:
    from ...logs.lines import LogLine


class LogPrinter:
    """Log lines on stdout: `TIME NODE RANK TEXT` in aligned columns (coloured on a terminal), or
    one JSON object a line with --json."""

    def __init__(self, widths: tuple[int, int], as_json: bool = False, raw: bool = False) -> None:
        from ...logs.lines import format_line, to_json

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
        from ...logs.stored import binary, write_chunk

        out = sys.stdout
        raw = binary(out)
        for chunk in chunks:
            write_chunk(chunk, out, raw)
        (raw or out).flush()


def skew_note(
    offsets: Mapping[str, float],
    origin: str | None,
    reference: str | None = None,
    controller_ms: float | None = None,
    every: bool = False,
) -> None:
    """How `orch logs` orders lines: each node's offset (`every`, or up to 4 nodes), else the two
    farthest apart; and what they were measured against."""
    ranked = sorted(offsets.items(), key=lambda kv: (kv[1], kv[0]))
    if every or len(ranked) <= 4:
        shown = ", ".join(f"{n} {v:+.1f} ms" for n, v in sorted(offsets.items()))
    else:
        shown = (
            f"from {ranked[0][0]} {ranked[0][1]:+.1f} ms to {ranked[-1][0]} {ranked[-1][1]:+.1f} ms "
            f"over {len(ranked)} nodes (-v: each)"
        )
    against = ""
    if reference and controller_ms is not None:
        against = f" against {reference}, which this controller was {controller_ms:+.1f} ms off"
    elif reference:
        against = f" against {reference}" + (
            "; they are relative to this controller's own clock" if reference.startswith("the controller") else ""
        )
    console().print(
        f"orch: ordering lines by node time minus the clock offsets measured by orch check "
        f"({origin}){against}: {shown}; printed times are each node's own clock. "
        "--no-skew-correct to turn off",
        markup=False,
    )


def fetch_failed(node: str, exc: Exception) -> None:
    console().print(
        f"orch: {node}: cannot fetch its log ({safe(exc)}); showing the copy fetched earlier",
        markup=False,
        style="yellow",
    )


def logs_warning(msg: str) -> None:
    """What the controller's disk refused while the log is shown (a copy, merged.log): on stderr, the lines go on."""
    console().print(f"orch: warning: {safe(msg)}", markup=False, style="yellow")


def log_event(node: str, msg: str) -> None:
    """What the follower says about a node's stream (reconnects, given up) while following."""
    console().print(f"orch: {node}: {safe(msg)}", markup=False, style="yellow")


def logs_drained(run_id: str, state: str) -> None:
    console().print(f"orch: every node's log is drained (run {run_id}: {state})", markup=False)
