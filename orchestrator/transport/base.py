"""What every transport is: run a command on a node, stream one, write a file; and fan-out.

Every command is an argv list; it is turned into one shell line exactly once, in
`command_line()` (`shlex.join`), so env values and arguments reach the node byte for byte.
`fan_out` asks every node in parallel and collects every answer, good or bad, in a
`GroupResult` (Fabric's): one bad node never hides the others.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Protocol, TypeVar

from ..config.nodes import Node
from ..errors import RemoteCommandFailed

log = logging.getLogger("orch.transport")
T = TypeVar("T")

OnOutput = Callable[[str, bytes], None]
"""on_output(stream, data): a piece of a running command's output, `out` or `err`, as it arrives."""


class Progress(Protocol):
    """How work over the nodes says how far it is, as they answer: `progress(label, done, total)`,
    `done` of `total` (nodes, or steps of the fabric job), `label` what is being done (`probing`,
    `testing reachability`, `syncing`...). The one type of it: the preflight, the fabric check,
    `orch exec`, `orch sync` and `orch image push` call it; the CLI draws it."""

    def __call__(self, label: str, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class Result:
    """What a finished command left: exit code, both streams, and how long it took."""

    node: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    elapsed_ms: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> Result:
        """Return self, or raise RemoteCommandFailed with the stderr tail."""
        if not self.ok:
            raise RemoteCommandFailed(self.node, self.argv, self.exit_code, self.stderr.splitlines()[-10:])
        return self


def shell_path(path: str) -> str:
    """Quote a path for the remote shell, keeping a leading `~/` meaning the login's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """The one place argv becomes a shell line: `cd DIR && exec env -- K=V ... argv`."""
    if not argv:
        raise ValueError("empty argv")
    parts = []
    if cwd:
        parts.append(f"cd {shell_path(cwd)} &&")
    if env:
        parts.append("exec env -- " + shlex.join([f"{k}={v}" for k, v in env.items()] + list(argv)))
    else:
        parts.append("exec " + shlex.join(argv))
    return " ".join(parts)


class Process:
    """A command still running on a node, its stdout+stderr merged into one byte stream."""

    stdout: IO[bytes]

    def poll(self) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - interface
        """Stop reading; end the command's session (SSH channel closed / local process killed)."""
        raise NotImplementedError

    def lines(self) -> Iterator[bytes]:
        """Yield output lines (with their newline) until the stream ends."""
        yield from iter(self.stdout.readline, b"")

    def write(self, data: bytes) -> None:
        """Send data to the command's stdin (only for `popen(..., keep_stdin=True)`)."""
        raise NotImplementedError

    def close_stdin(self) -> None:
        """End the command's stdin (EOF); the command keeps running."""
        raise NotImplementedError


class Transport:
    """Run commands on one node. Subclasses implement `connect`, `_exec`, `popen`, `close`."""

    close_stops_commands = False
    """Whether `close` ends the commands `run` still waits for, whatever they started (the local
    transport kills their process groups). Over SSH it does not: a command without a terminal
    outlives its connection, unless it runs tethered (`node/tether.py`, as `orch exec` runs it)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def connect(self) -> float:
        """Open the connection if needed; return how long that took in ms (0 when already open)."""
        raise NotImplementedError

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_output: OnOutput | None = None,
    ) -> Result:
        """Run argv to completion; never raises for a non-zero exit (see `Result.check`).
        `on_output(stream, data)`: each piece of output as it arrives (`out` or `err`), besides
        the whole of it in the Result."""
        return self._run_line(command_line(argv, env, cwd), tuple(argv), stdin, timeout, on_output)

    def run_shell(
        self,
        line: str,
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> Result:
        """Run a line a person wrote for the node's login shell, sent as it is, the way ssh and pdsh
        send one (`orch exec -- 'pip freeze | grep torch'`). orch's own commands are argv (`run`).
        `keep=False` (with `on_output`): the output only goes to `on_output`, the Result's streams
        are empty, so memory does not grow with what the command prints."""
        return self._run_line(line, (line,), stdin, timeout, on_output, keep)

    def _run_line(
        self,
        line: str,
        argv: tuple[str, ...],
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> Result:
        log.debug("%s$ %s", self.node.name, line)
        start = time.monotonic()
        if not keep and on_output is None:
            raise ValueError("keep=False needs on_output: the output would go nowhere")
        code, out, err = self._exec(line, stdin, timeout, on_output, keep)
        elapsed = (time.monotonic() - start) * 1000
        return Result(
            self.node.name, argv, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), elapsed
        )

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin: bool = False,
    ) -> Process:
        """Start argv, stdout+stderr merged into one stream; stdin is closed at once unless
        `keep_stdin` (then `Process.write` talks to the command while it runs)."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _exec(
        self,
        line: str,
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> tuple[int, bytes, bytes]:
        """(exit code, stdout, stderr); with `keep` False the streams are not kept (b"")."""
        raise NotImplementedError

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupResult(Mapping[str, "T | Exception"]):
    """Every node's answer to one fan-out, keyed by node name in the order the nodes were given:
    what the call returned, or the exception it raised. `succeeded` and `failed` split them."""

    def __init__(self, results: Mapping[str, T | Exception]) -> None:
        self._results = dict(results)

    def __getitem__(self, name: str) -> T | Exception:
        return self._results[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def __repr__(self) -> str:
        return f"GroupResult({self._results!r})"

    @property
    def succeeded(self) -> dict[str, T]:
        """The nodes whose call returned, with what it returned."""
        return {n: v for n, v in self._results.items() if not isinstance(v, Exception)}

    @property
    def failed(self) -> dict[str, Exception]:
        """The nodes whose call raised, with the exception."""
        return {n: v for n, v in self._results.items() if isinstance(v, Exception)}


def fan_out(nodes: Sequence[Node], fn: Callable[[Node], T], max_workers: int = 32) -> GroupResult[T]:
    """Call fn(node) for every node in parallel (bounded); collect every result or exception,
    keyed by node name in the order given. Never stops at the first bad node.

    A Ctrl-C waits for every call to answer, by design: a node whose start is in flight must answer
    before a teardown stops it. Each call is bounded by its transport's timeouts; a caller whose
    calls are not (`orch exec` without --timeout) waits through `remote.exec._interruptible` and
    closes the connections, which ends them."""
    results: dict[str, T | Exception] = {n.name: RuntimeError("not run") for n in nodes}
    if not nodes:
        return GroupResult(results)

    def one(node: Node) -> T | Exception:
        try:
            return fn(node)
        except Exception as exc:  # collected, judged by the caller
            return exc

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(nodes))), thread_name_prefix="orch") as pool:
        for node, value in zip(nodes, pool.map(one, nodes)):  # bounded: see the docstring
            results[node.name] = value
    return GroupResult(results)
