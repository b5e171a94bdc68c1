"""How SSHTransport opens its one connection when several threads need it at once (the status
poll, the log stream and the teardown's stop all use a node's transport): one attempt at a time,
its outcome shared, and `close()` never held up by it. The connection is a stand-in whose opening
blocks until the test lets it go, so every interleaving here is forced, not timed."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator.config.nodes import Node, SSHOptions
from orchestrator.errors import TransportError
from orchestrator.transport.ssh import SSHTransport

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
    node = Node(name="node4", host="198.18.0.4", addr="198.18.0.4", gpus=0, nproc_per_node=1, python="python3",
                env={}, ssh=opts, index=3)
    t = SSHTransport(node)
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


def two_callers(t: SSHTransport, gate: Gate) -> tuple[threading.Thread, dict[str, Any], threading.Thread,
                                                        dict[str, Any]]:
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
