"""k-way merge, live watermark merge, filters and output formats, on hand-built interleavings."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.logs.filters import LineFilter, last_n, parse_nodes, parse_ranks, parse_since
from orchestrator.logs.lines import (
    LogLine,
    column_widths,
    format_line,
    node_color,
    parse_ts,
    to_json,
)
from orchestrator.logs.merge import LiveMerge, merge
from tests.hypothesis_support import examples

T0 = 1_796_031_125.0  # 2026-11-30T09:32:05Z


def L(node: str, t: float, text: str = "", rank: int | None = None, node_rank: int = 0) -> LogLine:  # noqa: N802
    return LogLine(T0 + t, node, node_rank, rank, None, "out", text or f"{node}@{t}")


def texts(lines: Iterator[LogLine] | list[LogLine]) -> list[str]:
    return [ln.text for ln in lines]


class TestMerge:
    def test_interleaves_by_time(self) -> None:
        a = [L("a", 0.0), L("a", 0.2), L("a", 0.4)]
        b = [L("b", 0.1), L("b", 0.3)]
        assert texts(merge([iter(a), iter(b)])) == ["a@0.0", "b@0.1", "a@0.2", "b@0.3", "a@0.4"]

    def test_ties_keep_the_order_the_streams_were_given(self) -> None:
        a = [L("a", 1.0, "a1"), L("a", 1.0, "a2")]
        b = [L("b", 1.0, "b1")]
        c = [L("c", 1.0, "c1")]
        assert texts(merge([iter(c), iter(a), iter(b)])) == ["c1", "a1", "a2", "b1"]

    def test_a_node_whose_clock_stepped_back_keeps_its_own_order(self) -> None:
        a = [L("a", 5.0, "a-before-step"), L("a", 1.0, "a-after-step")]
        b = [L("b", 3.0, "b")]
        out = texts(merge([iter(a), iter(b)]))
        assert out.index("a-before-step") < out.index("a-after-step")

    def test_clock_offsets_are_subtracted_before_ordering(self) -> None:
        # b's clock runs 2 s ahead: its line stamped 2.5 happened at 0.5 on the reference clock.
        a = [L("a", 0.0), L("a", 1.0)]
        b = [L("b", 2.5)]
        assert texts(merge([iter(a), iter(b)])) == ["a@0.0", "a@1.0", "b@2.5"]
        assert texts(merge([iter(a), iter(b)], {"b": 2000.0})) == ["a@0.0", "b@2.5", "a@1.0"]

    def test_negative_offset_moves_a_node_later(self) -> None:
        a = [L("a", 0.0), L("a", 1.0)]
        b = [L("b", 0.5)]  # b is 1 s behind: its 0.5 is 1.5 on the reference clock
        assert texts(merge([iter(a), iter(b)], {"b": -1000.0})) == ["a@0.0", "a@1.0", "b@0.5"]

    def test_empty_streams_and_no_streams(self) -> None:
        assert texts(merge([iter([]), iter([L("a", 1)]), iter([])])) == ["a@1"]
        assert list(merge([])) == []

    def test_streaming_holds_one_line_per_stream(self) -> None:
        def endless(node: str, step: float) -> Iterator[LogLine]:
            for i in itertools.count():
                yield L(node, i * step)

        first = list(itertools.islice(merge([endless("a", 1.0), endless("b", 0.5)]), 7))
        assert texts(first) == ["a@0.0", "b@0.0", "b@0.5", "a@1.0", "b@1.0", "b@1.5", "a@2.0"]

    @settings(max_examples=examples(60), deadline=None)
    @given(st.lists(st.lists(st.integers(0, 50), max_size=30), min_size=1, max_size=6))
    def test_output_is_sorted_and_a_permutation(self, per_node: list[list[int]]) -> None:
        streams = [[L(f"n{i}", t / 10, f"n{i}#{j}") for j, t in enumerate(sorted(ts))] for i, ts in enumerate(per_node)]
        out = list(merge([iter(s) for s in streams]))
        assert sorted(texts(out)) == sorted(texts(itertools.chain(*streams)))
        keys = [(ln.ts, int(ln.node[1:])) for ln in out]
        assert keys == sorted(keys)


class TestLiveMerge:
    """The clock is passed in, so every interleaving is exact."""

    def test_releases_at_once_when_every_node_has_caught_up(self) -> None:
        live = LiveMerge(["a", "b"], watermark=1.0)
        live.push(0, L("a", 0.0), now=100.0)
        assert texts(live.ready(100.0)) == []  # b could still send something earlier
        live.push(1, L("b", 0.1), now=100.0)
        assert texts(live.ready(100.0)) == ["a@0.0"]  # b is past 0.0; b@0.1 waits for a
        live.push(0, L("a", 0.3), now=100.1)
        assert texts(live.ready(100.1)) == ["b@0.1"]

    def test_out_of_order_arrival_within_the_watermark_is_ordered(self) -> None:
        live = LiveMerge(["a", "b"], watermark=1.0)
        live.push(0, L("a", 0.5), now=10.0)  # a's line arrives first...
        live.push(1, L("b", 0.2), now=10.6)  # ...b's earlier line 0.6 s later, within the watermark
        live.push(1, L("b", 0.9), now=10.6)
        out = texts(live.ready(10.6))
        out += texts(live.ready(11.7, flush=False))
        assert out[:2] == ["b@0.2", "a@0.5"]

    def test_a_silent_node_delays_the_others_by_the_watermark_only(self) -> None:
        live = LiveMerge(["a", "silent"], watermark=1.0)
        live.push(0, L("a", 0.0), now=50.0)
        live.push(0, L("a", 0.1), now=50.2)
        assert texts(live.ready(50.9)) == []
        assert live.deadline() == pytest.approx(51.0)
        assert texts(live.ready(51.0)) == ["a@0.0"]
        assert texts(live.ready(51.19)) == []
        assert texts(live.ready(51.2)) == ["a@0.1"]

    def test_a_finished_node_holds_nobody_back(self) -> None:
        live = LiveMerge(["a", "b"], watermark=5.0)
        live.push(0, L("a", 1.0), now=0.0)
        live.finish(1)
        assert texts(live.ready(0.0)) == ["a@1.0"]
        live.finish(0)
        assert live.finished

    def test_late_line_beyond_the_watermark_still_comes_out(self) -> None:
        live = LiveMerge(["a", "b"], watermark=1.0)
        live.push(0, L("a", 5.0), now=0.0)
        assert texts(live.ready(1.0)) == ["a@5.0"]
        live.push(1, L("b", 4.0), now=1.5)  # too late to be ordered before a@5.0
        assert texts(live.ready(2.5)) == ["b@4.0"]

    def test_clock_offsets_apply_live(self) -> None:
        live = LiveMerge(["a", "b"], watermark=10.0, offsets_ms={"b": 2000.0})
        live.push(1, L("b", 2.5), now=0.0)  # really 0.5
        live.push(0, L("a", 1.0), now=0.0)
        live.push(0, L("a", 3.0), now=0.0)
        live.finish(0)
        live.finish(1)
        assert texts(live.ready(0.0)) == ["b@2.5", "a@1.0", "a@3.0"]

    def test_a_node_stepping_back_keeps_its_order_live(self) -> None:
        live = LiveMerge(["a"], watermark=1.0)
        live.push(0, L("a", 2.0, "first"), now=0.0)
        live.push(0, L("a", 1.0, "second"), now=0.0)
        assert texts(live.ready(0.0, flush=True)) == ["first", "second"]

    def test_a_heartbeat_lets_lines_out_before_the_watermark(self) -> None:
        live = LiveMerge(["a", "idle"], watermark=5.0)
        live.push(0, L("a", 1.0), now=0.0)
        live.heard(1, now=0.1, node_time=T0 + 1.0)  # idle's log had nothing more at 1.0 (minus margin)
        assert texts(live.ready(0.1)) == []
        live.heard(1, now=0.2, node_time=T0 + 1.0 + LiveMerge.HEARTBEAT_MARGIN)
        assert texts(live.ready(0.2)) == ["a@1.0"]

    def test_heartbeat_times_are_corrected_by_the_offset_too(self) -> None:
        live = LiveMerge(["a", "idle"], watermark=5.0, offsets_ms={"idle": 3000.0})
        live.push(0, L("a", 1.0), now=0.0)
        live.heard(1, now=0.1, node_time=T0 + 3.5)  # idle's clock is 3 s ahead: that is 0.5 really
        assert texts(live.ready(0.1)) == []
        live.heard(1, now=0.2, node_time=T0 + 4.5)
        assert texts(live.ready(0.2)) == ["a@1.0"]

    def test_watermark_waits_for_every_node_to_connect_within_the_startup_grace(self) -> None:
        live = LiveMerge(["fast", "slow"], watermark=1.0, start=0.0, startup_grace=5.0)
        live.push(0, L("fast", 1.0), now=0.1)
        assert texts(live.ready(2.0)) == []  # slow is still connecting: its earlier lines may come
        live.push(1, L("slow", 0.5), now=2.5)
        assert texts(live.ready(2.5)) == ["slow@0.5"]
        assert texts(live.ready(3.49)) == []
        assert texts(live.ready(3.5)) == ["fast@1.0"]  # a watermark after everyone was heard

    def test_a_node_that_never_connects_holds_the_start_for_the_grace_only(self) -> None:
        live = LiveMerge(["up", "down"], watermark=1.0, start=0.0, startup_grace=5.0)
        live.push(0, L("up", 1.0), now=0.1)
        assert live.deadline() == pytest.approx(6.0)
        assert texts(live.ready(5.9)) == []
        assert texts(live.ready(6.0)) == ["up@1.0"]

    def test_ties_go_to_the_lower_node_index(self) -> None:
        live = LiveMerge(["a", "b"], watermark=1.0)
        live.push(1, L("b", 1.0), now=0.0)
        live.push(0, L("a", 1.0), now=0.0)
        assert texts(live.ready(0.0, flush=True)) == ["a@1.0", "b@1.0"]

    @settings(max_examples=examples(40), deadline=None)
    @given(
        st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=20), min_size=2, max_size=5),
        st.randoms(use_true_random=False),
    )
    def test_every_line_exactly_once_and_ordered_when_arrivals_are_within_the_watermark(
        self, per_node: list[list[int]], rnd: object
    ) -> None:
        # Each line arrives at its own time plus a random network delay below the watermark:
        # then the output must be perfectly ordered.
        import random

        assert isinstance(rnd, random.Random)
        live = LiveMerge([f"n{i}" for i in range(len(per_node))], watermark=0.5)
        events = []
        for i, ts in enumerate(per_node):
            delay = 0.0
            for j, t in enumerate(sorted(ts)):
                delay = max(delay, rnd.uniform(0, 0.49))  # a node's lines arrive in order
                events.append((t / 100 + delay, i, L(f"n{i}", t / 100, f"n{i}#{j}")))
        events.sort(key=lambda e: (e[0], e[1]))
        out: list[LogLine] = []
        for now, i, line in events:
            out += live.ready(now)
            live.push(i, line, now)
            out += live.ready(now)
        out += live.ready(1e9)
        assert sorted(texts(out)) == sorted(e[2].text for e in events)
        keys = [(ln.ts, int(ln.node[1:])) for ln in out]
        assert keys == sorted(keys)


class TestFilters:
    def test_ranks(self) -> None:
        assert parse_ranks("0,8-10") == {0, 8, 9, 10}
        for bad in ("x", "3-1", "1,,2", "-1"):
            with pytest.raises(UsageError):
                parse_ranks(bad)

    def test_nodes_accept_clustershell_ranges(self) -> None:
        known = ["gpu01", "gpu02", "gpu03", "login"]
        assert parse_nodes("gpu[01-02],login", known) == {"gpu01", "gpu02", "login"}
        with pytest.raises(UsageError, match="gpu09"):
            parse_nodes("gpu[08-09]", known)
        with pytest.raises(UsageError):
            parse_nodes("gpu[01-", known)

    def test_since_durations_and_times(self) -> None:
        now = T0
        assert parse_since("10m", now) == now - 600
        assert parse_since("2h", now) == now - 7200
        assert parse_since("1h30m", now) == now - 5400
        assert parse_since("45s", now) == now - 45
        assert parse_since("2026-11-30T09:32:05Z") == T0
        assert parse_since("2026-11-30T09:32:05") == T0  # no zone: UTC, like every printed time
        assert parse_since("2026-11-30T17:32:05+08:00") == T0
        with pytest.raises(UsageError):
            parse_since("yesterday")

    def test_line_filter(self) -> None:
        keep = LineFilter(nodes=frozenset({"a"}), ranks=frozenset({1}), pattern=re.compile("loss"), since=T0 + 1)
        assert keep(L("a", 2, "loss=1", rank=1))
        assert not keep(L("b", 2, "loss=1", rank=1))
        assert not keep(L("a", 2, "loss=1", rank=2))
        assert not keep(L("a", 2, "loss=1"))  # torchrun's own lines have no rank
        assert not keep(L("a", 2, "acc=1", rank=1))
        assert not keep(L("a", 0.5, "loss=1", rank=1))
        assert LineFilter().empty and not keep.empty

    def test_no_telemetry_leaves_out_the_agents_samples_and_the_ranks_timing_lines_only(self) -> None:
        from dataclasses import replace

        sample = replace(L("a", 1, 'telemetry {"v": 1, "gpus": []}'), stream="orch")
        timing = L("a", 2, "timing epoch 3 batch 40 steps 10 images 80 data_s 0.0123 compute_s 1.52 wall_s 3.1", rank=0)
        job = [
            L("a", 3, "epoch 3/10 batch 40/120 box_loss 1.2", rank=0),
            L("a", 4, "a rank's own line that says timing epoch in passing", rank=1),
            replace(L("a", 5, "straggler: rank 2 on n3 at 0.45x the median"), stream="orch"),
            replace(L("a", 6, "telemetry is what orch top reads"), stream="out"),
        ]
        keep = LineFilter(metrics=False)
        assert not keep.empty and LineFilter().empty
        assert [ln for ln in [sample, timing, *job] if keep(ln)] == job
        assert all(LineFilter()(ln) for ln in [sample, timing, *job])
        assert not LineFilter(metrics=False, pattern=re.compile("timing"))(timing)

    def test_since_uses_the_corrected_time(self) -> None:
        keep = LineFilter(since=T0 + 1, offsets_ms={"b": 2000.0})
        assert not keep(L("b", 2.5))  # 0.5 on the reference clock
        assert keep(L("a", 2.5))

    def test_tail_is_bounded(self) -> None:
        assert texts(last_n((L("a", i) for i in range(100_000)), 2)) == ["a@99998", "a@99999"]
        assert list(last_n(iter([L("a", 1)]), 0)) == []


class TestOutput:
    def test_plain_columns_align(self) -> None:
        widths = column_widths(["node1", "node10"], 16)
        lines = [LogLine(T0, "node1", 0, 3, 3, "out", "x"), LogLine(T0, "node10", 1, None, None, "err", "y")]
        out = [format_line(ln, False, node_width=widths[0], rank_width=widths[1]) for ln in lines]
        assert out == ["2026-11-30T09:32:05.000000Z node1   r3 x", "2026-11-30T09:32:05.000000Z node10   - y"]
        assert out[0].index(" x") == out[1].index(" y")

    def test_long_lines_are_never_wrapped_or_cut(self) -> None:
        text = "loss " * 2000
        out = format_line(LogLine(T0, "n", 0, 0, 0, "out", text), False)
        assert out.endswith(text) and "\n" not in out

    def test_carriage_return_progress_shows_its_last_state(self) -> None:
        line = LogLine(T0, "n", 0, 0, 0, "out", "  1/10 [=   ]\r  5/10 [==  ]\r 10/10 [====]\r")
        assert format_line(line, False).endswith(" r0  10/10 [====]")
        assert json.loads(to_json(line))["line"] == line.text

    def test_colour_is_stable_per_node_and_absent_in_plain_text(self) -> None:
        line = LogLine(T0, "node3", 0, 0, 0, "out", "hi")
        coloured = format_line(line, True)
        assert node_color("node3") in coloured and "\x1b" not in format_line(line, False)
        assert len({node_color(f"node{i}") for i in range(16)}) > 4  # nodes get different colours

    def test_json_matches_the_contract(self) -> None:
        obj = json.loads(to_json(LogLine(T0 + 0.123456, "v100-2", 1, 9, 1, "out", "epoch 1 ü")))
        assert obj == {
            "ts": "2026-11-30T09:32:05.123456Z",
            "node": "v100-2",
            "node_rank": 1,
            "rank": 9,
            "local_rank": 1,
            "line": "epoch 1 ü",
            "stream": "out",
        }
        assert parse_ts(obj["ts"]) == pytest.approx(T0 + 0.123456, abs=1e-7)
        none = json.loads(to_json(LogLine(T0, "a", 0, None, None, "err", "x")))
        assert none["rank"] is None and none["local_rank"] is None
