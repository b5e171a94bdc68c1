"""The supervision state machine, driven by scripted observations (like torch elastic's TestAgent)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.contract import NodeState, RunState
from orchestrator.errors import TransportError
from orchestrator.run.agents import NodeStatus, StopResult
from orchestrator.run.supervise import (
    Failure,
    NodeSpec,
    Poller,
    Pushed,
    Silent,
    Supervisor,
    Unanswered,
    log_text,
    root_cause,
    run_state,
    select_excerpt,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPECS = [NodeSpec("n1", 0, 0, 2), NodeSpec("n2", 1, 2, 2), NodeSpec("n3", 2, 4, 2)]


def ok(state: str = "running", polled: bool = False, **kw: Any) -> NodeStatus:
    """A node's status as its agent reports it; `polled` marks an answer to a status poll."""
    fields: dict[str, Any] = {
        "agent_alive": state == "running",
        "job_alive": state == "running",
        "exit_code": 0 if state == "succeeded" else None,
        "reason": "polled" if polled else None,
        **kw,
    }
    return NodeStatus(NodeState(state), **fields)


class Clock:
    """A fake monotonic clock that the fake sleep advances."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def supervisor(
    rounds: list[Mapping[str, Any]], *, grace: float = 10.0, excerpt: Any = None, clock: Clock | None = None
) -> tuple[Supervisor, list[int]]:
    stops: list[int] = []
    it = iter(rounds)
    clock = clock or Clock()

    def observe() -> Mapping[str, Any]:
        item = next(it)
        if isinstance(item, BaseException):
            raise item
        return item

    def stop_all() -> dict[str, Any]:
        stops.append(1)
        return {s.name: StopResult(None) for s in SPECS}

    sup = Supervisor(
        SPECS,
        observe=observe,
        stop_all=stop_all,
        excerpt=excerpt,
        interval=1.0,
        unreachable_grace=grace,
        clock=clock,
        sleep=clock.sleep,
    )
    return sup, stops


def test_success_when_every_node_succeeds_without_teardown() -> None:
    sup, stops = supervisor(
        [
            {"n1": ok(), "n2": ok(), "n3": ok()},
            {"n1": ok("succeeded"), "n2": ok(), "n3": ok("succeeded")},
            {"n1": ok("succeeded"), "n2": ok("succeeded"), "n3": ok("succeeded")},
        ]
    )
    out = sup.run()
    assert out.state == "succeeded" and out.failure is None
    assert out.wall_s == pytest.approx(2.0)
    assert stops == []


def test_first_failure_stops_everything_once_and_names_the_node() -> None:
    lines = (FIXTURES / "torchrun_tee3_2proc_exit3_stderr_torch2.14.txt").read_text().splitlines()
    raw = [f"2026-11-30T09:32:05.{i:06d}Z err {t}" for i, t in enumerate(lines)]
    sup, stops = supervisor(
        [
            {"n1": ok(), "n2": ok(), "n3": ok()},
            {"n1": ok(), "n2": ok("failed", exit_code=1, finished_at=50.0), "n3": ok()},
        ],
        excerpt=lambda node: raw if node == "n2" else [],
    )
    out = sup.run()
    assert out.state == "failed" and stops == [1]
    f = out.failure
    assert f is not None and (f.node, f.node_rank, f.exit_code) == ("n2", 1, 1)
    assert f.rank == 1 and f.local_rank == 1  # from torchrun's Root Cause block
    assert not any("Root Cause (first observed failure):" in x for x in f.excerpt)  # in the log, not the excerpt
    assert any("failed (exitcode: 3) local_rank: 1" in x for x in f.excerpt)
    assert all(not x.startswith("2026-") for x in f.excerpt)  # timestamps and streams stripped


def test_earliest_failure_wins_when_several_nodes_fail_in_one_round() -> None:
    sup, _ = supervisor(
        [
            {
                "n1": ok("failed", exit_code=1, finished_at=20.5),
                "n2": ok("failed", exit_code=-9, signal="SIGKILL", finished_at=20.1),
                "n3": ok("failed", exit_code=1, finished_at=20.3),
            }
        ]
    )
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n2"
    assert "code -9 (SIGKILL)" in out.failure.reason


def test_the_first_failure_is_the_first_rank_torchrun_saw_fail_not_the_first_torchrun_to_exit() -> None:
    # n3's rank failed first (torchrun logged it at 20.0) but its torchrun took 0.9 s to exit; n1's
    # rank died of n3's (gloo: connection closed by peer) at 20.6 and its torchrun exited at 20.8
    rounds = [
        {
            "n1": ok("failed", exit_code=1, failed_at=20.6, finished_at=20.8),
            "n2": ok(),
            "n3": ok("failed", exit_code=1, failed_at=20.0, finished_at=20.9),
        }
    ]
    sup, _ = supervisor(list(rounds))
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n3" and out.failure.order == 20.0
    # a node that says nothing of its ranks (torchrun killed, an older agent) is ordered by its exit
    rounds = [
        {
            "n1": ok("failed", exit_code=-9, signal="SIGKILL", finished_at=19.9),
            "n2": ok(),
            "n3": ok("failed", exit_code=1, failed_at=20.0, finished_at=20.9),
        }
    ]
    sup, _ = supervisor(list(rounds))
    assert sup.run().failure.node == "n1"  # type: ignore[union-attr]


def test_unreachable_longer_than_grace_fails_but_a_blip_does_not() -> None:
    down = ConnectionError("no route")
    rounds: list[Mapping[str, Any]] = [{"n1": ok(), "n2": ok(), "n3": ok()}]
    rounds += [{"n1": ok(), "n2": down, "n3": ok()}] * 3  # 3 s: a blip
    rounds += [{"n1": ok(), "n2": ok(), "n3": ok()}]
    rounds += [{"n1": ok(), "n2": down, "n3": ok()}] * 12
    sup, stops = supervisor(rounds, grace=5.0)
    out = sup.run()
    assert out.state == "failed" and out.failure is not None
    assert out.failure.node == "n2" and "unreachable for 5 s" in out.failure.reason
    assert out.wall_s == pytest.approx(5 + 5)  # unreachable again from t=5, failed at t=10
    assert stops == [1]


@pytest.mark.parametrize("silent", [False, True], ids=["asked", "silent-stream"])
def test_a_node_whose_allocation_has_ended_fails_at_once(silent: bool) -> None:
    """Slurm ended the allocation (a time limit, scancel, a requeue): srun says so, and nothing can
    run there any more; no unreachable grace is waited out for it."""
    gone: Exception = TransportError("n2", "gone", "the allocation has ended (srun: Slurm job 1 has expired)")
    if silent:
        gone = Silent(gone, 100.0)
    sup, stops = supervisor([{"n1": ok(), "n2": ok(), "n3": ok()}] + [{"n1": ok(), "n2": gone, "n3": ok()}] * 12)
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n2", out
    assert out.failure.reason == "n2: the allocation has ended (srun: Slurm job 1 has expired)"
    assert out.wall_s == pytest.approx(1.0) and stops == [1]


def test_an_unanswered_poll_counts_from_when_it_began() -> None:
    clock = Clock()
    since = clock.t - 9.5
    sup, _ = supervisor([{"n1": ok(), "n2": Unanswered(9.5, since), "n3": ok()}] * 3, grace=10.0, clock=clock)
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n2" and out.wall_s == pytest.approx(1.0)


def test_vanished_agent_is_a_failure() -> None:
    sup, _ = supervisor(
        [{"n1": ok(), "n2": ok(), "n3": NodeStatus(NodeState.RUNNING, agent_alive=False, job_alive=True, agent_pid=42)}]
    )
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n3"
    assert "agent (pid 42) disappeared" in out.failure.reason and "still running" in out.failure.reason


def test_interrupt_tears_down_then_propagates() -> None:
    sup, stops = supervisor([{"n1": ok(), "n2": ok(), "n3": ok()}, KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        sup.run()
    assert stops == [1] and sup.teardown_s is not None


def test_teardown_reports_nodes_it_could_not_stop() -> None:
    sup = Supervisor(
        SPECS,
        observe=lambda: {"n1": ok("failed", exit_code=2)},
        stop_all=lambda: {
            "n1": StopResult(None),
            "n2": TimeoutError("unreachable"),
            "n3": StopResult(None, remaining=(77,)),
        },
        sleep=lambda s: None,
    )
    out = sup.run()
    assert set(out.not_stopped) == {"n2", "n3"} and "77" in out.not_stopped["n3"]


def test_excerpt_keeps_the_failing_workers_exception_far_above_the_end() -> None:
    worker = [f'[default1]:  File "job.py", line {i}' for i in range(5)] + [
        "[default1]:RuntimeError: injected failure on rank 5 at step 3"
    ]
    noise = [f"[default0]:[rank 4] step {i}" for i in range(30)]
    torchrun_tb = [f"  torchrun frame {i}" for i in range(30)]
    block = [
        "============================================================",
        "job.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-30_10:02:37",
        "  host      : node3",
        "  rank      : 5 (local_rank: 1)",
        "  exitcode  : 1 (pid: 6482)",
        "  error_file: /tmp/x/error.json",
        "  traceback : Traceback (most recent call last):",
        "  RuntimeError: injected failure on rank 5 at step 3",
        "============================================================",
    ]
    lines, rank, local = select_excerpt(worker + noise + torchrun_tb + block)
    assert (rank, local) == (5, 1)
    assert "[default1]:RuntimeError: injected failure on rank 5 at step 3" in lines
    assert "…" in lines
    assert lines[-1] == "  torchrun frame 29" and not set(block) & set(lines)  # the summary: in the log only


def test_excerpt_keeps_the_failing_workers_lines_under_any_torchrun_role() -> None:
    """`--role trainer` in job.torchrun_args: torchrun's prefix is `[trainer1]:`, and the blamed
    worker's exception, 60 lines above the end, is in the excerpt as it is under the role `default`
    (the excerpt used to look for `[default1]:` only and dropped it)."""
    worker = ["[trainer1]:Traceback (most recent call last):"]
    worker += [f'[trainer1]:  File "job.py", line {i}' for i in range(5)]
    worker += ["[trainer1]:RuntimeError: injected failure on rank 5 at step 3"]
    noise = [f"[trainer0]:[rank 4] step {i}" for i in range(30)]
    torchrun_tb = [f"  torchrun frame {i}" for i in range(30)]
    summary = [
        "============================================================",
        "job.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-30_10:02:37",
        "  host      : node3",
        "  rank      : 5 (local_rank: 1)",
        "  exitcode  : 1 (pid: 6482)",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]
    raw = [f"2026-11-30T10:02:36.{i:06d}Z err {t}" for i, t in enumerate(worker + noise + torchrun_tb + summary)]
    lines, rank, local = select_excerpt(raw)
    assert (rank, local) == (5, 1)
    assert "[trainer1]:RuntimeError: injected failure on rank 5 at step 3" in lines, lines
    assert lines.index("[trainer1]:RuntimeError: injected failure on rank 5 at step 3") < lines.index("…")
    assert select_excerpt(raw, worker=1)[0] == lines  # the worker a lost peer's blame names: the same lines
    f = Failure("node3", 1, "exited with code 1", 1)
    f.explain(raw)
    assert f.cause == "RuntimeError: injected failure on rank 5 at step 3" and (f.rank, f.local_rank) == (5, 1)
    assert "[trainer1]:RuntimeError: injected failure on rank 5 at step 3" in f.excerpt


def test_excerpt_without_root_cause_is_the_last_20_lines() -> None:
    raw = [f"2026-11-30T09:32:05.000000Z out line {i}" for i in range(50)]
    lines, rank, local = select_excerpt(raw)
    assert lines == [f"line {i}" for i in range(30, 50)] and rank is None and local is None


def test_root_cause_parses_real_torchrun_summaries() -> None:
    texts = (FIXTURES / "torchrun_tee3_2proc_exit3_stderr_torch2.14.txt").read_text().splitlines()
    first, last, rank, local = root_cause(texts) or (0, 0, -1, -1)
    assert (rank, local) == (1, 1)
    assert "Root Cause" in texts[first + 1] and texts[last].startswith("====")
    assert root_cause(["nothing", "here"]) is None


def test_log_text_strips_stamp_and_stream_only_from_node_log_lines() -> None:
    assert log_text("2026-11-30T09:32:05.123456Z out [default1]:x y") == "[default1]:x y"
    assert log_text("plain text line") == "plain text line"


@pytest.mark.parametrize(
    "states, recorded, expected",
    [
        (["succeeded", "succeeded"], "running", "succeeded"),
        (["failed", "stopped"], "running", "failed"),
        (["running", "succeeded"], "starting", "running"),
        (["stopped", "stopped"], "running", "stopped"),
        (["unreachable", "running"], "running", "running"),
        (["stopped", "stopped"], "failed", "failed"),  # final states stick
    ],
)
def test_run_state(states: list[str], recorded: str, expected: str) -> None:
    assert run_state(states, recorded) == expected


def test_poller_keeps_a_slow_node_from_hiding_the_others() -> None:
    release = threading.Event()

    def poll(name: str) -> dict[str, Any]:
        if name == "slow":
            release.wait(5)
        return ok()

    p = Poller(["fast", "slow"], poll, interval=0.05, stale_after=0.2).start()
    try:
        # the slow node's call outlives stale_after while the fast one keeps answering
        wait_until(lambda: isinstance(p.observe().get("slow"), Unanswered) and p.observe().get("fast") == ok())
        obs = p.observe()
        assert obs["fast"] == ok()
        assert isinstance(obs["slow"], Unanswered)
    finally:
        release.set()
        p.close()


def test_a_fresh_look_orders_failures_the_round_saw_at_different_moments() -> None:
    confirm_calls: list[int] = []

    def confirm(names: Any) -> dict[str, Any]:
        assert sorted(names) == ["n2", "n3"]
        confirm_calls.append(1)
        return {
            "n1": ok("failed", exit_code=1, finished_at=20.5),
            "n2": ok("failed", exit_code=-9, signal="SIGKILL", finished_at=20.1),
            "n3": ok(),
        }

    sup = Supervisor(
        SPECS,
        observe=lambda: {"n1": ok("failed", exit_code=1, finished_at=20.5), "n2": ok(), "n3": ok()},
        stop_all=lambda: {},
        confirm=confirm,
        sleep=lambda s: None,
    )
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n2" and confirm_calls == [1]


# ----------------------------------------------------------------------------- pushed statuses


class Polls:
    """A poll_one that records who was asked; `answer` decides what each node says."""

    def __init__(self, answer: Any = None) -> None:
        self.asked: list[str] = []
        self.answer = answer or (lambda name: ok(polled=True))

    def __call__(self, name: str) -> NodeStatus:
        self.asked.append(name)
        result = self.answer(name)
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]


def wait_until(pred: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


NAMES = ("n1", "n2", "n3")


class Watched(Pushed):
    """Pushed, with every look its poller threads take recorded: which node, and whether it was
    judged silent (then it is polled). "Not polled" then means "looked at, after this point, and
    found not silent", not "no poll happened to run yet"."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.looks: list[tuple[int, str, bool]] = []
        self.looks_lock = threading.Lock()
        self.seq = 0
        super().__init__(*args, **kw)

    def silent(self, name: str) -> bool:
        with self.looks_lock:
            self.seq += 1
            seq = self.seq
        answer = super().silent(name)
        with self.looks_lock:
            self.looks.append((seq, name, answer))
        return answer

    def mark(self) -> int:
        """A point in time: a look that starts after it was taken entirely after it."""
        with self.looks_lock:
            self.seq += 1
            return self.seq

    def looked(self, name: str, after: int) -> list[bool]:
        """The answers of the looks at `name` that started after the mark `after`."""
        with self.looks_lock:
            return [answer for seq, n, answer in self.looks if n == name and seq > after]

    def judged_quiet(self, names: Any = NAMES) -> None:
        """Wait until every node in `names` was looked at from now on, and require that each such
        look found it not silent (so none was polled for what the test just did)."""
        mark = self.mark()
        wait_until(lambda: all(self.looked(n, mark) for n in names))
        assert not any(a for n in names for a in self.looked(n, mark)), "a node was judged silent"


