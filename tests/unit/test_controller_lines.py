"""The controller's own lines in the merged log: a straggler named by an attached `orch up` is a
line of merged.log (controller.log, merged after the nodes as node `orch`), in time order among
the nodes' lines, and stays there when `orch logs` rewrites merged.log (logs/stored.py, view.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.logs import stored
from orchestrator.logs.fetch import NodeSource
from orchestrator.logs.filters import LineFilter
from orchestrator.logs.lines import column_widths, format_ts, parse_node_line, to_json
from orchestrator.logs.telemetry import timing_window
from orchestrator.logs.view import RunLogs
from orchestrator.run.straggler import Detector
from orchestrator.store import RunDir
from trainer.logs import timing_line

T0 = 1_796_000_000.0
NODES = ("n1", "n2", "n3")


def node_log(rank: int, windows: int, slow: float) -> str:
    """Rank `rank`'s node.log: a timing line a second (n3's 0.2 s later, rank 2 slow), then `done`."""
    out = []
    for k in range(1, windows + 1):
        ts = T0 + k + 0.2 * (rank == 2)
        compute = slow if rank == 2 else 1.0
        out.append(f"{format_ts(ts)} out [default0]:[rank {rank}] {timing_line(1, k, 10, 80, 0.01, compute, 5.0)}")
        out.append(f"{format_ts(ts + 0.5)} out [default0]:[rank {rank}] after window {k}")
    return "\n".join(out) + "\n"


def make_run(tmp_path: Path, offsets_ms: dict[str, float]) -> tuple[RunLogs, str]:
    """A run of 3 nodes, rank 2 on n3 slow; the straggler named as `orch up` names it (the detector fed
    the timing lines in merge order, the line written to controller.log). Returns the view and the line."""
    run = RunDir(tmp_path / "run")
    (run.path / "nodes").mkdir(parents=True)
    sources = [NodeSource(n, i, i, f"/r/{n}", "python3", run.path / "nodes" / f"{n}.log") for i, n in enumerate(NODES)]
    for i, src in enumerate(sources):
        src.copy.write_text(node_log(i, 4, 3.0))
    det = Detector(share=0.8, windows=2, world_size=3)
    lines = sorted(
        (
            parse_node_line(raw, s.node, s.node_rank, s.base_rank)
            for s in sources
            for raw in s.copy.read_text().splitlines()
        ),
        key=lambda ln: ln.ts - offsets_ms.get(ln.node, 0) / 1000,
    )
    named = []
    for line in lines:
        found = timing_window(line, offsets_ms.get(line.node, 0.0) / 1000.0)
        if found is not None:
            named += det.window(found[0])
    assert [s.rank for s in named] == [2]
    stored.append_controller_line(run, named[0].log_ts, named[0].line())
    widths = column_widths([s.node for s in stored.merge_sources(run, sources)], 3)
    return RunLogs(run, None, sources, offsets_ms, None, widths), named[0].line()  # type: ignore[arg-type]


@pytest.mark.parametrize("pure", [False, True], ids=["c-merge", "python-merge"])
@pytest.mark.parametrize("offsets_ms", [{}, {"n1": 0.0, "n2": 0.0, "n3": 150.0}], ids=["no-offsets", "offsets"])
def test_the_straggler_line_is_in_merged_log_right_after_the_window_that_named_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pure: bool, offsets_ms: dict[str, float]
) -> None:
    if pure:
        monkeypatch.setenv("ORCH_PURE_PYTHON", "1")
    elif not stored.fast_merge_available():
        pytest.skip("the C merge is not built here")
    logs, said = make_run(tmp_path, offsets_ms)
    text = b"".join(logs.plain()).decode()
    assert logs.run.merged_log.read_text() == text  # `orch logs RUN` rewrote merged.log, with the line
    rows = text.splitlines()
    at = [i for i, row in enumerate(rows) if said in row]
    assert len(at) == 1
    row = rows[at[0]]
    assert row.split()[1:3] == ["orch", "-"] and row.endswith(" " + said)
    # the window that named it is window 2 (windows: 2): its last line (n3's, 0.2 s late; with the
    # offset, n3's clock is 150 ms ahead: 0.05 s late) comes right before, every later line after
    assert "[rank" not in rows[at[0] - 1] and "timing epoch 1 batch 2 " in rows[at[0] - 1]
    assert rows[at[0] - 1].split()[1] == "n3"
    assert all("batch 1 " not in r and "batch 2 " not in r and "window 1" not in r for r in rows[at[0] + 1 :])
    assert len(rows) == 3 * 8 + 1


def test_the_line_survives_the_general_merge_and_json_says_it_is_the_controllers(tmp_path: Path) -> None:
    logs, said = make_run(tmp_path, {})
    plain = b"".join(logs.plain()).decode()
    everything = list(logs.lines(LineFilter()))
    assert logs.run.merged_log.read_text() == plain  # the general path writes the same merged.log
    mine = [ln for ln in everything if ln.text == said]
    assert len(mine) == 1 and mine[0].node == "orch" and mine[0].stream == "orch" and mine[0].rank is None
    obj = json.loads(to_json(mine[0]))
    assert (obj["node"], obj["node_rank"], obj["rank"], obj["line"]) == ("orch", None, None, said)
    only_n1 = list(logs.lines(LineFilter(nodes={"n1"})))
    assert only_n1 and {ln.node for ln in only_n1} == {"n1"}  # --node keeps to the nodes named
    grep = [ln.text for ln in logs.lines(LineFilter(pattern=__import__("re").compile("straggler")))]
    assert grep == [said]


def test_without_controller_lines_the_merge_is_the_nodes_alone(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    src = [NodeSource("n1", 0, 0, "/r", "python3", tmp_path / "n1.log")]
    assert stored.merge_sources(run, src) == src
    stored.append_controller_line(run, T0, "straggler: x")
    assert [s.node for s in stored.merge_sources(run, src)] == ["n1", "orch"]
    assert (run.controller_log.stat().st_mode & 0o777) == 0o600


def test_a_node_called_orch_keeps_its_name_and_the_controller_takes_another() -> None:
    assert stored.controller_name(["n1", "n2"]) == "orch"
    assert stored.controller_name(["orch", "n2"]) == "[orch]"
