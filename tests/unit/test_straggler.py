"""The straggler detector on synthetic windows: which rank, when, and why (run/straggler.py)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from orchestrator.run import straggler
from orchestrator.run.straggler import Detector, GpuLoad, NodeLoad, Window
from orchestrator.run.supervise import NodeSpec

NODES = {0: "n1", 1: "n2", 2: "n3", 3: "n4"}


def window(
    k: int,
    rank: int,
    compute: float = 1.0,
    data: float = 0.01,
    steps: int = 10,
    per_node: int = 1,
    at: float | None = None,
) -> Window:
    """Rank `rank`'s k-th window: `compute`/`data` seconds in all (10 steps), wall = the slowest's."""
    return Window(
        node=f"n{rank // per_node + 1}",
        rank=rank,
        local_rank=rank % per_node,
        epoch=1,
        batch=10 * k,
        steps=steps,
        data_s=data,
        compute_s=compute,
        wall_s=5.0,
        at=1000.0 + 60 * k if at is None else at,
    )


def feed(
    det: Detector, k: int, slow: Mapping[int, tuple[float, float]], ranks: int = 4, per_node: int = 1
) -> list[straggler.Straggler]:
    found = []
    for r in range(ranks):
        compute, data = slow.get(r, (1.0, 0.01))
        found += det.window(window(k, r, compute, data, per_node=per_node))
    return found


def test_a_rank_slow_for_the_set_number_of_windows_is_named_once_with_the_compute_reason() -> None:
    det = Detector(share=0.8, windows=3, world_size=4)
    det.load(NodeLoad("n3", cpu_pct=100.0, rank_cpu_pct={2: 99.0}, no_gpu=True))  # a CPU node: its ranks compute there
    assert feed(det, 1, {2: (2.2, 0.01)}) == []
    assert feed(det, 2, {2: (2.2, 0.01)}) == []
    found = feed(det, 3, {2: (2.2, 0.01)})
    assert [(s.rank, s.node, s.kind) for s in found] == [(2, "n3", "compute")]
    s = found[0]
    assert s.speed == pytest.approx(1.01 / 2.21, rel=1e-3) and s.windows == 3 and s.cpu_pct == 99.0
    assert s.since == 1055.0 and s.at == 1180.0  # from the start of its first slow window (wall 5 s)
    assert s.line() == (
        "straggler: rank 2 on n3 at 0.46× the median for 2 min; data-wait 0 %, CPU 99 %: compute-bound on n3"
    )
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


def one_slow(load: NodeLoad | None, local_rank: int | None = 0) -> straggler.Straggler:
    """Rank 2 (on n3, GPU `local_rank`) slow outside collectives, little data wait; n3's telemetry `load`."""
    det = Detector(share=0.8, windows=1, world_size=4)
    if load is not None:
        det.load(load)
    for r in range(4):
        w = window(1, r, 2.2 if r == 2 else 1.0)
        det.window(
            Window(
                w.node,
                w.rank,
                local_rank if r == 2 else 0,
                w.epoch,
                w.batch,
                w.steps,
                w.data_s,
                w.compute_s,
                w.wall_s,
                w.at,
            )
        )
    found = det.take()
    assert [s.rank for s in found] == [2]
    return found[0]


def test_a_slow_rank_whose_gpu_is_barely_busy_and_data_wait_low_is_waiting_on_others() -> None:
    """Its time outside the collectives goes to waiting all the same (a collective in forward): the
    slow one is elsewhere."""
    s = one_slow(NodeLoad("n3", 40.0, {2: 100.0}, (GpuLoad(0, 23.0, 55.0, ()),)))
    assert s.kind == "waiting"
    assert s.reason == "waiting on others: GPU 0 on n3 is 23 % busy and data wait is low, the slow one is elsewhere"
    assert s.line().endswith(": " + s.reason)


def test_a_slow_rank_whose_gpu_is_busy_is_compute_bound() -> None:
    s = one_slow(NodeLoad("n3", 40.0, {2: 100.0}, (GpuLoad(0, 98.0, 60.0, ()),)))
    assert (s.kind, s.reason) == ("compute", "compute-bound on n3")
    at_threshold = one_slow(NodeLoad("n3", 40.0, {}, (GpuLoad(0, straggler.LOW_UTIL_PCT, 60.0, ()),)))
    assert at_threshold.kind == "compute"


def test_the_rank_is_judged_by_its_own_gpu_the_one_of_its_local_rank() -> None:
    gpus = (GpuLoad(0, 99.0, 60.0, ()), GpuLoad(1, 12.0, 60.0, ()))
    assert one_slow(NodeLoad("n3", 40.0, {}, gpus), local_rank=1).kind == "waiting"
    assert one_slow(NodeLoad("n3", 40.0, {}, gpus), local_rank=0).kind == "compute"


