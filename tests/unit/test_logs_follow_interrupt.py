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
