"""`orch exec`: one command on every node in parallel, each node's exit code and output collected.

The command goes over the inventory's transport with its host-key rules: several words are an
argv, quoted once by the transport so each word reaches the node as it is; one word is a line for
the node's login shell, sent as it is (`orch exec -- 'pip freeze | grep torch'`, as with pdsh and
ssh). It runs in the node's login environment: the inventory's `env` is not applied (and no
value of it ever travels on a command line). Its stdin is empty.

Every node gets an exit code, so the worst is well defined: the command's own; 255 when it could
not be run there or ended without one (unreachable, auth or host key refused, killed by a
signal: ssh's and pdsh's code); 124 when it outlived `--timeout` (timeout(1)'s). The worst is
the largest.

On the node the command is tethered to its SSH session (`node/tether.py`, a watcher the login
shell starts in the background with the node's `python`): when sshd's session process goes
away, the login shell's process group (the command and what it started) gets SIGTERM, SIGKILL
5 s later. So Ctrl-C on `orch exec` (which closes every connection) stops the command on every
node, as closing a terminal would; a plain `ssh host cmd` or pdsh leaves it running there. The
command itself runs as without it (the same login shell, environment and exit status). A node
without that python runs it untethered, as ssh would.

With `--timeout` the command runs under the node's timeout(1) (`timed_line`): past it, the node
itself stops the command's whole process group (SIGTERM, SIGKILL 5 s later), so nothing of it
is left running there, whatever happens to the connection; what it printed until then is kept.
The controller gives up on a node that has not answered `KILL_AFTER_S` + `SLACK_S` later.

With `--container RUN` (`config.jobenv.BoxExec`) the command runs in RUN's container on each
node, found by the labels of the run, that node and the launch (`node/execbox.py`, under the
node's `python`, tethered as above). A runtime's exec client is not the command: on the timeout,
a signal or a lost session the node program stops the command's processes inside the container
(SIGTERM, SIGKILL `EXEC_GRACE_S` later) and says so once they are gone (exit 124 on a timeout; 255
and why where something is left); timeout(1) is not used. The controller's backstop waits
`BOX_SLACK_S` past the timeout for that answer.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..config.inventory import Inventory
from ..config.jobenv import EXEC_GRACE_S, BoxExec
from ..config.nodes import Node
from ..config.schema import JobModel
from ..errors import TransportError
from ..node import packed
from ..shell import Script
from ..transport import Cluster, Result, Transport
from ..transport.base import Progress

UNREACHABLE = 255
"""A node where the command could not run, or ended without an exit status."""
TIMED_OUT = 124
"""A node where the command outlived `--timeout`."""

KILL_AFTER_S = 5
"""Seconds between timeout(1)'s SIGTERM to the command's process group and its SIGKILL."""
SLACK_S = 10
"""How much longer than that the controller waits for a node's answer before it closes the session."""
BOX_SLACK_S = EXEC_GRACE_S + 60 + 5 + 15
"""With `--container`: how much longer than the timeout the controller waits for a node's answer
(the stop inside the container: its grace, the runtime's exec of it, what SIGKILL leaves, the
client's end; `node/execbox.py`)."""

TETHER = Script('command -v "$0" >/dev/null 2>&1 && { "$0" -I -S -c "$1" "$PPID" </dev/null >/dev/null 2>&1 & }')
"""`$0` the node's python, `$1` the watcher's program: started in the background, watching sh's
parent (`$PPID`: the login shell), when there is such a python; else nothing."""
TIMED_LINE = Script('exec "$0" -k "$1" "$2" "${SHELL:-/bin/sh}" -c "$3"', guarded=True)
"""`$0` timeout, `$1` the seconds to SIGKILL, `$2` the timeout, `$3` a line for the login shell."""
TIMED_ARGV = Script('k=$1 t=$2; shift 2; exec "$0" -k "$k" "$t" "$@"', guarded=True)
"""`$0` timeout, `$1` the seconds to SIGKILL, `$2` the timeout, the argv after them."""


def tether(python: str | None) -> str:
    """The start of the login-shell line that starts `node/tether.py` in the background with the
    node's `python`, watching the login shell; nothing where there is no such python (the command
    then runs untethered, as ssh alone runs it) or `python` is None (a transport whose close stops
    the command itself). It is `/bin/sh -c` with its script and values as single-quoted words, and
    `;`, which sh, bash, fish and tcsh parse alike (tested; the program is one base64 line: no
    newline, quote, backslash or `!` in it), so the command after it is still a line for whatever
    the login shell is. sh's `$PPID` is that shell."""
    if python is None:
        return ""
    program = f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed("tether")}")))'
    return shlex.join(TETHER.argv(python, program)) + "; "


