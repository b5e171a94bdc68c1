"""`transport: local`: nodes that are processes on this machine.

Commands go through `/bin/sh -c` with the same command line SSH would send, so both transports
exercise the same quoting; each starts in $HOME, like an SSH login, in a session of its own that
`close` kills whole. `copy_tree` is rsync on this machine.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.nodes import Node
from ..errors import TransportError
from .base import OnOutput, PopenProcess, Process, Transport, command_line, log
from .copy import CopyFailed, Transfer, rsync_argv, said_in_one_line


class _LocalProcess(PopenProcess):
    """A local node's command, in a session of its own: ended with its whole process group."""

    def end(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()  # bounded: SIGKILLed just above


class LocalTransport(Transport):
    """Nodes that are processes on this machine (`transport: local`). Commands start in $HOME,
    like an SSH login, through `/bin/sh -c` with the same command line SSH would send."""

    name = "local"
    same_host = True
    close_stops_commands = True
    copy_tools = ("rsync",)

    @classmethod
    def target(cls, node: Node) -> str:
        return "local process (transport: local)"

    def connect(self) -> float:
        return 0.0

    def reach(self, line: str) -> list[str]:
        return ["/bin/sh", "-c", line]

    def _reach_popen(self) -> dict[str, Any]:
        return {"cwd": os.path.expanduser("~"), "start_new_session": True}

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
        """rsync on this machine: the node's paths are this machine's (`stall_s`: its `--timeout`)."""
        target = dest.rstrip("/") + "/"
        argv = rsync_argv(sources, target, delete=delete, dry_run=dry_run, checksum=checksum, stall_s=stall_s)

        def failed(code: int, stderr: str) -> CopyFailed:
            lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
            return CopyFailed(self.node_name, code, "rsync exited " + said_in_one_line(code, lines))

        return self._run_rsync(argv, stall_s, "rsync is not installed on this machine", failed)

    def _exec(
        self,
        line: str,
        stdin: bytes | None,
        timeout: float | None,
        on_output: OnOutput | None = None,
        keep: bool = True,
    ) -> tuple[int, bytes, bytes]:
        proc = self.children.start(
            ["/bin/sh", "-c", line],
            cwd=os.path.expanduser("~"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            if on_output is None:
                out, err = proc.communicate(stdin or b"", timeout=timeout)
            else:
                out, err = _streamed(proc, stdin or b"", timeout, on_output, keep)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            if on_output is None:  # _streamed has drained and closed the pipes itself
                proc.communicate()
            raise TransportError(self.node_name, "timeout", f"command timed out after {timeout:.0f} s") from None
        finally:
            self.children.forget(proc)
        return proc.returncode, out, err

    def close(self) -> None:
        """End the commands `run`, `pipe` and `copy_tree` still wait for, as closing an SSH
        connection ends its sessions (`popen` processes are the caller's to close)."""
        self.children.end_all()

    def popen(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        keep_stdin: bool = False,
    ) -> Process:
        line = command_line(argv, env, cwd)
        log.debug("%s$ %s", self.node_name, line)
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
