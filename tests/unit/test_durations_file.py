"""tests/durations.json, the order the slow tests are handed out in (tests/conftest.py): a map from
node id to seconds that the scheduler can read."""

from __future__ import annotations

import json
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"


def test_the_durations_are_seconds_of_tests_of_this_repository() -> None:
    took = json.loads(DURATIONS.read_text())
    assert took and all(isinstance(v, (int, float)) and v > 0 for v in took.values())
    for nodeid in took:
        path = nodeid.split("::", 1)[0]
        assert nodeid.startswith("tests/") and "::" in nodeid, nodeid
        assert (DURATIONS.parent.parent / path).is_file(), f"{nodeid}: no such test file (refresh tests/durations.json)"