def command_line(command: Sequence[str], shell: bool, python: str | None = JobModel.python) -> str:
    """The login-shell line of `orch exec` without --timeout: the tether, then the command as the
    login shell would run it alone (one word: that line itself; several: `exec` of the argv)."""
    return tether(python) + (command[0] if shell else "exec " + shlex.join(command))


def box_line(box: BoxExec, node: Node, command: Sequence[str], timeout: float | None, tethered: bool) -> str:
    """The login-shell line of `orch exec --container`: the tether (unless the transport's close
    stops the command itself), then `node/execbox.py` under the node's `python`, its arguments
    values (`BoxExec.args`: that node's container)."""
    program = f'import base64,zlib;exec(zlib.decompress(base64.b64decode("{packed("execbox")}")))'
    run = [node.python, "-I", "-S", "-c", program, *box.args(node.name, command, timeout)]
    return tether(node.python if tethered else None) + "exec " + shlex.join(run)


def timed_line(command: Sequence[str], shell: bool, timeout: float, python: str | None = JobModel.python) -> str:
    """The login-shell line that runs `command` under timeout(1) on the node: in a process group of
    its own, which timeout signals whole when the time is up (exit 124, 137 after the SIGKILL),
    tethered as without --timeout. A one-word command is a line for the node's login shell
    (`$SHELL -c`); several words are an argv. Without timeout(1) there: exit 127, saying so."""
    limits = (str(KILL_AFTER_S), f"{timeout:g}")
    run = TIMED_LINE.argv("timeout", *limits, command[0]) if shell else TIMED_ARGV.argv("timeout", *limits, *command)
    return tether(python) + "exec " + shlex.join(run)


LONG_LINE = 2 << 20
"""The longest line of a node's output held whole (as the log path holds a pending line): a longer
one is handed on in pieces of this size, each but the last ending with `LONG_LINE_MARK`."""
LONG_LINE_MARK = " [orch: a line longer than 2 MiB, continued on the next line]"
KEPT_BYTES = 1 << 20
"""What `-b/--gather` and `--json` keep of each stream of each node: its first 1 MiB; what came
after is counted (`stdout_dropped`, `stderr_dropped`) and said, not kept."""


@dataclass(frozen=True)
class NodeOutput:
    """One node's answer: what the command printed and its exit code, or why it has none."""

    node: str
    exit_code: int
    stdout: str
    stderr: str
    error: str | None = None
    """Why the command has no exit code of its own (unreachable, timed out, killed); None when it has."""
    hint: str | None = None
    elapsed_ms: float | None = None
    dropped: tuple[int, int] = (0, 0)
    """Bytes of stdout and of stderr past `KEPT_BYTES`: printed by the command, not kept."""

    @property
    def key(self) -> tuple[str, str, int, str | None, tuple[int, int]]:
        """What makes two nodes' answers the same (dshbak -c): output, exit code, error."""
        return (self.stdout, self.stderr, self.exit_code, self.error, self.dropped)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": self.error,
            "hint": self.hint,
            "elapsed_ms": None if self.elapsed_ms is None else round(self.elapsed_ms, 1),
            "stdout_dropped": self.dropped[0],
            "stderr_dropped": self.dropped[1],
        }


@dataclass(frozen=True)
class Group:
    """Nodes that answered exactly alike, in inventory order."""

    nodes: tuple[str, ...]
    answer: NodeOutput
    """The first node's answer (the others' are the same)."""


@dataclass(frozen=True)
class ExecReport:
    """Every selected node's answer to one command, in inventory order."""

    command: tuple[str, ...]
    shell: bool
    """True when the command was one line for the login shell, False for an argv."""
    nodes: tuple[NodeOutput, ...]

    @property
    def exit_code(self) -> int:
        """The worst node's exit code: the largest (255 unreachable, 124 timed out, else the command's)."""
        return max((n.exit_code for n in self.nodes), default=0)

    def groups(self) -> list[Group]:
        """Nodes with identical stdout, stderr, exit code and error together, ordered by their first node."""
        by_key: dict[tuple[str, str, int, str | None, tuple[int, int]], list[NodeOutput]] = {}
        for n in self.nodes:
            by_key.setdefault(n.key, []).append(n)
        return [Group(tuple(n.node for n in members), members[0]) for members in by_key.values()]

    def failed(self) -> list[NodeOutput]:
        return [n for n in self.nodes if n.exit_code != 0]

    def to_json(self) -> dict[str, Any]:
        return {
            "command": list(self.command),
            "shell": self.shell,
            "exit_code": self.exit_code,
            "nodes": [n.to_json() for n in self.nodes],
        }


