"""The straggler detector on synthetic windows: which rank, when, and why (run/straggler.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from orchestrator.run import straggler
from orchestrator.run.straggler import Detector, GpuLoad, NodeLoad, Window
from orchestrator.run.supervise import NodeSpec

NODES = {0: "n1", 1: "n2", 2: "n3", 3: "n4"}


def window(k: int, rank: int, compute: float = 1.0, data: float = 0.01, steps: int = 10, per_node: int = 1,
           at: float | None = None) -> Window:
    """Rank `rank`'s k-th window: `compute`/`data` seconds in all (10 steps), wall = the slowest's."""
    return Window(node=f"n{rank // per_node + 1}", rank=rank, local_rank=rank % per_node, epoch=1, batch=10 * k,
                  steps=steps, data_s=data, compute_s=compute, wall_s=5.0, at=1000.0 + 60 * k if at is None else at)


def feed(det: Detector, k: int, slow: Mapping[int, tuple[float, float]], ranks: int = 4,
         per_node: int = 1) -> list[straggler.Straggler]:
    found = []
    for r in range(ranks):
        compute, data = slow.get(r, (1.0, 0.01))
        found += det.window(window(k, r, compute, data, per_node=per_node))
    return found


def test_a_rank_slow_for_the_set_number_of_windows_is_named_once_with_the_compute_reason() -> None:
    det = Detector(share=0.8, windows=3, world_size=4)
    det.load(NodeLoad("n3", cpu_pct=100.0, rank_cpu_pct={2: 99.0}))
    assert feed(det, 1, {2: (2.2, 0.01)}) == []
    assert feed(det, 2, {2: (2.2, 0.01)}) == []
    found = feed(det, 3, {2: (2.2, 0.01)})
    assert [(s.rank, s.node, s.kind) for s in found] == [(2, "n3", "compute")]
    s = found[0]
    assert s.speed == pytest.approx(1.01 / 2.21, rel=1e-3) and s.windows == 3 and s.cpu_pct == 99.0
    assert s.since == 1055.0 and s.at == 1180.0  # from the start of its first slow window (wall 5 s)
    assert s.line() == ("straggler: rank 2 on n3 at 0.46× the median for 2 min; data-wait 0 %, CPU 99 %: "
                        "compute-bound on n3")
    assert feed(det, 4, {2: (2.2, 0.01)}) == []  # named once per streak
    assert det.take() == found and det.take() == []


def test_a_streak_broken_by_one_normal_window_starts_again_and_a_recovered_rank_can_be_named_again() -> None:
    det = Detector(share=0.8, windows=2, world_size=4)
    assert feed(det, 1, {1: (2.0, 0.01)}) == []
    assert feed(det, 2, {}) == []
    assert feed(det, 3, {1: (2.0, 0.01)}) == []
    assert [s.rank for s in feed(det, 4, {1: (2.0, 0.01)})] == [1]
    assert feed(det, 5, {}) == []
    assert feed(det, 6, {1: (2.0, 0.01)}) == []
    assert [s.rank for s in feed(det, 7, {1: (2.0, 0.01)})] == [1]


def test_the_share_is_the_threshold_against_the_median() -> None:
    """0.8: slower than 1.25 x the median. 1.2 x is not slow, 1.3 x is."""
    det = Detector(share=0.8, windows=1, world_size=4)
    assert feed(det, 1, {3: (1.2 * 1.01 - 0.01, 0.01)}) == []
    assert [s.rank for s in feed(det, 2, {3: (1.3 * 1.01 - 0.01, 0.01)})] == [3]
    det = Detector(share=0.5, windows=1, world_size=4)
    assert feed(det, 1, {3: (1.9, 0.01)}) == []


def test_a_window_is_judged_only_once_every_rank_reported_it() -> None:
    det = Detector(share=0.8, windows=1, world_size=4)
    for r in (0, 1, 2):
        assert det.window(window(1, r, 3.0 if r == 2 else 1.0)) == []
    assert [s.rank for s in det.window(window(1, 3))] == [2]
    assert det.window(window(1, 2, 3.0)) == []  # late repeat of a judged window: ignored


def test_lockstep_wall_time_does_not_make_a_straggler() -> None:
    """Every rank's wall time is the slowest's in DDP: only time outside collectives counts."""
    det = Detector(share=0.8, windows=1, world_size=2)
    a = Window("n1", 0, 0, 1, 10, 10, 0.1, 1.0, 9.0, 1.0)
    b = Window("n2", 1, 0, 1, 10, 10, 0.1, 1.0, 9.0, 1.0)
    assert det.window(a) == [] and det.window(b) == []


def test_data_wait_is_the_input_pipeline() -> None:
    det = Detector(share=0.8, windows=2, world_size=4)
    feed(det, 1, {1: (1.0, 1.5)})
    found = feed(det, 2, {1: (1.0, 1.5)})
    assert [(s.rank, s.kind) for s in found] == [(1, "data")]
    assert "input pipeline on n2" in found[0].reason and "data-wait 30 %" in found[0].line()


def test_a_throttling_or_hot_gpu_is_the_gpu_itself() -> None:
    det = Detector(share=0.8, windows=1, world_size=4)
    det.load(NodeLoad("n4", 50.0, {}, (GpuLoad(0, 100.0, 60.0, ("hw_slowdown", "hw_power_brake")),)))
    det.load(NodeLoad("n2", 50.0, {}, (GpuLoad(0, 100.0, 91.0, ()),)))
    found = feed(det, 1, {3: (2.0, 0.01), 1: (2.0, 0.01)})
    kinds = {s.rank: (s.kind, s.reason) for s in found}
    assert kinds[3] == ("gpu", "GPU 0 on n4 throttles (hw_slowdown, hw_power_brake)")
    assert kinds[1] == ("gpu", "GPU 0 on n2 is hot (91 °C)")


def test_every_rank_of_one_node_slow_is_the_node() -> None:
    det = Detector(share=0.8, windows=1, world_size=8)
    found = feed(det, 1, {2: (2.0, 0.01), 3: (2.0, 0.01)}, ranks=8, per_node=2)
    assert sorted((s.rank, s.node, s.kind) for s in found) == [(2, "n2", "node"), (3, "n2", "node")]


def test_watch_says_records_and_with_stop_fails_the_run_on_that_node() -> None:
    said: list[tuple[str, bool]] = []
    recorded: list[list[dict[str, object]]] = []

    class Say:
        def straggler(self, found: straggler.Straggler, stop: bool) -> None:
            said.append((found.line(), stop))

    specs = [NodeSpec(f"n{i + 1}", i, i, 1) for i in range(4)]
    for action, fails in (("warn", False), ("stop", True)):
        det = Detector(share=0.8, windows=1, world_size=4)
        watch = straggler.StragglerWatch(det, action, specs, Say(), recorded.append)
        assert watch() is None
        feed(det, 1, {2: (3.0, 0.01)})
        failure = watch()
        assert (failure is not None) == fails
        assert recorded[-1][0]["node"] == "n3" and recorded[-1][0]["kind"] == "compute"
        if failure is not None:
            assert (failure.node, failure.node_rank, failure.rank, failure.local_rank) == ("n3", 2, 2, 0)
            assert failure.reason.startswith("straggler: rank 2 on n3")
        assert watch() is None
    assert [stop for _line, stop in said] == [False, True]


def test_chain_returns_the_first_failure() -> None:
    assert straggler.chain(None, None) is None
    calls: list[str] = []
    watch = straggler.chain(lambda: calls.append("a"), None, lambda: calls.append("b"))  # type: ignore[func-returns-value,arg-type,return-value]
    assert watch is not None and watch() is None and calls == ["a", "b"]


def test_replay_orders_loads_and_windows_by_time() -> None:
    wins = [window(k, r, 2.0 if r == 0 else 1.0) for k in (1, 2) for r in range(4)]
    loads = [(1000.0, NodeLoad("n1", 12.0, {0: 100.0}))]
    det = straggler.replay(reversed(wins), loads, 0.8, 2, 4)
    assert [(s.rank, s.cpu_pct) for s in det.found] == [(0, 100.0)]
    assert len(det.speeds) == 2 and det.speeds[0][2][0] == pytest.approx(1.01 / 2.01, rel=1e-3)


def test_duration_words() -> None:
    assert [straggler.duration(s) for s in (3, 119.6, 180, 7300)] == ["3 s", "2 min", "3 min", "2 h 1 min"]


def test_a_relaunch_that_resumes_an_earlier_epoch_is_judged_anew() -> None:
    """A retry's ranks start again from the checkpoint's epoch (the node log continues): their
    windows repeat keys already judged, and are judged again rather than dropped."""
    det = Detector(share=0.8, windows=2, world_size=4)
    feed(det, 1, {})
    feed(det, 2, {})
    feed(det, 3, {})
    assert feed(det, 2, {0: (3.0, 0.01)}) == []  # attempt 2, from window 2 again
    assert [s.rank for s in feed(det, 3, {0: (3.0, 0.01)})] == [0]