def pushed_for(polls: Polls, clock: Clock, **kw: Any) -> Watched:
    return Watched(
        ["n1", "n2", "n3"], polls, silent_after=3.0, interval=0.01, stale_after=5.0, clock=clock, **kw
    ).start()  # type: ignore[return-value]


def test_pushed_statuses_need_no_poll_and_a_pushed_failure_ends_the_run() -> None:
    clock, polls, stops = Clock(), Polls(), []
    pushed = pushed_for(polls, clock)
    for n in ("n1", "n2", "n3"):
        pushed.status(n, ok())
    rounds = iter(range(100))

    def sleep(s: float) -> None:  # every round: time passes, heartbeats come, n2 fails in round 5
        clock.sleep(s)
        for n in ("n1", "n2", "n3"):
            pushed.frame(n)
        if next(rounds) == 5:
            pushed.status("n2", ok("failed", exit_code=1, finished_at=50.0))
        pushed.judged_quiet()  # every poller thread looked at this round's silences before the next

    sup = Supervisor(
        SPECS, observe=pushed.observe, stop_all=lambda: stops.append(1) or {}, interval=1.0, clock=clock, sleep=sleep
    )
    try:
        out = sup.run()
    finally:
        pushed.close(wait=1.0)
    assert out.state == "failed" and out.failure is not None and out.failure.node == "n2"
    assert "exited with code 1" in out.failure.reason and out.wall_s == pytest.approx(6.0)
    assert stops == [1] and polls.asked == [] and pushed.polls == 0


