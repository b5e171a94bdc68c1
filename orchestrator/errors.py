"""Exceptions that carry data; the CLI is the one place that renders them and exits with their code."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .contract import ExitCode


class OrchError(Exception):
    """Base of every error orch raises on purpose. `hint` tells the user what to do next."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


@dataclass
class InventoryIssue:
    """One problem in an inventory file, located as precisely as the YAML allows."""

    message: str
    path: str
    line: int | None = None
    key: str | None = None

    def render(self) -> str:
        """One line whatever the file held: a newline, an escape sequence or a bidi override in a
        key or a value quoted by the message is shown escaped (`\\n`, `\\x1b`, `\\u202e`)."""
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        key = f" [{self.key}]" if self.key else ""
        return visible(f"{where}:{key} {self.message}")


def visible(text: str) -> str:
    """`text` with every character that is not printable (line breaks, control and format
    characters) written as its Python escape, so that it prints as one honest line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class InventoryError(OrchError):
    """The inventory is invalid. Raised before any connection is made; exit code 2."""

    exit_code = ExitCode.USAGE

    def __init__(self, issues: Sequence[InventoryIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(i.render() for i in self.issues))


class UsageError(OrchError):
    """Bad command-line usage (unknown run, missing inventory...); exit code 2."""

    exit_code = ExitCode.USAGE


class PreflightUnavailable(OrchError):
    """The preflight itself cannot run (its code does not import): nothing is launched; exit 3."""

    exit_code = ExitCode.PREFLIGHT_FAILED


class AgentUnavailable(OrchError):
    """The node agent cannot run on `node` with `python` (the interpreter is missing, or nothing
    runs there): what the agent would answer is unknown, not an answer. `stop_node` asks the
    standard library's python3 then."""

    def __init__(self, node: str, python: str, detail: str) -> None:
        super().__init__(
            f"{node}: cannot run the node agent with python {python!r}: {detail}",
            "set job.python (or the node's python:) to an interpreter that exists on that node",
        )
        self.node = node
        self.python = python


class TransportError(OrchError):
    """A node could not be reached or refused us. `node` names it; `kind` says why."""

    def __init__(self, node: str, kind: str, message: str, hint: str | None = None) -> None:
        super().__init__(f"{node}: {message}", hint)
        self.node = node
        self.kind = kind
        """unreachable | auth | host_key_unknown | host_key_changed | host_key_revoked | timeout | error |
        gone (the node's allocation has ended: what ran there was ended with it, nothing can run there now)"""


class ConnectionLost(TransportError):
    """The connection broke under a running command: its exit status never came, and the command
    may have run (a start whose answer was lost must still be stopped)."""

    def __init__(self, node: str, message: str = "connection lost while running a command") -> None:
        super().__init__(node, "unreachable", message)


class Stalled(TransportError):
    """A stream into a node's command that took no byte for `stall_s` seconds while bytes remained
    (`Transport.pipe` with a `Fed` deadline): the stream was ended here, after `sent` bytes. With
    `finishing`, the command took every byte and had not finished `stall_s` seconds after the last
    (its `Fed.finish_s`)."""

    def __init__(self, node: str, stall_s: float, sent: int, finishing: bool = False) -> None:
        said = (
            f"took every byte ({sent}) and did not finish within {stall_s:.0f} s"
            if finishing
            else f"took no byte for {stall_s:.0f} s, after {sent} bytes"
        )
        super().__init__(node, "stalled", said)
        self.stall_s = stall_s
        self.sent = sent
        self.finishing = finishing


@dataclass
class RemoteCommandFailed(OrchError):
    """A command exited non-zero on a node; shows the argv, the code and the tail of stderr."""

    node: str
    argv: Sequence[str]
    exit_code_remote: int
    stderr_tail: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        tail = "\n".join("    " + line for line in self.stderr_tail[-10:])
        msg = f"{self.node}: `{' '.join(self.argv)}` exited {self.exit_code_remote}"
        super().__init__(msg + (f"\n{tail}" if tail else ""))
