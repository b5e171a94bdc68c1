"""`transport: local`: nodes that are processes on this machine.

Commands go through `/bin/sh -c` with the same command line SSH would send, so both transports
exercise the same quoting; each starts in $HOME, like an SSH login.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.nodes import Node
from ..errors import TransportError
from .base import OnOutput, Process, Transport, command_line, log


class _LocalProcess(Process):
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

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()  # bounded: SIGKILLed just above
        self.close_stdin()
        self.stdout.close()


class LocalTransport(Transport):
    """Nodes that are processes on this machine (`transport: local`). Commands start in $HOME,
    like an SSH login, through `/bin/sh -c` with the same command line SSH would send."""

    close_stops_commands = True

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closes = 0
        """How often `close` ran: a command that was starting meanwhile is ended like the others."""
        self._lock = threading.Lock()

    def connect(self) -> float:
        return 0.0

    def _exec(
        self,
        line: str,
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> tuple[int, bytes, bytes]:
        with self._lock:
            closes = self._closes
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            cwd=os.path.expanduser("~"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        with self._lock:
            self._running.add(proc)
            closed_meanwhile = self._closes != closes
        if closed_meanwhile:  # close() ran while it started (Ctrl-C right then): it would outlive it
            _kill_group(proc)
        try:
            if on_output is None:
                out, err = proc.communicate(stdin or b"", timeout=timeout)
            else:
                out, err = _streamed(proc, stdin or b"", timeout, on_output, keep)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            if on_output is None:  # _streamed has drained and closed the pipes itself
                proc.communicate()
            raise TransportError(self.node.name, "timeout", f"command timed out after {timeout:.0f} s") from None
        finally:
            with self._lock:
                self._running.discard(proc)
        return proc.returncode, out, err

    def close(self) -> None:
        """End the commands `run` still waits for, as closing an SSH connection ends its sessions
        (`popen` processes are the caller's to close)."""
        with self._lock:
            self._closes += 1
            running = list(self._running)
        for proc in running:
            _kill_group(proc)

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin: bool = False,
    ) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node.name, line)
        proc = subprocess.Popen(
            ["/bin/sh", "-c", line],
            cwd=os.path.expanduser("~"),
            stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return _LocalProcess(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group a command started (`start_new_session`), if it is still there."""
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass


def _streamed(
    proc: subprocess.Popen[bytes], stdin: bytes, timeout: float | None, on_output: OnOutput, keep: bool = True
) -> tuple[bytes, bytes]:
    """`communicate()` that hands each piece of output to `on_output` as it arrives (and keeps it
    all, unless `keep` is False). Raises subprocess.TimeoutExpired past `timeout` (the caller kills
    the process group)."""
    got: dict[str, bytearray] = {"out": bytearray(), "err": bytearray()}

    def pump(stream: str, fh: Any) -> None:
        while True:
            data = os.read(fh.fileno(), 65536)
            if not data:
                return
            if keep:
                got[stream] += data
            on_output(stream, data)

    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=pump, args=(name, fh), daemon=True, name=f"orch-local-{name}")
        for name, fh in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for t in readers:
        t.start()
    try:
        proc.stdin.write(stdin)
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()  # bounded: SIGKILLed just above
        raise
    finally:
        for t in readers:
            t.join()  # bounded: the process has ended, its pipes are at their end
        proc.stdout.close()
        proc.stderr.close()
    return bytes(got["out"]), bytes(got["err"])
