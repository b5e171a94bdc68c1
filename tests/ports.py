"""Ports for the tests' jobs, with no race against the rest of the machine.

A job's master port (torchrun's TCPStore, orch's preflight bind of 0.0.0.0:port) must not come from
the kernel's ephemeral range: every outgoing connection on this machine (the tests' SSH sessions,
gloo, chronyd, the other pytest worker's jobs) takes its local port from that range, and one that
lands on the chosen port makes the port check fail (`master port 45237 is taken`) or torchrun's
bind fail. So `job_port()` hands out ports from below the ephemeral range, each pytest-xdist worker
from a slice of its own, never the same one twice in a process (no TIME_WAIT left by the previous
test), and only a port that binds on 0.0.0.0 right now.

`free_port()` is for daemons a test starts itself and then waits on (sshd, chronyd, a probe): any
free port will do there, since what holds it is known at once."""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

_CEILING = 32000
"""The highest port handed out when the ephemeral range starts above it (Linux's default starts at
32768; /proc/sys/net/ipv4/ip_local_port_range says)."""
_SPAN = 12000
"""How many ports below the ceiling are shared out between the workers."""


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    """A port the kernel says is free on host right now (for a daemon the test starts and waits on)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_slice(worker: str | None, workers: str | None, low_ephemeral: int) -> range:
    """The ports one pytest-xdist worker hands out: its share of the span below the ephemeral range
    (worker "gw1" of 2 gets the upper half); the whole span when not under xdist."""
    high = min(_CEILING, low_ephemeral - 1)
    low = max(1024, high - _SPAN)
    count = max(1, int(workers or 1))
    index = int(worker[2:]) if worker and worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (high - low) // count
    start = low + (index % count) * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _ports() -> Iterator[int]:
    ports = worker_slice(
        os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT"), ephemeral_low()
    )
    # a start of its own per process: two pytest runs at once on one machine rarely meet
    first = os.getpid() % len(ports)
    return itertools.cycle([*ports[first:], *ports[:first]])


_next: Iterator[int] | None = None
_lock = threading.Lock()
"""Tests start jobs from threads (`trainer_helpers.run_trainers`): two first calls at once each
built their own cycle, from the same start, and handed out the same port to two jobs."""


def job_port() -> int:
    """A master/rendezvous port for a job: below the ephemeral range, this worker's, not handed out
    before by this process, and free on 0.0.0.0 now. Safe to call from several threads."""
    global _next
    with _lock:
        if _next is None:
            _next = _ports()
        for _ in range(2000):
            port = next(_next)
            if _bindable(port):
                return port
    raise RuntimeError("no free port in this worker's slice below the ephemeral range")
