"""The walk metric's own arithmetic (tests/walk.py; the walk of `orch up` itself is
tests/integration/test_walk.py): stops, rooms and climbs as defined there, and the recording of
which function of orchestrator/ read the inventory."""

from __future__ import annotations

from orchestrator.config import inventory
from orchestrator.config.plan import make_plan
from tests.walk import Walk, function, recording


def test_stops_rooms_and_climbs() -> None:
    walk = Walk(("plan:make_plan", "plan:node_env", "container:run_argv", "plan:job_stop", "facts:pins", "plan:x"))
    assert walk.rooms == ("plan", "container", "facts")
    assert walk.path == ["plan", "container", "plan", "facts", "plan"]
    assert walk.climbs == [("container", "plan"), ("facts", "plan")]  # back into a room left before
    assert Walk(("a:f", "a:g", "b:h")).climbs == []
    assert function("make_plan.<locals>.<listcomp>") == "make_plan"
    assert function("Cluster.fan_out.<locals>.<lambda>") == "Cluster.fan_out"
    assert function("collect.<locals>.phase1") == "collect.<locals>.phase1"  # a named function is a stop


def test_the_recording_names_the_reading_functions_of_orch_and_leaves_the_classes_as_they_were() -> None:
    inv = inventory.parse("nodes:\n  - host: a\n  - host: b\njob: {args: {batch: 8}}\n", "t.yaml")
    before = inventory.Inventory.__getattribute__
    with recording() as stops:
        make_plan(inv, "r1")
        inv.nodes[0].name  # noqa: B018 - a read of this test's own: not a stop
    assert stops[0] == "config.plan:make_plan" and "config.jobenv:job_env" in stops
    assert not any(s.startswith("tests") for s in stops) and len(stops) == len(set(stops))
    assert inventory.Inventory.__getattribute__ is before
