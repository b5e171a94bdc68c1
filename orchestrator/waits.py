"""Waits on the controller's main thread that Ctrl-C (and SIGTERM turned into KeyboardInterrupt)
always ends at once.

CPython runs a signal's Python handler on the main thread only, but the kernel hands a signal sent
to the process to any of its threads that does not block it. When it lands on a worker thread (a
node's command, a paramiko reader), the handler is due on the main thread, but a main thread
blocked in a lock with no timeout (`Thread.join()`, `Future.result()`, `Event.wait()`) is not
woken: it stays blocked until what it waits for ends on its own, which for `orch exec -- sleep
120` is two minutes after the Ctrl-C. Waiting in slices of `SLICE_S` lets the main thread run the
handler within one slice, whichever thread the kernel chose. tests/unit/test_waits.py holds this,
and that no controller module waits without a timeout."""

from __future__ import annotations

import concurrent.futures
import signal
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

SLICE_S = 0.2
"""The longest a pending Ctrl-C waits for the main thread to notice it."""


def join(thread: threading.Thread) -> None:
    """`thread.join()` that a signal ends within one slice."""
    while thread.is_alive():
        thread.join(SLICE_S)


def wait(event: threading.Event) -> None:
    """`event.wait()` that a signal ends within one slice."""
    while not event.wait(SLICE_S):
        pass


def result(future: concurrent.futures.Future[T]) -> T:
    """`future.result()` that a signal ends within one slice (the call's own exception is raised
    as it is: the slices wait on the future being done, never on a TimeoutError)."""
    while not future.done():
        concurrent.futures.wait([future], timeout=SLICE_S)
    return future.result()  # bounded: done


def results(futures: Iterable[concurrent.futures.Future[T]]) -> list[T]:
    """Each future's result, in order, waiting as `result` does."""
    return [result(f) for f in futures]


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM tears down what orch started like Ctrl-C does (a scheduler's kill, a CI timeout):
    it raises KeyboardInterrupt, so the `finally` that stops every node runs (`orch up`'s run,
    the fabric check's job, the preflight's probes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
