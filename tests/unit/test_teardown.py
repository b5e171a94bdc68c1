"""What a node prints while orch stops it stays out of `orch up`'s live view (recorded node logs,
tests/fixtures/nodelog); one line per node says it stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import render
from orchestrator.logs.lines import LogLine, parse_node_line
from orchestrator.logs.teardown import NodeStopped, QuietStop
from orchestrator.node.agent import (
    EXITED,
    EXITED_LINE,
    STARTING_LINE,
    STOPPING,
    STOPPING_PREFIX,
)
from orchestrator.node.agent import (
    STARTING_TEXT as STARTING,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nodelog"


def lines(name: str, node: str, node_rank: int = 0) -> list[LogLine]:
    return [parse_node_line(r, node, node_rank, 2 * node_rank) for r in (FIXTURES / name).read_text().splitlines()]


def shown(feed: list[LogLine]) -> tuple[list[LogLine], list[NodeStopped]]:
    quiet = QuietStop()
    out, stops = [], []
    for line in feed:
        got = quiet.feed(line)
        if isinstance(got, NodeStopped):
            stops.append(got)
        elif got is not None:
            out.append(got)
    stops += list(quiet.pending())
    return out, stops


def test_ctrl_c_shows_the_run_then_one_line_per_node_not_its_tracebacks() -> None:
    recorded = lines("sigint_stop_node0_torch2.14.log", "n0")
    assert any(ln.text.endswith("SignalException: Process 20038 got signal: 15") for ln in recorded)
    out, stops = shown(recorded)
    stop_line = next(i for i, ln in enumerate(recorded) if ln.text.startswith("agent received SIGTERM"))
    assert out == recorded[:stop_line] and out[-1].text == "step 1 sum=14 ok"  # everything before the stop
    assert not any("SignalException" in ln.text or "Traceback" in ln.text or "death signal" in ln.text for ln in out)
    # 33 lines between the agent's stop line and its last: torchrun's warnings and traceback, the SIGKILL
    assert stops == [NodeStopped("n0", "SIGTERM", 33, -9, "SIGKILL", 5.5)]
    assert len(out) + 1 + 33 + 1 == len(recorded)


def test_a_rank_that_loses_its_peer_to_the_stop_of_another_node_is_teardown_too() -> None:
    """A 4-node Ctrl-C over sshd: node3's agent got the stop first; node2's rank lost its peer and
    printed a traceback before node2's own stop line came. Both are the stop's doing."""
    a = lines("sigint_4nodes_node3_stopped-first_torch2.14.log", "node3", 2)
    b = lines("sigint_4nodes_node2_peer-lost-first_torch2.14.log", "node2", 1)
    assert any("Connection closed by peer" in ln.text for ln in b[:23])  # before node2's stop line
    out, stops = shown(sorted(a + b, key=lambda ln: ln.ts))
    assert not any("Traceback" in ln.text or "Connection closed" in ln.text for ln in out)
    assert [ln.text for ln in out if ln.node == "node2"][-1] == "step 4 sum=26 ok"
    assert {s.node: (s.received, s.held, s.exit_code) for s in stops} == {
        "node3": ("SIGTERM", 31, 1),
        "node2": ("SIGTERM", 46, 1),
    }


def test_after_a_first_failure_it_and_what_came_before_the_stop_are_shown() -> None:
    """One run, two nodes: n1's rank 3 raised, n0's ranks lost their peer and n0's torchrun gave
    up on its own, then orch's teardown stopped n0. All of it before the stop is the news."""
    failing = lines("raise_rank3_failing-node_torch2.14.log", "n1", 1)
    other = lines("raise_rank3_other-node_torch2.14.log", "n0", 0)
    out, stops = shown(sorted(failing + other, key=lambda ln: ln.ts))
    assert [ln for ln in out if ln.node == "n1"] == failing  # the first failure, whole
    assert any(ln.node == "n0" and "Root Cause" in ln.text for ln in out)
    assert stops == [NodeStopped("n0", "SIGTERM", 0, -15, "SIGTERM", 0.6)]


def test_a_stop_whose_end_is_not_in_the_log_is_still_said() -> None:
    recorded = lines("sigint_stop_node0_torch2.14.log", "n0")[:-3]
    _out, stops = shown(recorded)
    assert len(stops) == 1 and stops[0].exit_code is None and stops[0].held == 31


def test_a_run_that_nobody_stopped_is_shown_whole() -> None:
    recorded = lines("raise_rank3_failing-node_torch2.14.log", "n1", 1)
    out, stops = shown(recorded)
    assert out == recorded and stops == []


def test_a_relaunch_after_the_teardown_is_shown_again() -> None:
    """A retry follows the node logs on from where the last attempt's copy ended: when that tail
    still holds the last teardown, the next launch's lines are news again from its start line."""
    first = lines("sigint_stop_node0_torch2.14.log", "n0")
    start = LogLine(
        first[-1].ts + 1,
        "n0",
        0,
        None,
        None,
        "orch",
        STARTING.format(pid=7, host="vm", attempt=" attempt 2", argv="python -m torch.distributed.run", cwd="/w"),
    )
    step = LogLine(first[-1].ts + 2, "n0", 0, 0, 0, "out", "step 0 sum=10 ok")
    out, stops = shown(first + [start, step])
    assert out[-2:] == [start, step] and len(stops) == 1


def test_the_agent_writes_the_lines_the_controller_reads() -> None:
    from orchestrator.node import agent

    assert agent.STARTING == "starting"  # the state state.json starts in, not the line's format
    assert all(
        STARTING_LINE.match(STARTING.format(pid=1, host="gpu-1", attempt=a, argv="x", cwd="/"))
        for a in ("", " attempt 3")
    )
    assert STARTING_LINE.match(lines("sigint_stop_node0_torch2.14.log", "n0")[0].text)  # as recorded
    line = STOPPING.format(signal="SIGTERM", pgid=4242)
    assert line.startswith(STOPPING_PREFIX)
    m = EXITED_LINE.match(EXITED.format(code=-9, signal=" (SIGKILL)", state="stopped"))
    assert m is not None and m.groups() == ("-9", "SIGKILL", "stopped")
    assert EXITED_LINE.match(EXITED.format(code=0, signal="", state="succeeded"))


@pytest.mark.parametrize(
    "stop, text",
    [
        (
            NodeStopped("n0", "SIGTERM", 44, -9, "SIGKILL", 5.5),
            "n0: stopped 5.5 s after its agent got SIGTERM (torchrun ended by SIGKILL); the 44 lines it printed "
            "meanwhile are in its log: orch logs r1 --node n0",
        ),
        (
            NodeStopped("n1", "SIGTERM", 0, 1, None, 0.3),
            "n1: stopped 0.3 s after its agent got SIGTERM (torchrun exited with code 1)",
        ),
        (
            NodeStopped("n2", "SIGTERM", 1),
            "n2: stopping (its end is not in the log yet); the line it printed meanwhile "
            "is in its log: orch logs r1 --node n2",
        ),
        (
            NodeStopped("n3", None, 12, 1, None),
            "n3: ended while the run was being stopped (torchrun exited with code 1); "
            "the 12 lines it printed meanwhile are in its log: orch logs r1 --node n3",
        ),
    ],
)
def test_the_line_that_says_a_node_stopped(stop: NodeStopped, text: str) -> None:
    from rich.text import Text

    assert Text.from_markup(render.node_stopped_text(stop, "r1")).plain == text
