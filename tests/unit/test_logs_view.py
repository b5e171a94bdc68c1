"""When `orch logs` says it orders lines by clock offsets: only when they differ enough between the
run's nodes to reorder lines (or with -v), and briefly on a large cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import render
from orchestrator.logs.fetch import NodeSource
from orchestrator.logs.view import REORDER_MS, RunLogs


def view(offsets: dict[str, float], nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> RunLogs:
    sources = [NodeSource(n, i, i, f"/r/{n}", "python3", Path(f"/nowhere/{n}.log")) for i, n in enumerate(nodes)]
    return RunLogs(None, None, sources, offsets, "check.json" if offsets else None, (8, 3))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "offsets, reorders",
    [
        ({"n1": 0.04, "n2": -0.03, "n3": 0.0}, False),  # what loopback nodes measure: "+0.0 ms" each
        ({"n1": 25.0, "n2": 25.3, "n3": 24.9}, False),  # every node equally off the reference: no reordering
        ({"n2": REORDER_MS}, True),  # a node without an offset counts 0
        ({"n1": 0.2, "n2": -1.0}, True),
        ({}, False),
    ],
)
def test_offsets_matter_when_they_differ_between_nodes(offsets: dict[str, float], reorders: bool) -> None:
    assert view(offsets).reorders is reorders


def test_the_note_names_every_node_on_a_small_run_and_the_extremes_on_a_large_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    render.skew_note({"n1": 0.5, "n2": 12.25}, "check.json")
    assert "n1 +0.5 ms, n2 +12.2 ms" in " ".join(capsys.readouterr().err.split())
    many = {f"gpu{i:02d}": float(i) for i in range(32)}
    render.skew_note(many, "check.json")
    err = " ".join(capsys.readouterr().err.split())
    assert "from gpu00 +0.0 ms to gpu31 +31.0 ms over 32 nodes (-v: each)" in err and "gpu15" not in err
    render.skew_note(many, "check.json", every=True)
    assert "gpu15 +15.0 ms" in capsys.readouterr().err


def test_the_docs_and_the_help_give_the_threshold_the_code_uses() -> None:
    from orchestrator.cli.commands import LOGS_HELP

    repo = Path(__file__).resolve().parents[2]
    said = f"differ by {REORDER_MS:g} ms or more"
    for text in ((repo / "docs" / "CONTRACT.md").read_text(), (repo / "docs" / "guide.md").read_text(), LOGS_HELP):
        assert said in " ".join(text.split())
