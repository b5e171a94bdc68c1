"""bench/broadcast.py's report: the ratios it writes, with the star's column or without it (a run of
`--methods chain` alone has no star's one-node median to divide by: it leaves that column out)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

import bench.broadcast as broadcast


def test_the_report_of_one_method_alone_has_no_star_column(monkeypatch: pytest.MonkeyPatch) -> None:
    written: dict[str, Any] = {}
    monkeypatch.setattr(broadcast, "write", lambda name, result: written.setdefault(name, result))
    args = argparse.Namespace(rate="100mbit", sync_mb=40.0, files=4, parallel=4, reps=2, quick=False)
    samples = {"sync": {"chain": {1: [4.0, 4.2], 8: [4.6, 4.8]}}}
    details: dict[str, Any] = {"sync": {"chain": {1: [{}, {}], 8: [{}, {}]}}}
    payload = {"sync": 40_000_000, "image": 30_000_000}
    out = broadcast.report(args, [1, 8], ["sync"], ["chain"], samples, details, payload, 10.0, [1, 1])
    row = out["times"]["sync"]["chain"]["8"]
    assert row["ratio_to_1"] == pytest.approx(4.7 / 4.1) and row["ratio_to_star_1"] is None
    assert [s["peer"] for s in out["summary"]] == [4.1]  # against the same method's one node only
    assert written == {"broadcast": out}


def test_with_the_star_each_n_is_also_against_the_stars_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broadcast, "write", lambda name, result: None)
    args = argparse.Namespace(rate="100mbit", sync_mb=40.0, files=4, parallel=4, reps=1, quick=False)
    samples = {"sync": {"star": {1: [4.0], 8: [30.0]}, "chain": {1: [5.0], 8: [6.0]}}}
    details: dict[str, Any] = {"sync": {m: {1: [{}], 8: [{}]} for m in ("star", "chain")}}
    out = broadcast.report(
        args, [1, 8], ["sync"], ["star", "chain"], samples, details, {"sync": 1, "image": 1}, 1.0, [1, 1]
    )
    assert out["times"]["sync"]["chain"]["8"]["ratio_to_star_1"] == pytest.approx(1.5)
    assert sorted(s["ratio"] for s in out["summary"]) == pytest.approx([1.2, 1.5, 7.5])
