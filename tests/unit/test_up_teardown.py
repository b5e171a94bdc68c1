"""`orch up`'s attempt on fakes: whatever ends it (the run's own end, Ctrl-C, `orch down`, a
start that failed, an error of orch itself), every node that may run is stopped once and run.json
says how the attempt ended; `UpOutcome.result` is a typed name that reads as its string."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator import up
from orchestrator.config import inventory
from orchestrator.contract import NodeState
from orchestrator.errors import ConnectionLost, TransportError
from orchestrator.run.agents import NodeStatus, StopResult
from orchestrator.store import NodeRecord, RunStore
from orchestrator.transport import GroupResult

TEXT = """\
name: c
nodes:
  - host: gpu[01-02]
    gpus: 2
job:
  module: trainer
  workdir: /srv/job
  args:
    data: /data/coco.yaml
"""


class FakeCluster:
    def __init__(self, inv: inventory.Inventory) -> None:
        self.inv = inv

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Nodes:
    """start_all / stop_all / status_* on no node: every start succeeds, every stop is recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, start_failed: Mapping[str, Exception] | None = None) -> None:
        self.stops: list[list[str]] = []
        self.failed = dict(start_failed or {})
        monkeypatch.setattr(up, "Cluster", FakeCluster)
        monkeypatch.setattr(up, "start_all", self.start_all)
        monkeypatch.setattr(up, "stop_all", self.stop_all)
        monkeypatch.setattr(up, "status_all", lambda cluster, records, timeout=0: GroupResult({}))
        monkeypatch.setattr(up, "status_node", lambda *a, **k: NodeStatus(NodeState.RUNNING, agent_alive=True))
        monkeypatch.setattr(up, "_stream_logs", lambda *a, **k: None)

    def start_all(self, cluster: FakeCluster, plan: Any, **kw: Any) -> GroupResult[NodeStatus]:
        return GroupResult(
            {p.node.name: self.failed.get(p.node.name) or NodeStatus(NodeState.RUNNING, pid=7) for p in plan.nodes}
        )

    def stop_all(self, cluster: FakeCluster, records: Sequence[NodeRecord], grace: float) -> GroupResult[StopResult]:
        self.stops.append([r.node for r in records])
        return GroupResult({r.node: StopResult(NodeStatus(NodeState.STOPPED, exit_code=-15)) for r in records})


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    inv = inventory.parse(TEXT, "c.yaml")
    return inv, RunStore().create(inv, "r1")


def attempt(inv: inventory.Inventory, rd: Any, detach: bool = False) -> up.UpOutcome:
    now = time.monotonic()
    return up._attempt(up.Quiet(), rd, inv, None, detach, now, now, 1)


def recorded(rd: Any) -> dict[str, Any]:
    return dict(json.loads((rd.path / "run.json").read_text()))


class Injected(RuntimeError):
    pass


def test_an_error_before_supervision_still_stops_every_node_and_records_the_end(
    monkeypatch: pytest.MonkeyPatch, run: Any
) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch)

    def broken(*a: Any, **k: Any) -> None:
        raise Injected("the watchdog cannot start")

    monkeypatch.setattr(up, "Watchdog", broken)
    with pytest.raises(Injected):
        attempt(inv, rd)
    assert nodes.stops == [["gpu01", "gpu02"]]
    data = recorded(rd)
    assert data["state"] == "stopped" and {r["state"] for r in data["nodes"]} == {"stopped"}


def test_an_error_in_the_supervisor_stops_every_node_once_and_records_the_end(
    monkeypatch: pytest.MonkeyPatch, run: Any
) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch)

    def observe(self: Any) -> Any:
        raise Injected("observe broke")

    monkeypatch.setattr(up.Pushed, "observe", observe)
    with pytest.raises(Injected):
        attempt(inv, rd)
    assert nodes.stops == [["gpu01", "gpu02"]]  # the supervisor's own teardown; not a second stop
    assert recorded(rd)["state"] == "stopped"


def test_a_supervisor_that_never_ran_its_loop_leaves_the_stop_to_the_attempt(
    monkeypatch: pytest.MonkeyPatch, run: Any
) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch)

    def broken_run(self: Any) -> Any:
        raise Injected("before its try")

    monkeypatch.setattr(up.Supervisor, "run", broken_run)
    with pytest.raises(Injected):
        attempt(inv, rd)
    assert nodes.stops == [["gpu01", "gpu02"]]
    assert recorded(rd)["state"] == "stopped"


def test_ctrl_c_while_starting_stops_every_node_and_records_it(monkeypatch: pytest.MonkeyPatch, run: Any) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch)

    def interrupted(*a: Any, **k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(up, "start_all", interrupted)
    out = attempt(inv, rd)
    assert out.result == up.UpResult.INTERRUPTED and out.teardown_s is not None and out.not_stopped == {}
    assert nodes.stops == [["gpu01", "gpu02"]] and recorded(rd)["state"] == "stopped"


def test_a_failed_start_stops_the_rest_and_records_why(monkeypatch: pytest.MonkeyPatch, run: Any) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch, {"gpu02": TransportError("gpu02", "unreachable", "connection refused")})
    out = attempt(inv, rd)
    assert out.result == "start_failed" and out.never_started == {"gpu02": "gpu02: connection refused"}
    assert nodes.stops == [["gpu01", "gpu02"]] and out.not_stopped == {}
    data = recorded(rd)
    assert data["state"] == "failed" and data["start_failures"] == {"gpu02": "gpu02: connection refused"}


def test_a_detached_run_is_left_running(monkeypatch: pytest.MonkeyPatch, run: Any) -> None:
    inv, rd = run
    nodes = Nodes(monkeypatch)
    out = attempt(inv, rd, detach=True)
    assert out.result == "detached" and nodes.stops == [] and recorded(rd)["state"] == "running"


def test_a_connection_lost_under_the_start_is_not_a_node_that_never_started() -> None:
    """The start command may have run: its stop must be confirmed. The error's type says so, not
    its text."""
    from orchestrator.transport.ssh import SSHTransport

    lost = SSHTransport._lost(type("T", (), {"node_name": "gpu2"})())  # type: ignore[arg-type]
    assert isinstance(lost, ConnectionLost) and lost.kind == "unreachable"
    assert up.never_started({"gpu2": lost, "gpu3": ConnectionLost("gpu3", "reset by peer")}) == {}


def test_the_outcome_names_are_their_strings() -> None:
    from orchestrator.cli.commands import UP_EXIT

    assert {r.value for r in up.UpResult} == set(UP_EXIT)
    assert json.dumps({"result": up.UpResult.START_FAILED}) == '{"result": "start_failed"}'
    assert f"{up.UpResult.FAILED}" == "failed" and up.UpResult.FAILED == "failed"
    assert set(up.RETRIED) == {up.UpResult.FAILED, up.UpResult.START_FAILED}
