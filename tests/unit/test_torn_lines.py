"""torchrun's `--tee` tears a worker's line where the worker wrote it in parts (a `print` under
PYTHONUNBUFFERED writes text and newline apart): its tail writes the half with the worker's
prefix, another worker's line lands right after it, and the rest comes later under the prefix
again. The agent's pump (`agent.Rejoin`) puts each worker's line back together before node.log
stamps it, so `orch logs`, the watchdog and the failure cause see each rank's own lines."""

from __future__ import annotations

import io
from pathlib import Path

from orchestrator.logs.lines import parse_node_line
from orchestrator.node import agent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def pumped(tmp_path: Path, data: bytes) -> list[str]:
    log = agent.NodeLog(str(tmp_path / "node.log"))
    log.pump(io.BytesIO(data), "out")
    return [ln.split(" ", 2)[2] for ln in (tmp_path / "node.log").read_bytes().decode().split("\n")[:-1]]


def test_the_recorded_tear_becomes_each_workers_own_line(tmp_path: Path) -> None:
    recorded = (FIXTURES / "torchrun_tee3_torn_line_stdout_torch2.14.txt").read_bytes()
    assert recorded.count(b"\n") == 2  # as torchrun wrote it: two lines, the first holding both workers
    assert pumped(tmp_path, recorded) == [
        "[default1]:[rank 1] seq=5 of 53",
        "[default0]:[rank 0] seq=5 of 53 and the rest",
    ]
    parsed = [parse_node_line(ln, "n1", 0, 0) for ln in (tmp_path / "node.log").read_text().splitlines()]
    assert [(p.local_rank, p.text) for p in parsed] == [(1, "seq=5 of 53"), (0, "seq=5 of 53 and the rest")]


def test_the_tear_seen_in_ci(tmp_path: Path) -> None:
    data = (
        b"[default0]:[rank 4] seq=5 of 53[default1]:[rank 5] seq=5 of 53\n"
        b"[default1]:[rank 5] seq=6 of 53\n"
        b"[default0]:\n"
    )
    assert pumped(tmp_path, data) == [
        "[default1]:[rank 5] seq=5 of 53",
        "[default1]:[rank 5] seq=6 of 53",
        "[default0]:[rank 4] seq=5 of 53",
    ]


def test_parts_of_one_worker_join_and_each_worker_keeps_its_own(tmp_path: Path) -> None:
    data = (
        b"[default0]:a[default0]:b[default1]:x[default0]:c\n"  # 0 wrote a, b, c\n; 1 wrote x before c
        b"[default1]:y\n"
        b"[trainer2]:quotes [default1]: as text\n"  # --role trainer: only its own role's prefixes cut
    )
    assert pumped(tmp_path, data) == [
        "[default0]:abc",
        "[default1]:xy",
        "[trainer2]:quotes [default1]: as text",
    ]


def test_lines_without_a_prefix_pass_as_they_are(tmp_path: Path) -> None:
    data = b"I1206 12:00:00 torchrun's own line [default0]: quoted\n[rank 0] no tee\nplain\n"
    assert pumped(tmp_path, data) == [
        "I1206 12:00:00 torchrun's own line [default0]: quoted",
        "[rank 0] no tee",
        "plain",
    ]


def test_a_part_never_ended_is_written_when_the_stream_ends(tmp_path: Path) -> None:
    data = b"[default0]:unfinished[default1]:whole\n[default1]:last without newline"
    assert pumped(tmp_path, data) == ["[default1]:whole", "[default1]:last without newline", "[default0]:unfinished"]


def test_a_part_that_never_ends_is_passed_on_in_pieces_of_at_most_1_mib(tmp_path: Path) -> None:
    bar = b"\r 42%|####   |" * 1000  # a progress bar's returns: no newline for a long time
    data = b"".join(b"[default0]:" + bar + b"[default1]:tick\n" for _ in range(100))
    lines = pumped(tmp_path, data)
    assert lines.count("[default1]:tick") == 100
    pieces = [ln for ln in lines if ln.startswith("[default0]:")]
    assert pieces and all(p.endswith(agent.LONG_LINE_MARK) for p in pieces[:-1])
    assert all(len(p.encode()) <= agent.MAX_LINE + len("[default0]:") + len(agent.LONG_LINE_MARK) for p in pieces)
    body = "".join(p.removeprefix("[default0]:").removesuffix(agent.LONG_LINE_MARK) for p in pieces)
    assert body == (bar * 100).decode()
