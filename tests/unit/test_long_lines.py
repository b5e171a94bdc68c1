"""Long lines from a job, and a node log that does not stop: the node agent splits a line at 1 MiB
(marked, between characters), the controller's copy takes data in time linear in its size and
holds no line longer than 2 MiB, and the log reader never reports an agent as vanished because
it ended while a long drain was under way.

The timings are printed (`pytest -s`), never asserted: the machine is shared."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.logs import fetch
from orchestrator.logs.fetch import LocalCopy, read_frames
from orchestrator.logs.lines import parse_node_line
from orchestrator.node import agent, reader

MB = 1 << 20
CHUNK = 64 << 10


def test_the_agent_splits_a_long_line_at_1_mib_between_characters(tmp_path: Path) -> None:
    text = ("x" * (MB - 1) + "字" + "y" * (MB + 5)).encode()  # the 3-byte 字 straddles the 1 MiB cut
    log = agent.NodeLog(str(tmp_path / "node.log"))
    log.pump(io.BytesIO(text + b"\nshort\nlast without newline"), "out")
    lines = (tmp_path / "node.log").read_bytes().decode("utf-8").split("\n")[:-1]
    pieces = [parse_node_line(ln, "n", 0, 0).text for ln in lines]
    assert [p.endswith(agent.LONG_LINE_MARK) for p in pieces] == [True, True, False, False, False]
    assert "".join(p.removesuffix(agent.LONG_LINE_MARK) for p in pieces[:3]) == text.decode()
    assert "\ufffd" not in "".join(pieces)  # no character was cut in two
    assert all(len(p.removesuffix(agent.LONG_LINE_MARK).encode()) <= agent.MAX_LINE for p in pieces)
    assert pieces[3:] == ["short", "last without newline"]


@pytest.mark.parametrize(
    ("data", "cut"),
    [
        (b"", 0),
        (b"a", 1),
        ("a字".encode(), 4),
        ("a字".encode()[:3], 1),
        ("a字".encode()[:2], 1),
        (b"\xff" * 5, 5),
        (b"a\x80\x80", 3),
        ("a😀".encode(), 5),
        ("a😀".encode()[:-1], 1),
    ],
)
def test_utf8_boundary_cuts_only_a_character_left_unfinished(data: bytes, cut: int) -> None:
    assert agent.utf8_boundary(data) == cut


def test_64_mb_in_64_kib_chunks_are_taken_in_linear_time_and_a_line_is_capped(tmp_path: Path) -> None:
    """One 64 MB line without a newline (what no agent writes), then its newline and a short line:
    the copy holds every byte, what it passes on is at most MAX_LINE (+ the mark) a line."""
    copy = LocalCopy(tmp_path / "n.log")
    chunk = b"z" * CHUNK
    start = time.perf_counter()
    out: list[bytes] = []
    for _ in range(1024):
        out += copy.feed(chunk)
    out += copy.feed(b"\n2026-11-30T09:32:05.123456Z out after\n")
    took = time.perf_counter() - start
    print(f"LocalCopy.feed: 64 MB in 64 KiB chunks in {took:.3f} s")
    assert copy.offset == 64 * MB + len(b"\n2026-11-30T09:32:05.123456Z out after\n")
    assert (tmp_path / "n.log").stat().st_size == copy.offset
    assert max(len(x) for x in out) <= fetch.MAX_LINE + CHUNK + len(fetch.LONG_LINE_MARK)
    assert sum(len(x.removesuffix(fetch.LONG_LINE_MARK)) for x in out[:-1]) == 64 * MB
    assert out[-1] == b"2026-11-30T09:32:05.123456Z out after"
    assert all(x.endswith(fetch.LONG_LINE_MARK) for x in out[:-2])
    copy.close()


def test_a_line_split_across_frames_is_one_line_and_lines_split_only_at_newlines(tmp_path: Path) -> None:
    copy = LocalCopy(tmp_path / "n.log")
    assert copy.feed(b"a\rb") == []
    assert copy.feed(b"c\nd") == [b"a\rbc"]
    assert copy.feed(b"\n") == [b"d"]
    copy.close()
    assert LocalCopy(tmp_path / "n.log").offset == 7


def test_64_mb_of_frames_parse_in_linear_time() -> None:
    frame = b"D %d\n" % CHUNK + b"q" * CHUNK
    data = b"ORCH-LOG-READER n\n" + frame * 1024 + b"E succeeded 1.0\n"
    start = time.perf_counter()
    sizes = [len(p) for k, p in read_frames(io.BytesIO(data), "n") if k == "D"]
    print(f"read_frames: 64 MB in 64 KiB frames in {time.perf_counter() - start:.3f} s")
    assert sizes == [CHUNK] * 1024


def test_the_reader_does_not_call_an_agent_vanished_that_ended_while_the_log_drained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """state.json said running when the poll began; by the time the log was drained the agent had
    written its final state and exited. Judged on the state read before, the status frame said
    `agent_alive: false` and `orch up` failed a run that succeeded."""
    (tmp_path / agent.LOG).write_bytes(b"2026-11-30T09:32:05.000001Z out the long line\n")
    final = {"state": "succeeded", "exit_code": 0, "finished_at": 2.0}
    (tmp_path / agent.STATE).write_text(json.dumps(final))
    reads: list[int] = []

    def read_json(path: str) -> dict[str, Any]:  # the first read of the poll: still running
        reads.append(1)
        return {"state": "running", "agent_pid": 1} if len(reads) == 1 else dict(final)

    monkeypatch.setattr(reader.agent, "read_json", read_json)
    out = io.BytesIO()
    monkeypatch.setattr(reader.sys, "stdout", io.TextIOWrapper(out))
    reader.stream(str(tmp_path), 0, 0.01, False, True, "n")
    frames = list(read_frames(io.BytesIO(out.getvalue()), "n"))
    statuses = [json.loads(p) for k, p in frames if k == "S"]
    assert [s.get("agent_alive") for s in statuses if s["state"] == "running"] == []
    assert statuses[-1]["state"] == "succeeded" and frames[-1][0] == "E"


class ShortWrites:
    """A raw file whose write() takes at most 7 bytes a call, as write(2) may (a signal, a nearly
    full disk): the caller must write the rest."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh

    def write(self, data: Any) -> int:
        return self.fh.write(bytes(data[:7]))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fh, name)