def node_output(
    node: str, answer: Result | BaseException, timeout: float | None = None, box: bool = False
) -> NodeOutput:
    """A transport's Result, or the exception it raised, as a node's answer with an exit code.
    With `timeout`, a 124 (or timeout(1)'s 137 after its SIGKILL) that came no sooner than the
    timeout is the node's timeout(1) stopping the command, said in `error`. With `box` (`--container`)
    a 124 is `node/execbox.py`'s, said once the command's processes in the container were gone."""
    if isinstance(answer, Result):
        code = answer.exit_code
        if box and timeout is not None and code == TIMED_OUT and answer.elapsed_ms >= timeout * 1000:
            return NodeOutput(
                node,
                TIMED_OUT,
                answer.stdout,
                answer.stderr,
                f"timed out after {timeout:g} s: the command's processes in the container were stopped",
                elapsed_ms=answer.elapsed_ms,
            )
        if not box and timeout is not None and code in (TIMED_OUT, 128 + 9) and answer.elapsed_ms >= timeout * 1000:
            how = "SIGTERM" if code == TIMED_OUT else f"SIGKILL, {KILL_AFTER_S} s after SIGTERM"
            return NodeOutput(
                node,
                TIMED_OUT,
                answer.stdout,
                answer.stderr,
                f"timed out after {timeout:g} s: its process group on the node was stopped ({how})",
                elapsed_ms=answer.elapsed_ms,
            )
        if code >= 0:
            return NodeOutput(node, code, answer.stdout, answer.stderr, elapsed_ms=answer.elapsed_ms)
        if code == -1:  # SSH: the channel closed without an exit-status (an exit-signal instead)
            error = "ended without an exit status (killed by a signal?)"
            return NodeOutput(node, UNREACHABLE, answer.stdout, answer.stderr, error, elapsed_ms=answer.elapsed_ms)
        # a local process killed by signal N: the 128 + N a shell reports
        return NodeOutput(
            node, 128 - code, answer.stdout, answer.stderr, f"killed by signal {-code}", elapsed_ms=answer.elapsed_ms
        )
    if isinstance(answer, TransportError):
        message = answer.message.removeprefix(f"{node}: ")
        if answer.kind == "timeout" and timeout is not None:  # the controller's backstop, not the node's timeout(1)
            return NodeOutput(
                node,
                TIMED_OUT,
                "",
                "",
                f"timed out after {timeout:g} s, and the node did not answer "
                f"{BOX_SLACK_S if box else KILL_AFTER_S + SLACK_S:g} s later: the session was closed, the command "
                "may still run there",
                "look on the node: orch exec --nodes NODE -- 'ps -eo pid,pgid,etime,args'",
            )
        code = TIMED_OUT if answer.kind == "timeout" else UNREACHABLE
        return NodeOutput(node, code, "", "", message, answer.hint)
    return NodeOutput(node, UNREACHABLE, "", "", f"{type(answer).__name__}: {answer}")


OnLine = Callable[[str, str, str], None]
"""on_line(node, stream, line): one whole line of a node's output (`out` or `err`, without its
newline) as soon as it is complete; a last line without a newline comes when the command ends.
Called from the node's thread: one node's lines in order, nodes interleaved as they arrive."""


class LineSplitter:
    """Bytes of one node's two streams as they arrive -> whole lines to `on_line` (UTF-8, bad
    bytes replaced); `finish()` hands over what is left without a newline. Linear in what arrives,
    and at most `LONG_LINE` bytes (plus one piece) held per stream: a longer line is handed on in
    pieces, each but the last marked with `LONG_LINE_MARK`."""

    def __init__(self, node: str, on_line: OnLine) -> None:
        self.node, self.on_line = node, on_line
        self.pending = {"out": bytearray(), "err": bytearray()}

    def feed(self, stream: str, data: bytes) -> None:
        pending, start = self.pending[stream], 0
        while (end := data.find(b"\n", start)) >= 0:
            if pending:
                pending += data[start:end]
                self._say(stream, bytes(pending))
                pending.clear()
            else:
                self._say(stream, data[start:end])
            start = end + 1
        pending += data[start:]
        while len(pending) >= LONG_LINE:
            self._say(stream, bytes(pending[:LONG_LINE]), LONG_LINE_MARK)
            del pending[:LONG_LINE]

    def _say(self, stream: str, line: bytes, mark: str = "") -> None:
        self.on_line(self.node, stream, line.decode("utf-8", "replace") + mark)

    def finish(self) -> None:
        for stream, rest in self.pending.items():
            if rest:
                self._say(stream, bytes(rest))
        self.pending = {"out": bytearray(), "err": bytearray()}