def test_a_silent_stream_is_polled_until_its_node_is_heard_again() -> None:
    clock, polls = Clock(), Polls()
    pushed = pushed_for(polls, clock)
    try:
        for n in ("n1", "n2", "n3"):
            pushed.status(n, ok())
        clock.t += 2.5
        pushed.frame("n1")
        pushed.frame("n3")
        pushed.judged_quiet()  # n2 silent 2.5 s: looked at, and not polled
        assert polls.asked == [], "polled within the silence allowed"
        clock.t += 1.0  # n2: 3.5 s without a frame
        pushed.frame("n1")
        pushed.frame("n3")
        wait_until(lambda: len(polls.asked) >= 2)
        assert set(polls.asked) == {"n2"}
        obs = pushed.observe()
        assert obs["n2"] == ok(polled=True) and obs["n1"] == ok()
        pushed.status("n2", ok(pid=7))  # its stream is back
        mark = pushed.mark()
        wait_until(lambda: pushed.looked("n2", mark))  # n2's thread is past any poll begun before the status
        asked = len(polls.asked)
        pushed.judged_quiet(["n2"])
        pushed.judged_quiet(["n2"])
        assert len(polls.asked) == asked, "still polled once heard again"
        assert pushed.observe()["n2"] == ok(pid=7)
    finally:
        pushed.close(wait=1.0)


