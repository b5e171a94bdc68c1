"""What every renderer shares: text from a node made safe (`safe`, `markup`, `printable`), orch's
error line, `--json` output (`strict`, `json_out`), a line alone on stdout.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from typing import Any


def safe(text: object) -> str:
    """Text from a node, made safe for a terminal (`logs.lines.printable`)."""
    from ...logs.lines import printable

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


def silence_stdout() -> None:
    """The reader of stdout went away (`orch logs | head`): drop what is left quietly."""
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit


def click_stdout(text: str) -> None:
    """One line on stdout, alone: what a script captures (`xdg-open "$(orch report)"`)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def printable(text: str) -> str:
    """Text from a node, safe for a terminal: the one `logs.lines.printable` every output uses."""
    return safe(text)
