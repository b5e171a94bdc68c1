"""Ctrl-C at any moment of `orch logs --follow` ends it with 0, never with an internal error. A
full run caught one: the SIGINT arrived while a node's stream thread was being started, and the
Follower's cleanup joined that thread before it had started (RuntimeError: cannot join thread
before it is started). The interrupt is forced here at exactly that point."""

from __future__ import annotations

import queue
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.logs.follow import NodeStream


def test_an_interrupt_while_a_stream_starts_leaves_no_unstarted_thread_to_join(monkeypatch: pytest.MonkeyPatch) -> None:
    st = NodeStream(
        SimpleNamespace(node="a"),
        0,
        None,
        queue.Queue(),
        threading.Event(),  # type: ignore[arg-type]
        poll_s=0.2,
        on_event=lambda node, text: None,
    )

    def interrupted(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        st.start(None, None, None)  # type: ignore[arg-type]
    # the Follower's cleanup joins every stream's `thread`: an unstarted one would raise
    assert st.thread is None


def test_a_started_stream_is_joinable(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = threading.Event()
    st = NodeStream(
        SimpleNamespace(node="a"),
        0,
        None,
        queue.Queue(),
        threading.Event(),  # type: ignore[arg-type]
        poll_s=0.2,
        on_event=lambda node, text: None,
    )

    def body(*args: Any) -> None:
        ran.set()

    monkeypatch.setattr(st, "_run", body)
    thread = st.start(None, None, None)  # type: ignore[arg-type]
    assert st.thread is thread
    thread.join(10)
    assert ran.is_set() and not thread.is_alive()


def test_a_stream_whose_allocation_has_ended_is_followed_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    """srun's own words that the allocation has ended (a time limit, scancel, a requeue): nothing can
    be read there any more, so the stream ends at once instead of reconnecting until the run's end
    is waited out (seconds of every such run's teardown)."""
    from orchestrator.logs import follow
    from orchestrator.logs.fetch import ProtocolError
    from orchestrator.transport.slurm import srun_failure

    halt, said, starts = threading.Event(), [], []

    def start_reader(*a: Any, **kw: Any) -> Any:
        starts.append(1)
        if len(starts) > 3:  # the fault: it keeps reconnecting
            halt.set()
        raise ProtocolError("srun: error: Slurm job 4 has expired")

    monkeypatch.setattr(follow, "start_reader", start_reader)
    transport = SimpleNamespace(unreached=lambda code, text: srun_failure("sn1", code, text))
    st = NodeStream(
        SimpleNamespace(node="sn1"),
        0,
        transport,  # type: ignore[arg-type]
        queue.Queue(),
        halt,
        poll_s=0.2,
        on_event=lambda node, text: said.append(text),
    )
    st._stream(SimpleNamespace(offset=0, drop_partial=lambda: None), None)  # type: ignore[arg-type]
    assert starts == [1], said
    assert said == ["the allocation has ended (srun: Slurm job 4 has expired): its log is followed no further"]
