"""What every transport is: every way to a node (run a command, stream one, pipe a byte stream
into one, copy a tree), what it is (`name`, `same_host`), and the fan-out over nodes.

Every command is an argv list; it is turned into one shell line exactly once, in
`command_line()` (`shlex.join`), so env values and arguments reach the node byte for byte.
`fan_out` asks every node in parallel and collects every answer, good or bad, in a
`GroupResult` (Fabric's): one bad node never hides the others; it draws the progress, and,
asked to, ends what is in flight on Ctrl-C.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar, Protocol, TypeVar

from .. import waits
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..errors import OrchError, RemoteCommandFailed, Stalled, TransportError
from .copy import (
    RSYNC_TIMED_OUT,
    UNTAR,
    CopyFailed,
    Transfer,
    check_sources,
    parse_output,
    said_in_one_line,
    stalled_copy,
    tar_argv,
    tree_files,
    untar_failed,
)

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


Note = Callable[[str], None]
"""note(line): one line of what is happening as it happens, for a person (where a Slurm allocation
is: asked for, pending and why, running, given back). Not a progress count (`Progress`)."""


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


class PopenProcess(Process):
    """A `Process` that is a process of this machine (`subprocess.Popen`, stdout+stderr one pipe):
    the local command, or the srun or ssh client that runs it on its node. A subclass says only how
    it is ended (`end`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        assert proc.stdout is not None
        self.stdout = proc.stdout

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def write(self, data: bytes) -> None:
        if self.proc.stdin is None:
            raise ValueError("stdin was not kept open (popen keep_stdin=False)")
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def end(self) -> None:  # pragma: no cover - interface
        """End the process (and what it runs), once gone."""
        raise NotImplementedError

    def close(self) -> None:
        self.end()
        self.close_stdin()
        self.stdout.close()


Source = bytes | IO[bytes] | Iterable[bytes] | None
"""What `pipe` streams into a node's command: bytes, a readable binary file (an open file or pipe is
handed to the reach as its stdin, no copy through Python), chunks of bytes, or None (empty)."""

END_WAIT_S = 5.0
"""How long `Children.end_all` waits for a signalled process before it SIGKILLs it."""


class Children:
    """The processes of this machine a transport started for its node (the OpenSSH client of a
    pipe, rsync, tar, a local command): `end_all` ends them (`close()` calls it), one that was
    starting meanwhile included, and returns once they are gone. One started in a session of its
    own (a local node's command) is ended with its whole process group (SIGKILL), any other with
    SIGTERM (rsync and ssh clean up), SIGKILL `END_WAIT_S` later."""

    def __init__(self) -> None:
        self._procs: dict[subprocess.Popen[bytes], bool] = {}
        self._ends = 0
        """How often `end_all` ran: a process that was starting meanwhile is ended like the others."""
        self._lock = threading.Lock()

    def start(self, argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
        with self._lock:
            ends = self._ends
        proc: subprocess.Popen[bytes] = subprocess.Popen(list(argv), **popen)
        with self._lock:
            self._procs[proc] = bool(popen.get("start_new_session"))
            ended_meanwhile = self._ends != ends
        if ended_meanwhile:  # end_all ran while it started (Ctrl-C right then): it would outlive it
            self.end(proc)
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.pop(proc, None)

    def end(self, proc: subprocess.Popen[bytes], hard: bool = False) -> None:
        """Signal `proc` to end: its process group when it leads one (SIGKILL), else SIGTERM
        (SIGKILL when `hard`)."""
        with self._lock:
            group = self._procs.get(proc, False)
        if proc.returncode is not None:  # reaped: its pid may be another process's by now
            return
        if group:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        elif hard:
            proc.kill()
        else:
            proc.terminate()

    def end_all(self) -> None:
        with self._lock:
            self._ends += 1
            procs = list(self._procs)
        for proc in procs:
            self.end(proc)
        for proc in procs:
            try:
                proc.wait(END_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()  # bounded: SIGKILLed just above


FEED_SLICE = 1 << 16
"""The most bytes one write hands a fed command (`Fed` counts them as they go: a pipe's size)."""
STALL_POLL_S = 0.5
"""How often a fed command's progress is judged against its deadline."""


class Fed:
    """What a stream handed its command so far (`run_here` feeds through a thread and counts):
    `bytes`, when the last went (`last`, on `clock`), and whether the source `ended`. With `stall_s`,
    the command is ended once no byte went for that long while some remained (`stalled`): a reader
    that stopped reading (a stopped process, a hung disk) holds no one up past it. With `finish_s`
    too, a command that took every byte is ended once it has not finished that long after the last
    (an image's load still writing its layers to a hung disk): `stalled` and `ended` both. Read
    from other threads while it runs (a progress display): plain values, each written by one thread."""

    def __init__(
        self, stall_s: float | None = None, clock: Callable[[], float] = time.monotonic, finish_s: float | None = None
    ) -> None:
        self.stall_s = stall_s
        self.finish_s = finish_s
        """The longest the command may take to finish after the last byte (None: as long as it needs)."""
        self.clock = clock
        self.bytes = 0
        self.last = clock()
        self.ended_at: float | None = None
        self.ended = False
        """Every byte of the source was handed over (at `ended_at`)."""
        self.stalled = False
        """Its deadline passed: the command was ended here, after `bytes`."""

    def took(self, n: int) -> None:
        self.bytes += n
        self.last = self.clock()

    def end(self) -> None:
        """The source's last byte went."""
        self.ended_at = self.clock()
        self.ended = True

    def overdue(self) -> bool:
        """No byte went for `stall_s` while some remained, or, every byte gone, the command has not
        finished within `finish_s` of the last."""
        if self.stall_s is None:
            return False
        if self.ended:
            finishing_s = self.clock() - (self.ended_at if self.ended_at is not None else self.last)
            return self.finish_s is not None and finishing_s >= self.finish_s
        return self.clock() - self.last >= self.stall_s


def run_here(
    children: Children,
    argv: Sequence[str],
    source: Source = None,
    timeout: float | None = None,
    fed: Fed | None = None,
    **popen: Any,
) -> tuple[int, bytes, bytes]:
    """Run a process of this machine to its end with `source` on its stdin: (exit code, stdout,
    stderr). Raises subprocess.TimeoutExpired past `timeout`, or past `fed`'s deadline (then
    `fed.stalled`; the process ended first either way), and FileNotFoundError when there is no
    such program here. With `fed` the source goes through a thread that counts it, a file too."""
    feed: Iterable[bytes] | None = None
    data: bytes | None = None
    stdin: Any = subprocess.DEVNULL
    if isinstance(source, (bytes, bytearray)) and fed is not None:
        feed = [bytes(source)]
    elif isinstance(source, (bytes, bytearray)):
        data, stdin = bytes(source), subprocess.PIPE
    elif source is not None:
        stdin = _fd(source) if fed is None else None
        if stdin is None:
            read = getattr(source, "read", None)
            feed = iter(lambda: read(1 << 20), b"") if read is not None else source
    writer = None
    if feed is not None:
        stdin, writer = os.pipe()
    try:
        proc = children.start(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    except BaseException:
        if writer is not None:
            os.close(writer)
        raise
    finally:
        if writer is not None:
            os.close(stdin)
    feeder = None
    if feed is not None and writer is not None:
        feeder = threading.Thread(target=_feed, args=(feed, writer, fed), daemon=True, name="orch-pipe")
        feeder.start()
    try:
        if fed is None or fed.stall_s is None:
            out, err = proc.communicate(data, timeout=timeout)
        else:
            out, err = _watched(proc, timeout, fed)
    except subprocess.TimeoutExpired:
        children.end(proc, hard=True)
        proc.communicate()  # bounded: SIGKILLed just above
        raise
    finally:
        children.forget(proc)
        if feeder is not None:
            feeder.join(END_WAIT_S)  # the process is gone: its stdin's next write fails at once
    return proc.returncode, out, err


def _fd(source: object) -> int | None:
    """The file descriptor of a real file or pipe, or None (bytes in memory, a generator)."""
    fileno = getattr(source, "fileno", None)
    try:
        return int(fileno()) if fileno is not None else None
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _watched(proc: subprocess.Popen[bytes], timeout: float | None, fed: Fed) -> tuple[bytes, bytes]:
    """`proc.communicate()`, judging `fed`'s progress every `STALL_POLL_S`: TimeoutExpired past
    `timeout`, or once it is overdue (`fed.stalled` then set)."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        step = STALL_POLL_S if end is None else max(0.0, min(STALL_POLL_S, end - time.monotonic()))
        try:
            return proc.communicate(timeout=step)
        except subprocess.TimeoutExpired:
            if end is not None and time.monotonic() >= end:
                raise
            if fed.overdue():
                fed.stalled = True
                raise


def _feed(chunks: Iterable[bytes], fd: int, fed: Fed | None = None) -> None:
    """Write every chunk into the pipe `fd`, then close it; a process that stopped reading (it
    ended: its answer tells why) ends the writing. `fed` counts each slice as the pipe takes it."""
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                n = os.write(fd, view[:FEED_SLICE] if fed is not None else view)
                if fed is not None:
                    fed.took(n)
                view = view[n:]
        if fed is not None:
            fed.end()
    except (OSError, ValueError):  # EPIPE: the reader is gone; ValueError: the source was closed under us
        pass
    finally:
        os.close(fd)


class Transport:
    """Every way to one node. Subclasses implement `connect`, `_exec`, `popen`, `close`, and `reach`
    (`pipe` and the tar fallback of `copy_tree` rest on it); an rsync reach overrides `copy_tree`.
    Registered by `name` in `transport/__init__.py` (`TRANSPORTS`)."""

    name: ClassVar[str]
    """The inventory's `transport:` value that picks this class."""
    same_host: ClassVar[bool] = False
    """Whether the nodes are processes on this machine: their files are the controller's (`orch
    sync` has nothing to copy, job.sync paths are one shared copy, a relative path in the inventory
    means the inventory file's; config/schema.py `SAME_HOST` holds the same fact for the reader)."""
    close_stops_commands: ClassVar[bool] = False
    """Whether `close` ends the commands `run` still waits for, whatever they started (the local
    transport kills their process groups). Over SSH it does not: a command without a terminal
    outlives its connection, unless it runs tethered (`node/tether.py`, as `orch exec` runs it)."""
    copy_tools: ClassVar[tuple[str, ...]] = ("tar",)
    """The programs `copy_tree` runs on this machine (`require_copy_tools` names a missing one)."""
    allocates: ClassVar[bool] = False
    """Whether the nodes are an allocation this transport holds (`hold`) rather than an inventory's
    `nodes:` list (config/schema.py `ALLOCATED` holds the same fact for the reader)."""
    agent_held: ClassVar[bool] = False
    """Whether the transport holds the node agents' processes (`launch`: one Slurm step on every
    node), so each agent runs in the foreground there; else the agent daemonizes itself."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_name = node.name
        """The node's name, which names this transport in every answer, error and log line."""
        self.children = Children()

    @classmethod
    def open(cls, inv: Inventory, node: Node) -> Transport:
        """The transport of `node`, an inventory's, not yet connected."""
        return cls(node)

    @classmethod
    def hold(cls, inv: Inventory, say: Note | None = None) -> Hold:
        """The nodes `inv` names, held for one command (`orch up`, `orch check`) until `Hold.release`:
        here the inventory's own; a Slurm allocation asked for and waited on (`say`: its progress)."""
        return Hold(inv)

    @classmethod
    def peek(cls, inv: Inventory) -> Inventory:
        """`inv` with the nodes `hold` would hold where knowing them asks for nothing (inside a
        Slurm allocation: its nodes), else `inv` as it is (`orch up --dry-run`)."""
        return inv

    @classmethod
    def plan_lines(cls, inv: Inventory) -> list[list[str]]:
        """The commands of this machine that `hold` and the launch would run (`orch up --dry-run`)."""
        return []

    @classmethod
    def release(cls, inv: Inventory) -> str | None:
        """Give back what a run's record says it holds (`orch down`): what was released, or None."""
        return None

    @classmethod
    def launch(
        cls,
        jobs: Mapping[str, tuple[Transport, list[str], bytes]],
        *,
        timeout: float,
        workers: int = 32,
        log_path: Path | None = None,
        detached: bool = False,
    ) -> GroupResult[Result]:
        """Run each node's call (`jobs`: {node name: (its transport, argv, stdin)}) on it, all at once,
        and collect each answer: here each node's own command to its end, in parallel (the agent
        daemonizes itself). A transport that holds the agents (`agent_held`) runs them as one process
        here that lasts as long as the job, writing to `log_path`; `detached`: it outlives this process."""
        by_node = {id(t.node): (t, argv, stdin) for t, argv, stdin in jobs.values()}

        def one(node: Node) -> Result:
            t, argv, stdin = by_node[id(node)]
            t.connect()
            return t.run(argv, stdin=stdin, timeout=timeout)

        return fan_out([t.node for t, _, _ in jobs.values()], one, workers)

    @classmethod
    def target(cls, node: Node) -> str:
        """How `node` is reached, in words, for a report line."""
        return node.host

    @classmethod
    def require_copy_tools(cls, command: str) -> None:
        """OrchError naming the first of `copy_tools` this machine lacks, before any node is asked."""
        for tool in cls.copy_tools:
            if shutil.which(tool) is None:
                package = TOOL_PACKAGES.get(tool, (tool, tool))
                raise OrchError(
                    f"{tool} is not installed on this machine (the controller): {command} needs it",
                    f"apt-get install {package[0]} (dnf install {package[1]})",
                )

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
        log.debug("%s$ %s", self.node_name, line)
        start = time.monotonic()
        if not keep and on_output is None:
            raise ValueError("keep=False needs on_output: the output would go nowhere")
        code, out, err = self._exec(line, stdin, timeout, on_output, keep)
        elapsed = (time.monotonic() - start) * 1000
        return Result(
            self.node_name, argv, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), elapsed
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

    def reach(self, line: str) -> list[str]:
        """The argv of a process of this machine that runs `line` on the node, its stdin, stdout
        and stderr the command's (the OpenSSH client; `/bin/sh -c` for a local node)."""
        raise NotImplementedError

    def _reach_popen(self) -> dict[str, Any]:
        """Popen's keywords for the `reach` process (its working directory, its session, its env)."""
        return {}

    def spawn(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start argv on the node through `reach`, its stdin, stdout and stderr pipes of this
        machine, for a conversation that lasts (the copy chain's relays: commands and data in,
        events out). Counted in `children`: `close()` ends it; the caller waits for it, then
        `children.forget`s it. A reach that never got in exits with what `unreached` reads."""
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s <> conversation", self.node_name, line)
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        return self.children.start(self.reach(line), **pipes, **self._reach_popen())

    def said(self, stderr: str) -> str:
        """The command's own stderr, less what the reach itself added (srun's `task 0: Exited with
        exit code 3`)."""
        return stderr

    def unreached(self, code: int, stderr: str) -> TransportError | None:
        """The error that says the reach never got into the node (its own words in `stderr`, with
        its exit code), or None when the command ran there and `code` is its own."""
        return None

    def pipe(
        self,
        argv: Sequence[str],
        source: Source,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        fed: Fed | None = None,
    ) -> Result:
        """Run argv on the node with `source` streamed into its stdin to its end (an image archive
        into `RUNTIME load`, a tar stream into tar): what the command printed and its exit code.
        Never raises for a non-zero exit; TransportError when the node could not be reached, or
        past `timeout` (the stream is ended); Stalled past `fed`'s deadline on progress (the stream
        is ended: over SSH the node's command is left as it is, `close_stops_commands` says). `fed`
        counts what the command took as it goes. `close()` ends it."""
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s < stream", self.node_name, line)
        start = time.monotonic()
        try:
            code, out, err = run_here(self.children, self.reach(line), source, timeout, fed, **self._reach_popen())
        except subprocess.TimeoutExpired:
            if fed is not None and fed.stalled and fed.stall_s is not None:
                if fed.ended and fed.finish_s is not None:
                    raise Stalled(self.node_name, fed.finish_s, fed.bytes, finishing=True) from None
                raise Stalled(self.node_name, fed.stall_s, fed.bytes) from None
            raise TransportError(self.node_name, "timeout", f"command timed out after {timeout:.0f} s") from None
        stderr = err.decode("utf-8", "replace")
        refused = self.unreached(code, stderr)
        if refused is not None:
            raise refused
        elapsed = (time.monotonic() - start) * 1000
        return Result(self.node_name, tuple(argv), code, out.decode("utf-8", "replace"), self.said(stderr), elapsed)

    def copy_tree(
        self,
        sources: Sequence[str],
        dest: str = "/",
        *,
        delete: bool = False,
        dry_run: bool = False,
        checksum: bool = False,
        stall_s: float | None = None,
    ) -> Transfer:
        """Copy each absolute path of `sources` (files or directories of this machine) to `dest` +
        that path on the node; what was (with `dry_run`, would be) sent. Raises CopyFailed (the
        copying tool's exit code, one line, a hint) when it did not copy; kind `stalled` when it
        moved no byte for `stall_s` (then ended here).

        Here, the fallback of a transport without an rsync reach: a tar stream of every file into
        the node's tar over `pipe`. No quick check: every file is sent and itemized as sent
        (`<f?????????`), `checksum` changes nothing; `delete` is refused."""
        check_sources(sources)
        if delete:
            raise CopyFailed(
                self.node_name,
                2,
                f"transport: {self.name} copies with a tar stream, which cannot delete what the node has beyond it",
                "copy without --delete",
            )
        files = list(tree_files(sources))
        changes = tuple(f"<f????????? {path}" for path, _ in files)
        total = sum(size for _, size in files)
        if dry_run:
            return Transfer(len(files), total, 0, changes)
        with tempfile.TemporaryFile() as said:
            try:
                tar = self.children.start(
                    tar_argv(sources), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=said
                )
            except FileNotFoundError:
                raise CopyFailed(self.node_name, 127, "tar is not installed on this machine (the controller)") from None
            stream = tar.stdout
            assert stream is not None
            sent = [0]

            def counted() -> Iterator[bytes]:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    sent[0] += len(chunk)
                    yield chunk

            try:
                answer = self.pipe(UNTAR.argv("tar", dest), counted(), fed=Fed(stall_s) if stall_s else None)
            except Stalled as exc:
                raise stalled_copy(self.node_name, 124, exc.stall_s, "the tar stream") from None
            finally:
                stream.close()
                here = tar.wait()  # bounded: its stdout is closed, or it ended
                self.children.forget(tar)
            said.seek(0)
            here_said = [ln.strip() for ln in said.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        if here != 0:  # the cause, whatever the node's tar made of a broken stream
            raise CopyFailed(
                self.node_name, here, "tar on this machine (the controller) exited " + said_in_one_line(here, here_said)
            )
        if answer.exit_code != 0:
            raise untar_failed(self.node_name, answer.exit_code, answer.stderr)
        return Transfer(len(files), total, sent[0], changes)

    def _run_rsync(
        self, argv: Sequence[str], stall_s: float | None, missing_here: str, failed: Callable[[int, str], CopyFailed]
    ) -> Transfer:
        """The rsync of an rsync reach's `copy_tree`, run on this machine (LC_ALL=C, its report read):
        CopyFailed when it is not installed here (`missing_here`), moved no byte for `stall_s`, or
        failed (`failed`: its exit code and stderr, in the reach's words)."""
        try:
            code, out, err = run_here(self.children, argv, env={**os.environ, "LC_ALL": "C"})
        except FileNotFoundError:
            raise CopyFailed(self.node_name, 127, missing_here) from None
        if code == RSYNC_TIMED_OUT and stall_s is not None:
            raise stalled_copy(self.node_name, code, stall_s, "rsync")
        if code != 0:
            raise failed(code, err.decode("utf-8", "replace"))
        try:
            return parse_output(out.decode("utf-8", "replace"))
        except ValueError as exc:
            raise CopyFailed(self.node_name, 0, f"rsync succeeded but its report could not be read: {exc}") from None

    def close(self) -> None:
        """End what this transport still runs for its node."""
        self.children.end_all()

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


class Hold:
    """The nodes a transport holds for one command (`Transport.hold`): for an inventory that lists
    them, nothing to hold; for a Slurm allocation, the allocation (transport/allocation.py), given
    back by `release` unless `keep` was called (a detached run: its launch gives it back)."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        """The inventory with the held nodes."""

    @property
    def record(self) -> dict[str, Any] | None:
        """What run.json keeps of it (`slurm`), None when there is nothing to keep."""
        return None

    def renew(self, say: Note | None = None) -> Inventory:
        """The nodes for the next attempt of a run, once the last one ended (a requeued or ended
        allocation waited for or asked for again); OrchError when there can be none."""
        return self.inventory

    def ended(self) -> str | None:
        """Why the held nodes went away under the run (a time limit, a preemption), in words; None
        when they did not."""
        return None

    def keep(self) -> None:
        """Leave what is held to the launch (a detached run), not to `release`."""

    def release(self) -> None:
        """Give back what was asked for (idempotent)."""

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


TOOL_PACKAGES = {"rsync": ("rsync", "rsync"), "ssh": ("openssh-client", "openssh-clients"), "tar": ("tar", "tar")}
"""The package that brings a tool, by apt and by dnf."""


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


def fan_out(
    nodes: Sequence[Node],
    fn: Callable[[Node], T],
    max_workers: int = 32,
    *,
    progress: Progress | None = None,
    label: str = "",
    stop: Callable[[], None] | None = None,
) -> GroupResult[T]:
    """Call fn(node) for every node in parallel (bounded); collect every result or exception,
    keyed by node name in the order given. Never stops at the first bad node. `progress(label,
    done, total)` after each node's call.

    Ctrl-C, without `stop`: waits for every call to answer, by design (a node whose start is in
    flight must answer before a teardown stops it; each call is bounded by its transport's
    timeouts). With `stop` (`orch exec`, `orch sync`, `orch image push`: their calls need not end
    on their own): the wait ends at once (in waits.py's slices, whichever thread the kernel hands the
    signal to), calls not begun never begin, `stop()` ends those in flight (`Cluster.fan_out`:
    closes every transport, which ends what they run, here and on the nodes), then
    KeyboardInterrupt propagates."""
    results: dict[str, T | Exception] = {n.name: RuntimeError("not run") for n in nodes}
    if not nodes:
        return GroupResult(results)
    lock = threading.Lock()
    done = [0]
    stopping = threading.Event()

    def one(node: Node) -> T | Exception:
        if stopping.is_set():
            return RuntimeError("interrupted before it began")
        try:
            return fn(node)
        except Exception as exc:  # collected, judged by the caller
            return exc
        finally:
            if progress is not None and not stopping.is_set():
                with lock:
                    done[0] += 1
                    progress(label, done[0], len(nodes))

    pool = ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(nodes))), thread_name_prefix="orch")
    if stop is None:
        with pool:
            for node, value in zip(nodes, pool.map(one, nodes)):  # bounded: see the docstring
                results[node.name] = value
        return GroupResult(results)
    try:
        futures = [pool.submit(one, n) for n in nodes]
        for node, value in zip(nodes, waits.results(futures)):
            results[node.name] = value
    except KeyboardInterrupt:
        stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        stop()
        raise
    pool.shutdown()  # bounded: every call has answered
    return GroupResult(results)