def test_a_short_write_loses_nothing_in_node_log_or_the_local_copy(tmp_path: Path) -> None:
    log = agent.NodeLog(str(tmp_path / "node.log"))
    log.fh = ShortWrites(log.fh)
    log.write("out", "[rank 2] seq=62 of 80")
    assert (tmp_path / "node.log").read_bytes().endswith(b" out [rank 2] seq=62 of 80\n")
    copy = LocalCopy(tmp_path / "n.log")
    copy.fh = ShortWrites(copy.fh)
    assert copy.feed(b"first line\nsecond line\n") == [b"first line", b"second line"]
    copy.close()
    assert (tmp_path / "n.log").read_bytes() == b"first line\nsecond line\n"
    assert LocalCopy(tmp_path / "n.log").offset == 23


def test_node_log_stamps_each_line_under_the_lock_that_orders_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stdout and stderr pumps are two threads: a stamp taken before the lock lets the later
    stamp reach the file first, and the merge (a node's lines in file order) then prints a line
    after another node's later one. `orch logs --follow` on 4 nodes showed it: node1 `seq=3`
    came out after node2's line stamped 0.14 ms later."""
    log = agent.NodeLog(str(tmp_path / "node.log"))
    held: list[bool] = []
    real = agent.utc_now

    def stamp(when: float | None = None) -> str:
        held.append(log.lock.locked())
        return real(when)

    monkeypatch.setattr(agent, "utc_now", stamp)
    log.write("out", "a")
    log.write("err", "b")
    assert held == [True, True]
    stamps = [ln.split(" ", 1)[0] for ln in (tmp_path / "node.log").read_text().splitlines()]
    assert stamps == sorted(stamps)
