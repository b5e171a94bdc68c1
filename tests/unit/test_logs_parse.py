"""Parsing node.log lines: timestamps, streams, torchrun tee prefixes (real captures), ranks."""

from __future__ import annotations

import calendar
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.logs.lines import format_ts, parse_node_line, parse_ts, read_node_lines

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TS = "2026-11-30T09:32:05.123456Z"


def node_log(fixture: str, stream: str) -> list[str]:
    """A real torchrun capture as the node agent would have stamped it into node.log."""
    return [f"{TS} {stream} {line}" for line in (FIXTURES / fixture).read_text().splitlines()]


class TestTimestamps:
    def test_parse_is_utc_epoch_with_microseconds(self) -> None:
        expected = calendar.timegm((2026, 11, 30, 9, 32, 5, 0, 0, 0)) + 0.123456
        assert parse_ts(TS) == pytest.approx(expected, abs=1e-7)

    @given(st.integers(min_value=0, max_value=4_102_444_800 * 1_000_000 - 1))
    def test_format_parse_round_trip_exact_to_the_microsecond(self, us: int) -> None:
        stamp = format_ts(us / 1_000_000)
        assert len(stamp) == 27
        assert round(parse_ts(stamp) * 1_000_000) == us
        assert format_ts(parse_ts(stamp)) == stamp

    @pytest.mark.parametrize(
        "bad", ["2026-11-30T09:32:05Z", "2026-11-30 09:32:05.123456Z", "2026-11-30T09:32:05.123456+", "garbage"]
    )
    def test_rejects_other_formats(self, bad: str) -> None:
        with pytest.raises(ValueError):
            parse_ts(bad)

    def test_local_timezone_of_the_reader_does_not_matter(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # The field guide lost hours to nodes in different zones; node.log times are UTC.
        monkeypatch.setenv("TZ", "Asia/Shanghai")
        time.tzset()
        try:
            assert format_ts(parse_ts(TS)) == TS
        finally:
            monkeypatch.delenv("TZ")
            time.tzset()


class TestRealTorchrunTee:
    """torch 2.14 `--tee 3` captured here (see tests/fixtures/README.md)."""

    def test_stdout_worker_lines_carry_local_and_trainer_rank(self) -> None:
        lines = [
            parse_node_line(r, "node2", 1, 2) for r in node_log("torchrun_tee3_2proc_exit3_stdout_torch2.14.txt", "out")
        ]
        assert len(lines) == 8
        first = lines[0]
        assert (first.local_rank, first.rank, first.stream) == (0, 0, "out")
        assert first.text == "epoch 0/3 loss=1.0000 local_rank=0"
        # each line's own `local_rank=N` agrees with the parsed tee prefix
        for line in lines:
            if "local_rank=" in line.text:
                assert line.text.endswith(f"local_rank={line.local_rank}")
                assert line.rank == line.local_rank  # the trainer prefix wins over base_rank

    def test_worker_line_without_trainer_prefix_gets_base_plus_local_rank(self) -> None:
        lines = [
            parse_node_line(r, "node2", 1, 8) for r in node_log("torchrun_tee3_2proc_exit3_stdout_torch2.14.txt", "out")
        ]
        plain = [ln for ln in lines if ln.text == "plain line without trainer prefix"]
        assert sorted((ln.local_rank, ln.rank) for ln in plain) == [(0, 8), (1, 9)]

    def test_without_a_base_rank_the_global_rank_is_unknown(self) -> None:
        raw = f"{TS} out [default1]:plain line without trainer prefix"
        line = parse_node_line(raw, "n", 0, None)
        assert (line.local_rank, line.rank) == (1, None)

    def test_stderr_torchrun_own_lines_have_no_rank(self) -> None:
        lines = [
            parse_node_line(r, "node1", 0, 0) for r in node_log("torchrun_tee3_2proc_exit3_stderr_torch2.14.txt", "err")
        ]
        banner = [ln for ln in lines if ln.text.startswith("Setting OMP_NUM_THREADS")]
        assert banner and banner[0].rank is None and banner[0].local_rank is None
        failure = [ln for ln in lines if "ChildFailedError" in ln.text or ln.text.startswith("E1130")]
        assert len(failure) == 3 and all(ln.rank is None for ln in failure)
        assert any(ln.text.endswith("ChildFailedError: ") for ln in failure)  # trailing space kept
        warned = [ln for ln in lines if ln.text.startswith("warning on stderr")]
        assert len(warned) == 6
        assert all(ln.text.endswith(f"step {ln.text[-1]}") and ln.stream == "err" for ln in warned)
        assert {(ln.local_rank, ln.rank) for ln in warned} == {(0, 0), (1, 1)}

    def test_cpp_log_lines_inside_worker_keep_their_own_brackets(self) -> None:
        lines = [
            parse_node_line(r, "n", 0, 0)
            for r in node_log("torchrun_tee3_2proc_gloo_cpplog_stderr_torch2.14.txt", "err")
        ]
        worker = [ln for ln in lines if ln.local_rank is not None]
        assert len(worker) == 2
        assert all(ln.text.startswith("[I1130 ") for ln in worker)
        agent_side = [ln for ln in lines if ln.text.startswith("[I1130")]
        assert any(ln.local_rank is None for ln in agent_side)  # torchrun's own store client

    def test_bloom_default7_lines_from_a_48_node_run(self) -> None:
        lines = [
            parse_node_line(r, "jz-1", 0, 56)
            for r in node_log("torchrun_tee3_default7_iteration_and_eval_bloom176b.txt", "out")
        ]
        assert {(ln.local_rank, ln.rank) for ln in lines} == {(7, 63)}
        assert lines[0].text.startswith(" iteration    45000/")  # text after the colon is kept verbatim

    def test_bloom_crash_lines(self) -> None:
        lines = [
            parse_node_line(r, "jz-1", 0, 0)
            for r in node_log("torchrun_tee3_default3_CUDAError_crash_bloom176b.txt", "err")
        ]
        assert all(ln.local_rank == 3 for ln in lines)
        assert lines[0].text == "terminate called after throwing an instance of 'c10::CUDAError'"


class TestLineShapes:
    def test_orch_stream_and_empty_text(self) -> None:
        line = parse_node_line(f"{TS} orch started pid 42 (process group 42)\n", "n1", 0, 0)
        assert (line.stream, line.text, line.rank) == ("orch", "started pid 42 (process group 42)", None)
        empty = parse_node_line(f"{TS} out \n", "n1", 0, 0)
        assert (empty.stream, empty.text) == ("out", "")

    def test_text_that_only_looks_like_a_prefix_is_left_alone(self) -> None:
        line = parse_node_line(f"{TS} out [defaultx]: [rank nine] x", "n1", 0, 0)
        assert (line.local_rank, line.rank, line.text) == (None, None, "[defaultx]: [rank nine] x")

    def test_a_rank_of_more_digits_than_a_number_takes_is_no_rank(self) -> None:
        """More digits than Python's int() takes (4300): no rank, never a ValueError out of the parser."""
        big = "7" * 5000
        trainer = parse_node_line(f"{TS} out [default2]:[rank {big}] x", "n1", 0, 8)
        assert (trainer.local_rank, trainer.rank, trainer.text) == (2, None, "x")
        tee = parse_node_line(f"{TS} out [default{big}]:y", "n1", 0, 8)
        assert (tee.local_rank, tee.rank, tee.text) == (None, None, "y")

    def test_unparsable_line_needs_a_fallback(self) -> None:
        with pytest.raises(ValueError):
            parse_node_line("no timestamp here", "n1", 0, 0)
        line = parse_node_line("no timestamp here", "n1", 0, 0, fallback_ts=12.5)
        assert (line.ts, line.stream, line.text) == (12.5, "out", "no timestamp here")

    def test_read_node_lines_carries_the_previous_time_over_a_torn_line(self) -> None:
        raws = [f"{TS} out a\n", "torn\n", "2026-11-30T09:32:06.000000Z out b\n"]
        lines = list(read_node_lines(raws, "n1", 0, 0))
        assert [ln.text for ln in lines] == ["a", "torn", "b"]
        assert lines[1].ts == lines[0].ts


class TestFrames:
    """The node reader's stream arrives with the login shell's output merged in front of it; its
    frames start after its line with the session's nonce."""

    HELLO = b"ORCH-LOG-READER s3ss10n\n"

    @staticmethod
    def frames(raw: bytes) -> list[tuple[str, bytes]]:
        import io

        from orchestrator.logs.fetch import read_frames

        return list(read_frames(io.BytesIO(raw), "s3ss10n"))

    def test_login_shell_noise_before_the_first_frame_is_skipped(self) -> None:
        raw = (
            b"rm: cannot remove '/root/.pyenv/shims/tmp.X': No such file or directory\n"
            b"pyenv: cannot rehash: /root/.pyenv/shims isn't writable\n"
            + self.HELLO
            + b"D 6\nabc\nd\nH running 1.5\nE succeeded 2.0\n"
        )
        assert self.frames(raw) == [("D", b"abc\nd\n"), ("H", b"running 1.5"), ("E", b"succeeded 2.0")]

    def test_a_banner_that_looks_like_frames_is_never_taken_for_one(self) -> None:
        """`E xpires` ended the stream before its first line, `H ello` raised, `D <huge>` allocated."""
        banner = (
            b"E xpires in 3 days: change your password\nH ello from the cluster team\nD 99999999999999\n"
            b'S {"state": "succeeded"}\nORCH-LOG-READER 000000000000\nORCH-LOG-READER s3ss10n (not quite)\n'
        )
        assert self.frames(banner + self.HELLO + b"D 3\nok\nE succeeded 2.0\n") == [
            ("D", b"ok\n"),
            ("E", b"succeeded 2.0"),
        ]

    def test_noise_without_any_frame_is_an_error_that_shows_it(self) -> None:
        import pytest

        from orchestrator.logs.fetch import ProtocolError

        with pytest.raises(ProtocolError, match="python3: not found"):
            self.frames(b"bash: line 1: python3: not found\n")
        with pytest.raises(ProtocolError, match="printed nothing"):
            self.frames(b"")
        with pytest.raises(ProtocolError, match="more than 65536 bytes and no frame"):
            self.frames(b"motd\n" * 20000)

    def test_a_traceback_or_garbage_after_frames_is_an_error(self) -> None:
        import pytest

        from orchestrator.logs.fetch import ProtocolError

        with pytest.raises(ProtocolError, match="ZeroDivisionError"):
            self.frames(
                self.HELLO + b"Traceback (most recent call last):\n  File x\nZeroDivisionError: division by zero\n"
            )
        with pytest.raises(ProtocolError, match="garbage"):
            self.frames(self.HELLO + b"H running 1.0\ngarbage\n")
        for bad in (
            b"D oops\n",
            b"D 0\n",
            b"D -1\n",
            b"D 01\n",
            b"D 2097152\n",
            b"H running\n",
            b"H ello\n",
            b"H running 1.0 extra\n",
            b"E Succeeded 2.0\n",
            b"H running 1e9\n",
            b"S not json\n",
            b"S {\n",
            b"X\n",
            b"\n",
            b"H running \xff\n",
        ):
            with pytest.raises(ProtocolError, match="not a frame"):
                self.frames(self.HELLO + bad)

    def test_a_stream_cut_mid_frame_ends_for_a_resume(self) -> None:
        assert self.frames(self.HELLO + b"D 10\nabc") == []
        assert self.frames(self.HELLO + b"H running 1.0\nH runn") == [("H", b"running 1.0")]