def test_a_silent_node_that_cannot_be_asked_is_unreachable_since_it_was_last_heard() -> None:
    clock = Clock()
    polls = Polls(lambda name: ConnectionError("connection refused"))
    pushed = pushed_for(polls, clock)
    for n in ("n1", "n2", "n3"):
        pushed.status(n, ok())
    heard = clock.t
    clock.t += 4.0
    pushed.frame("n1")
    pushed.frame("n3")
    wait_until(lambda: isinstance(pushed.observe()["n2"], Silent))  # asked, and its poll failed

    def sleep(s: float) -> None:
        clock.sleep(s)
        pushed.frame("n1")
        pushed.frame("n3")

    sup = Supervisor(
        SPECS,
        observe=pushed.observe,
        stop_all=lambda: {},
        interval=1.0,
        unreachable_grace=10.0,
        clock=clock,
        sleep=sleep,
    )
    try:
        obs = pushed.observe()["n2"]
        assert isinstance(obs, Silent) and obs.since == heard and "connection refused" in str(obs)
        out = sup.run()
    finally:
        pushed.close(wait=1.0)
    assert out.failure is not None and out.failure.node == "n2"
    assert "unreachable for 10 s: connection refused" in out.failure.reason
    assert clock.t == pytest.approx(heard + 10.0)  # 10 s after its last frame, not after the first failed poll
    assert set(polls.asked) == {"n2"}


