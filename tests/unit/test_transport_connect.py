"""How SSHTransport opens its one connection when several threads need it at once (the status
poll, the log stream and the teardown's stop all use a node's transport): one attempt at a time,
its outcome shared, and `close()` never held up by it. The connection is a stand-in whose opening
blocks until the test lets it go, so every interleaving here is forced, not timed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.config.nodes import SSHOptions
from orchestrator.errors import TransportError
from orchestrator.transport.ssh import SSHTransport
from tests.node_support import ssh_node

DEADLINE_S = 10.0
"""Only ever reached when something is wrong: every wait below is on a condition."""


class FakeConn:
    def __init__(self) -> None:
        self.opened = False
        self.closed = False

    @property
    def is_connected(self) -> bool:
        return self.opened and not self.closed

    def close(self) -> None:
        self.closed = True


class Gate:
    """`_open` for the transport: counts attempts, blocks each until `release(error)`."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.go = threading.Event()
        self.error: BaseException | None = None
        self.only_first: BaseException | None = None
        """Raised by the first attempt only (an interrupt), whatever `error` says."""
        self.conns: list[FakeConn] = []

    def connection(self, host: str, for_gateway: bool = False) -> FakeConn:
        conn = FakeConn()
        self.conns.append(conn)
        return conn

    def open(self, conn: FakeConn) -> None:
        self.calls += 1
        self.entered.set()
        assert self.go.wait(DEADLINE_S), "the test never released the attempt"
        if self.only_first is not None and self.calls == 1:
            raise self.only_first
        if self.error is not None:
            raise self.error
        conn.opened = True

    def release(self, error: BaseException | None = None) -> None:
        self.error = error
        self.go.set()


def transport(gate: Gate) -> SSHTransport:
    opts = SSHOptions(user="root", port=22, connect_timeout=5, ssh_config=None)  # type: ignore[call-arg]
    t = SSHTransport(ssh_node("node4", "198.18.0.4", opts, index=3))
    t._connection = gate.connection  # type: ignore[method-assign]
    t._open = gate.open  # type: ignore[method-assign]
    return t


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th, out


def waiting_on(t: SSHTransport) -> int:
    """How many threads wait for the attempt in flight (its Event's waiters)."""
    attempt = t._attempt
    return 0 if attempt is None else len(attempt.done._cond._waiters)  # type: ignore[attr-defined]


def wait_until(cond: Any, what: str) -> None:
    """Wait for `cond` (the unit tier may not import tests/up_helpers.py's wait_for)."""
    ev = threading.Event()
    for _ in range(int(DEADLINE_S / 0.01)):
        if cond():
            return
        ev.wait(0.01)
    pytest.fail(f"timed out waiting for {what}")


def two_callers(
    t: SSHTransport, gate: Gate
) -> tuple[threading.Thread, dict[str, Any], threading.Thread, dict[str, Any]]:
    """A first connect() blocked in its attempt, and a second one waiting for that attempt."""
    first, a = in_thread(t.connect)
    assert gate.entered.wait(DEADLINE_S)
    second, b = in_thread(t.connect)
    wait_until(lambda: waiting_on(t) == 1, "the second caller to wait for the first attempt")
    return first, a, second, b


def test_a_node_that_does_not_answer_costs_the_callers_one_attempt_together() -> None:
    gate = Gate()
    t = transport(gate)
    first, a, second, b = two_callers(t, gate)
    gate.release(TimeoutError("timed out"))
    first.join(DEADLINE_S), second.join(DEADLINE_S)
    assert gate.calls == 1  # before: the second caller waited for the lock, then timed out on its own
    for out in (a, b):
        err = out["error"]
        assert isinstance(err, TransportError) and err.kind == "unreachable"
        assert err.message == "node4: timed out: root@198.18.0.4:22 did not answer within 5 s"


def test_a_shared_success_is_one_connection() -> None:
    gate = Gate()
    t = transport(gate)
    first, a, second, b = two_callers(t, gate)
    gate.release()
    first.join(DEADLINE_S), second.join(DEADLINE_S)
    assert gate.calls == 1 and len(gate.conns) == 1 and gate.conns[0].is_connected
    assert "error" not in a and "error" not in b and b["value"] == 0.0
    assert t._conn is gate.conns[0]


