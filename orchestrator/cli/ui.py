"""What people see: a stderr console that honours NO_COLOR and only colours a terminal.

Library layers never print; they take a `Progress`-like callback or return values. The CLI owns
one `Console` for humans (stderr) and writes `--json` alone to stdout.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from ..contract import NodeState

if TYPE_CHECKING:
    from rich.console import Console


def color_enabled(stream: object = None) -> bool:
    """Colour only on a terminal, never when NO_COLOR is set (https://no-color.org)."""
    if "NO_COLOR" in os.environ:
        return False
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


def may_be_terminal(stream: object) -> bool:
    """False only where `console()` on that stream would certainly not be a terminal (not a tty,
    and none of the variables by which rich can be told otherwise), so `orch check --json` in a
    pipe never imports rich."""
    if "ipykernel" in sys.modules or any(v in os.environ for v in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return True
    try:
        return bool(getattr(stream, "isatty", lambda: False)())
    except ValueError:  # a closed stream
        return False


def console(stderr: bool = True, stream: Any = None) -> Console:
    """A rich console on stderr (for people) or stdout (tables that are the command's output), or
    on `stream` (stderr through a wrapper: `render.LiveLine`)."""
    from rich.console import Console

    stream = stream if stream is not None else (sys.stderr if stderr else sys.stdout)
    color = color_enabled(stream)
    # soft_wrap: a printed line is never broken at a column by rich (a terminal folds it on the
    # screen; a pipe or log file keeps one line, as grep expects); tables still lay out to width
    return Console(
        file=stream,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
        force_terminal=color or None,
        emoji=False,
        width=None if color else 200,
    )


STATUS_STYLE = {
    "ok": "green",
    "warn": "yellow",
    "fail": "bold red",
    "skip": "dim",
    NodeState.RUNNING: "cyan",
    NodeState.SUCCEEDED: "green",
    NodeState.FAILED: "bold red",
    NodeState.STOPPED: "yellow",
    NodeState.STARTING: "cyan",
    NodeState.UNREACHABLE: "bold red",
    NodeState.UNKNOWN: "dim",
    NodeState.PENDING: "dim",
}


def styled(status: str) -> str:
    style = STATUS_STYLE.get(status)
    return f"[{style}]{status}[/]" if style else status