def test_a_hung_poll_of_a_silent_node_is_no_answer_yet_until_no_answer_s() -> None:
    """A poll that reached its node and has not answered (a stalled NFS under run_root) is not a
    node down: the node is judged on its last word until `no_answer_s`, then it is unreachable
    since it was last heard."""
    clock, release = Clock(), threading.Event()
    pushed = pushed_for(Polls(lambda name: release.wait(5) and ok()), clock, no_answer_s=60.0)
    try:
        for n in ("n1", "n2", "n3"):
            pushed.status(n, ok())
        heard = clock.t
        clock.t += 3.5
        wait_until(lambda: pushed.polls >= 3)  # every node is silent now: each is asked, none answers
        assert pushed.observe()["n2"] == ok()  # asked just now: no verdict yet, the last word stands
        clock.t += 30.0  # past the grace, past stale_after: still no answer yet
        assert pushed.observe()["n2"] == ok()
        clock.t += 31.0
        obs = pushed.observe()["n2"]
        assert isinstance(obs, Unanswered) and obs.since == heard
    finally:
        release.set()
        pushed.close(wait=1.0)


def test_a_slow_disk_is_not_a_dead_node_the_run_goes_on() -> None:
    """Every stream silent and every poll answering only after 15 s (grace 10): the run is not
    failed; the late answers are the nodes' word, and the run ends when they say it did."""
    clock = Clock()
    answers = iter([ok()] * 3 + [ok("succeeded", exit_code=0)] * 3)
    lock = threading.Lock()

    def slow(name: str) -> NodeStatus:
        deadline = clock.t + 15.0
        while clock.t < deadline:
            time.sleep(0.001)
        with lock:
            return next(answers)

    pushed = pushed_for(Polls(slow), clock)

    def sleep(s: float) -> None:
        clock.sleep(s)
        time.sleep(0.01)  # the pollers run meanwhile: about 10 ms of this machine's time per fake second

    sup = Supervisor(
        SPECS,
        observe=pushed.observe,
        stop_all=lambda: {},
        interval=1.0,
        unreachable_grace=10.0,
        clock=clock,
        sleep=sleep,
    )
    try:
        out = sup.run()
    finally:
        pushed.close(wait=1.0)
    assert out.state == RunState.SUCCEEDED and out.failure is None, out.failure