def test_close_does_not_wait_for_an_attempt_and_what_it_opens_is_not_kept() -> None:
    gate = Gate()
    t = transport(gate)
    connecting, out = in_thread(t.connect)
    assert gate.entered.wait(DEADLINE_S)
    closing, _ = in_thread(t.close)
    closing.join(DEADLINE_S)
    # before: close() took the lock the attempt held for its whole connect timeout
    assert not closing.is_alive() and connecting.is_alive()
    gate.release()
    connecting.join(DEADLINE_S)
    assert out["error"].message == "node4: the connection was closed as it opened"
    assert gate.conns[0].closed and t._conn is None
    # the transport is usable again after a close, as before
    gate.go.clear()
    again, out2 = in_thread(t.connect)
    assert gate.entered.wait(DEADLINE_S)
    gate.release()
    again.join(DEADLINE_S)
    assert "error" not in out2 and t._conn is gate.conns[1] and gate.conns[1].is_connected


def test_a_broken_channel_drops_its_own_connection_not_a_newer_one() -> None:
    gate = Gate()
    gate.release()
    t = transport(gate)
    t.connect()
    old = gate.conns[0]
    old.closed = True  # it broke; another thread has already opened a new one
    t.connect()
    new = gate.conns[1]
    t._drop(old)
    assert t._conn is new and not new.closed


def test_an_interrupted_attempt_lets_its_waiters_try_again() -> None:
    gate = Gate()
    t = transport(gate)
    first, a, second, b = two_callers(t, gate)
    gate.only_first = KeyboardInterrupt()
    gate.release()  # the first attempt ends by an interrupt, not an error the others could share
    first.join(DEADLINE_S), second.join(DEADLINE_S)
    assert isinstance(a["error"], KeyboardInterrupt)
    assert "error" not in b and gate.calls == 2 and t._conn is gate.conns[1]  # the waiter made its own attempt


# ----------------------------------------------------------------------------- a command's stdin


class FakeChannel:
    """A session channel whose command ends (exit 127, one stderr line) before it reads its stdin:
    the write fails as paramiko's does once the channel is closed, or, with `broken`, on a channel
    still open (the connection failing under the write). With `dies`, the connection dies under the
    write: paramiko closes the channel, with no EOF and no exit status."""

    def __init__(self, broken: bool = False, dies: bool = False) -> None:
        self.closed = False
        self.broken = broken
        self.dies = dies
        self.eof_received = False
        self.stderr = [b"sh: 1: /nonexistent/bin/python3: not found\n"]
        self.active = True

    def exec_command(self, line: str) -> None:
        if self.dies:
            self.closed, self.active, self.stderr = True, False, []
        elif not self.broken:  # the command exits at once: EOF, its status, the close
            self.eof_received = self.closed = True

    def sendall(self, data: bytes) -> None:
        if self.closed or self.broken:
            raise OSError("Socket is closed")

    def shutdown_write(self) -> None:
        pass

    def recv_ready(self) -> bool:
        return False

    def recv_stderr_ready(self) -> bool:
        return bool(self.stderr)

    def recv_stderr(self, n: int) -> bytes:
        return self.stderr.pop(0)

    def exit_status_ready(self) -> bool:
        return self.closed

    def recv_exit_status(self) -> int:
        return -1 if self.dies else 127

    def get_transport(self) -> Any:
        return self

    def is_active(self) -> bool:
        return self.active

    def close(self) -> None:
        self.closed = True


def exec_transport(chan: FakeChannel) -> tuple[SSHTransport, FakeConn]:
    gate = Gate()
    gate.release()
    t = transport(gate)
    t.connect()
    conn = gate.conns[0]
    t._channel = lambda: (conn, chan)  # type: ignore[method-assign]
    return t, conn


def test_a_command_that_exits_before_reading_its_stdin_gives_its_exit_status_and_stderr() -> None:
    t, conn = exec_transport(FakeChannel())
    r = t.run(["/nonexistent/bin/python3", "-m", "orchestrator.node.agent"], stdin=b"{}" * 100_000, timeout=5)
    assert (r.exit_code, r.stderr) == (127, "sh: 1: /nonexistent/bin/python3: not found\n")
    assert t._conn is conn and not conn.closed  # the connection is fine: kept


def test_a_write_that_fails_on_an_open_channel_is_the_connections_failure() -> None:
    t, conn = exec_transport(FakeChannel(broken=True))
    with pytest.raises(TransportError, match="Socket is closed"):
        t.run(["cat"], stdin=b"data", timeout=5)
    assert t._conn is None and conn.closed  # dropped: the next command opens a new one


def test_a_connection_that_dies_under_the_write_is_lost_not_an_exit_status() -> None:
    t, _conn = exec_transport(FakeChannel(dies=True))
    with pytest.raises(TransportError, match="connection lost while running a command"):
        t.run(["cat"], stdin=b"data", timeout=5)