class Kept:
    """One node's output as `-b/--gather` and `--json` keep it: the first `limit` bytes of each
    stream, and how many more came."""

    def __init__(self, limit: int = KEPT_BYTES) -> None:
        self.limit = limit
        self.data = {"out": bytearray(), "err": bytearray()}
        self.dropped = {"out": 0, "err": 0}

    def feed(self, stream: str, data: bytes) -> None:
        buf = self.data[stream]
        room = max(0, self.limit - len(buf))
        if room:
            buf += data[:room]
        self.dropped[stream] += max(0, len(data) - room)

    def text(self, stream: str) -> str:
        return self.data[stream].decode("utf-8", "replace")


def with_env(command: Sequence[str], env: Mapping[str, str] | None) -> tuple[str, ...]:
    """The command with `--env` variables set for it: an argv becomes `env -- K=V ... argv`
    (quoted by the transport), a shell line gets `export K=V ...;` in front (values quoted)."""
    if not env:
        return tuple(command)
    if len(command) == 1:
        return ("export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "; " + command[0],)
    return ("env", "--", *(f"{k}={v}" for k, v in env.items()), *command)


def run_everywhere(
    inv: Inventory,
    nodes: Sequence[Node],
    command: Sequence[str],
    *,
    timeout: float | None = None,
    progress: Progress | None = None,
    on_line: OnLine | None = None,
    env: Mapping[str, str] | None = None,
    box: BoxExec | None = None,
) -> ExecReport:
    """Run `command` on every node of `nodes` in parallel (at most `inv.fanout` at once) and collect
    every answer; never raises for a node. One word is a login-shell line, several an argv.
    `on_line`: each output line as it arrives (pdsh's live `node: line`), instead of in the report;
    without it the report keeps the first `KEPT_BYTES` of each node's stdout and stderr. Memory does
    not grow with the output either way.
    `env`: variables set for the command (`--env`; the login environment stays under them).
    `box`: run it in the run's container on each node (`--container`; no `env`).
    Ctrl-C (KeyboardInterrupt) closes every connection before it propagates."""
    if box is not None and env:
        raise ValueError("--env with --container")
    if not command:
        raise ValueError("empty command")
    shell = len(command) == 1
    sent = with_env(command, env)
    kept: dict[str, Kept] = {}

    def one(t: Transport) -> Result:
        # the output streams on as it comes: to `on_line` a line at a time, else the first
        # KEPT_BYTES of each stream kept; the transport itself keeps none of it
        splitter = LineSplitter(t.node.name, on_line) if on_line is not None else None
        keep = kept[t.node.name] = Kept()
        feed = splitter.feed if splitter is not None else keep.feed
        try:
            python = None if t.close_stops_commands else t.node.python  # closing the connection stops it there
            if box is not None:
                res = t.run_shell(
                    box_line(box, t.node, command, timeout, python is not None),
                    timeout=None if timeout is None else timeout + BOX_SLACK_S,
                    on_output=feed,
                    keep=False,
                )
            elif timeout is not None:
                res = t.run_shell(
                    timed_line(sent, shell, timeout, python),
                    timeout=timeout + KILL_AFTER_S + SLACK_S,
                    on_output=feed,
                    keep=False,
                )
            else:
                res = t.run_shell(command_line(sent, shell, python), on_output=feed, keep=False)
            return Result(res.node, tuple(command), res.exit_code, keep.text("out"), keep.text("err"), res.elapsed_ms)
        finally:
            if splitter is not None:
                splitter.finish()

    with Cluster(inv) as cluster:
        answers = cluster.fan_out(one, nodes, progress=progress, label="running", interruptible=True)
    outputs = []
    for n in nodes:
        out = node_output(n.name, answers[n.name], timeout, box is not None)
        if n.name in kept and isinstance(answers[n.name], Result):
            out = replace(out, dropped=(kept[n.name].dropped["out"], kept[n.name].dropped["err"]))
        outputs.append(out)
    return ExecReport(tuple(command), shell, tuple(outputs))