def test_a_final_pushed_state_is_never_polled() -> None:
    clock, polls = Clock(), Polls()
    pushed = pushed_for(polls, clock)
    try:
        pushed.status("n1", ok("succeeded"))
        pushed.status("n2", ok("failed", exit_code=3))
        clock.t += 60.0  # both streams ended after their final word; n3 never said anything
        wait_until(lambda: "n3" in polls.asked)
        pushed.judged_quiet(["n1", "n2"])  # looked at 60 s after their last frame: final, not silent
        assert set(polls.asked) == {"n3"}
        wait_until(lambda: pushed.observe()["n3"] == ok(polled=True))
        obs = pushed.observe()
        assert obs["n1"] == ok("succeeded") and obs["n2"].exit_code == 3 and obs["n3"] == ok(polled=True)
    finally:
        pushed.close(wait=1.0)


def test_a_pushed_status_wakes_the_supervisor() -> None:
    pushed = Pushed(["n1"], Polls(), clock=time.monotonic)
    threading.Timer(0.1, pushed.status, args=("n1", ok())).start()
    started = time.monotonic()
    pushed.wait(120.0)
    assert time.monotonic() - started < 60.0  # woken by the status, long before the timeout


def test_a_stream_may_take_longer_for_its_first_frame_than_to_stay_heard() -> None:
    clock, polls = Clock(), Polls()
    pushed = pushed_for(polls, clock, first_frame_s=5.0)
    try:
        clock.t += 1.0
        pushed.status("n1", ok())  # n1's stream came up; n2 and n3 are still starting theirs
        clock.t += 3.5  # n1 silent 3.5 s since its last frame; n2, n3 unheard for 4.5 s
        wait_until(lambda: "n1" in polls.asked)
        pushed.judged_quiet(["n2", "n3"])  # 4.5 s without a first frame is within first_frame_s
        assert set(polls.asked) == {"n1"}
        pushed.status("n1", ok())
        pushed.frame("n2")
        clock.t += 1.0  # n3: 5.5 s and still no frame
        wait_until(lambda: "n3" in polls.asked)
        pushed.judged_quiet(["n2"])
        assert set(polls.asked) == {"n1", "n3"}
    finally:
        pushed.close(wait=1.0)


def test_failures_are_ordered_on_the_reference_clock_not_each_nodes_own() -> None:
    # n1's clock runs 5 s ahead: its 100.0 is 95.0 on the reference clock, before n2's 98.0
    rounds = [
        {
            "n1": ok("failed", exit_code=1, finished_at=100.0),
            "n2": ok("failed", exit_code=1, finished_at=98.0),
            "n3": ok(),
        }
    ]
    sup, _ = supervisor(list(rounds))
    assert sup.run().failure.node == "n2"  # type: ignore[union-attr]  # uncorrected: n2's clock reads earlier
    sup, _ = supervisor(list(rounds))
    sup.offsets_s = {"n1": 5.0}
    out = sup.run()
    assert out.failure is not None and out.failure.node == "n1"
    assert out.failure.order == 95.0


