"""The tests' job ports stay clear of the kernel's ephemeral range and of the other pytest worker.

A CI run failed on this: a job's master port came from the ephemeral range, an outgoing connection
elsewhere on the machine took it as its local port, and `orch up`'s preflight (rightly) said
`master port 45237 is taken`."""

from __future__ import annotations

import socket

import pytest

from tests.ports import ephemeral_low, job_port, worker_slice


def test_each_worker_has_a_slice_of_its_own_below_the_ephemeral_range() -> None:
    a, b = worker_slice("gw0", "2", 32768), worker_slice("gw1", "2", 32768)
    assert not set(a) & set(b)
    assert max(b) < 32768 and min(a) >= 1024 and len(a) > 1000
    alone = worker_slice(None, None, 32768)
    assert set(a) | set(b) <= set(alone)
    # a kernel whose ephemeral range starts low: the slices follow it down
    low = worker_slice("gw0", "1", 15000)
    assert max(low) < 15000


def test_job_ports_are_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    ports = [job_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert max(ports) < ephemeral_low()


def test_a_port_someone_holds_is_passed_over() -> None:
    first = job_port()
    # hold the next ones on 0.0.0.0, as torchrun's store would: job_port must step past them
    held = []
    try:
        for port in range(first + 1, first + 4):
            s = socket.socket()
            s.bind(("0.0.0.0", port))
            held.append(s)
        after = job_port()
        assert after == first + 4 or after < first  # the next free one, or the slice wrapped around
    finally:
        for s in held:
            s.close()


def test_first_calls_from_several_threads_at_once_hand_out_different_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer tests start two jobs from two threads: their first job_port calls at once each
    built a cycle of their own from the same start and got the same port (one job then failed with
    EADDRINUSE, or two jobs met on one store)."""
    import threading

    from tests import ports

    for _ in range(5):
        monkeypatch.setattr(ports, "_next", None)
        start = threading.Barrier(8)
        got: list[int] = []

        def take(start: threading.Barrier, got: list[int]) -> None:
            start.wait(timeout=30)
            got.append(ports.job_port())

        threads = [threading.Thread(target=take, args=(start, got)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert len(got) == 8 and len(set(got)) == 8, sorted(got)