@pytest.mark.parametrize(
    ("load", "local_rank", "missing"),
    [
        (None, 0, "no telemetry from n3"),
        (
            NodeLoad("n3", 40.0, {}, (), gpu_error="nvidia-smi exit 9: NVIDIA-SMI has failed"),
            0,
            "no GPU telemetry from n3: nvidia-smi exit 9: NVIDIA-SMI has failed",
        ),
        (NodeLoad("n3", 40.0, {}, (GpuLoad(1, 10.0, 50.0, ()),)), 0, "no GPU 0 in the telemetry of n3"),
        (NodeLoad("n3", 40.0, {}, (GpuLoad(0, None, 50.0, ()),)), 0, "the utilisation of GPU 0 on n3 is unreadable"),
        (
            NodeLoad("n3", 40.0, {}, (GpuLoad(0, 10.0, 50.0, ()),)),
            None,
            "the GPU of rank 2 is not known: no local rank",
        ),
    ],
)
def test_without_the_ranks_gpu_telemetry_compute_or_waiting_cannot_be_told(
    load: NodeLoad | None, local_rank: int | None, missing: str
) -> None:
    """Never a guess: the reason says it cannot tell, and which telemetry is missing."""
    s = one_slow(load, local_rank)
    assert s.kind == "unknown"
    assert s.reason == f"slow outside collectives on n3, compute-bound or waiting on others cannot be told ({missing})"


def test_a_node_without_nvidia_smi_computes_on_the_cpu_compute_bound() -> None:
    """No GPU there: its ranks' compute is the CPU's (a CPU share cannot tell waiting from a quota)."""
    s = one_slow(NodeLoad("n3", 100.0, {2: 5.0}, (), no_gpu=True, gpu_error="nvidia-smi: not found in PATH"))
    assert (s.kind, s.reason) == ("compute", "compute-bound on n3")


def test_throttling_data_wait_and_a_whole_node_come_before_the_utilisation() -> None:
    idle = (GpuLoad(0, 5.0, 60.0, ("sw_thermal",)),)
    assert one_slow(NodeLoad("n3", 40.0, {}, idle)).kind == "gpu"
    det = Detector(share=0.8, windows=1, world_size=4)
    det.load(NodeLoad("n2", 40.0, {}, (GpuLoad(0, 5.0, 60.0, ()),)))
    assert [s.kind for s in feed(det, 1, {1: (1.0, 1.5)})] == ["data"]
    det = Detector(share=0.8, windows=1, world_size=8)
    det.load(NodeLoad("n2", 40.0, {}, (GpuLoad(0, 5.0, 60.0, ()), GpuLoad(1, 5.0, 60.0, ()))))
    assert [s.kind for s in feed(det, 1, {2: (2.0, 0.01), 3: (2.0, 0.01)}, ranks=8, per_node=2)] == ["node", "node"]


def test_every_kind_has_words_for_orch_top() -> None:
    assert set(straggler.KINDS) == {"gpu", "data", "node", "waiting", "compute", "unknown"}


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
        assert recorded[-1][0]["node"] == "n3" and recorded[-1][0]["kind"] == "unknown"  # no telemetry fed
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


def test_a_cpu_starved_rank_whose_last_window_waited_for_data_is_still_compute_bound() -> None:
    """A CPU quota starves the node's loader workers too: one window may wait for data as long as
    it computes. The reason is judged on the streak, whose data wait the line reports (4 % here)."""
    det = Detector(share=0.8, windows=3, world_size=4)
    det.load(NodeLoad("n3", cpu_pct=40.0, rank_cpu_pct={2: 36.0}, no_gpu=True))
    feed(det, 1, {2: (3.0, 0.01)})
    feed(det, 2, {2: (3.0, 0.01)})
    found = feed(det, 3, {2: (1.6, 0.7)})  # this window: 0.7 s of its 1.3 s excess waiting for data
    assert [(s.rank, s.node, s.kind) for s in found] == [(2, "n3", "compute")], [s.reason for s in found]
    assert "compute-bound on n3" in found[0].line()


def test_a_long_run_keeps_its_heatmap_windows_evenly_spaced_in_bounded_memory() -> None:
    """A week of windows: the detector keeps at most 2 x KEEP_SPEEDS of them for the heatmap (it
    kept every one), evenly spaced from the first, and the last judged window's speeds for top."""
    from orchestrator.run.straggler import KEEP_SPEEDS, Detector, Window

    det = Detector(0.8, 3, world_size=2)
    n = 5 * KEEP_SPEEDS + 7
    for k in range(n):
        for rank in (0, 1):
            det.window(Window("n1", rank, rank, 1, k, 10, 0.1, 1.0 + rank, 5.0, float(k)))
    assert KEEP_SPEEDS <= len(det.speeds) < 2 * KEEP_SPEEDS
    batches = [key[1] for key, _at, _row in det.speeds]
    steps = {b - a for a, b in zip(batches, batches[1:])}
    assert batches[0] == 0 and steps == {det.speeds_every}
    assert det.judged_windows == n and det.last_speeds == pytest.approx({0: 1.6 / 1.1, 1: 1.6 / 2.1})
    assert len(det.streak[1]) == 3  # named once: its streak stops growing