def test_detached_failure_uses_the_offsets_too() -> None:
    from orchestrator.errors import OrchError
    from orchestrator.run import control
    from orchestrator.store import NodeRecord

    records = [
        NodeRecord("n1", node_rank=0, python="python3", remote_dir="/r"),
        NodeRecord("n2", node_rank=1, python="python3", remote_dir="/r"),
    ]
    statuses = {"n1": ok("failed", exit_code=1, finished_at=100.0), "n2": ok("failed", exit_code=2, finished_at=98.0)}

    class NoCluster:
        def __getitem__(self, name: str) -> Any:
            raise OrchError(f"{name}: not reachable in this test")

    first = control.detached_failure(NoCluster(), records, statuses, {"n1": 5.0})  # type: ignore[arg-type]
    assert first is not None and first["node"] == "n1"
    assert control.detached_failure(NoCluster(), records, statuses)["node"] == "n2"  # type: ignore[arg-type, index]


def test_a_success_whose_cleanup_timed_out_says_what_is_still_running(capsys: pytest.CaptureFixture[str]) -> None:
    """Every node succeeded, but n2's agent could not stop what the job left behind: the outcome
    (and what orch up prints) names it instead of calling the cluster clean."""
    from orchestrator.cli import render
    from orchestrator.up import UpOutcome

    sup, stops = supervisor(
        [
            {"n1": ok(), "n2": ok(), "n3": ok()},
            {"n1": ok("succeeded"), "n2": ok("succeeded", cleanup_left=(4242,)), "n3": ok("succeeded")},
        ]
    )
    out = sup.run()
    assert out.state == "succeeded" and stops == []
    assert out.not_stopped == {"n2": "the job's cleanup timed out: processes still running: [4242]"}
    render.up_outcome(UpOutcome("succeeded", run_id="r1", wall_s=1.0, not_stopped=dict(out.not_stopped)))
    said = " ".join(capsys.readouterr().err.split())  # as one line, however the console wrapped it
    assert "run r1 succeeded on every node" in said
    assert "n2: the job's cleanup timed out: processes still running: [4242] (run: orch down r1)" in said


def test_a_node_whose_agent_stopped_the_job_itself_keeps_the_agents_reason() -> None:
    """A lease that ran out (the controller unheard from) was reported as "stopped from outside
    this `orch up` (orch down?)": the agent's own reason, in state.json, is the one to give."""
    lease = "the controller (orch up) was not heard from for 181 s (lease 180 s): stopping the job"
    f = Supervisor.node_failure(SPECS[1], NodeStatus(NodeState.STOPPED, exit_code=-15, reason=lease, finished_at=5.0))
    assert f is not None and f.node == "n2" and f.reason == f"was stopped on its node: {lease}"
    outside = Supervisor.node_failure(SPECS[1], NodeStatus(NodeState.STOPPED, exit_code=-15, finished_at=5.0))
    assert outside is not None and outside.reason == "was stopped from outside this `orch up` (orch down?)"


def test_a_full_run_root_is_said_once_per_node_and_names_the_cause_of_a_lost_agent() -> None:
    """A node whose run root is full goes on running: the user is told once (`node n1: run_root
    /... is full`), and should its agent then disappear, the failure says why."""
    full = "run_root /scratch/runs is full (No space left on device): the node's log and state are not all written"
    said: list[str] = []
    clock = Clock()
    rounds = iter(
        [
            {"n1": ok(disk_full=full), "n2": ok(), "n3": ok()},
            {"n1": ok(disk_full=full), "n2": ok(), "n3": ok()},
            {"n1": ok("running", agent_alive=False, job_alive=False, disk_full=full), "n2": ok(), "n3": ok()},
        ]
    )
    sup = Supervisor(
        SPECS,
        observe=lambda: next(rounds),
        stop_all=lambda: {},
        interval=1.0,
        clock=clock,
        sleep=clock.sleep,
        warn=said.append,
    )
    out = sup.run()
    assert said == [f"node n1: {full}"]
    assert out.failure is not None and out.failure.node == "n1"
    assert "disappeared (run_root /scratch/runs is full" in out.failure.reason, out.failure.reason
