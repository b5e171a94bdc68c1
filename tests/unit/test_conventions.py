"""Issue #25, the conventions users bring: state found from any shell (`~/.orch`), `orch runs`,
run id prefixes and `latest`, overrides on the command line, and the report's summary."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store import orch_home


def test_orch_home_defaults_to_the_users_home_not_the_current_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`orch logs -f` from another shell in another directory finds the same runs (SkyPilot's ~/.sky)."""
    monkeypatch.delenv("ORCH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)
    assert orch_home() == tmp_path / "user" / ".orch"
    monkeypatch.setenv("ORCH_HOME", "~/elsewhere")
    assert orch_home() == tmp_path / "user" / "elsewhere"
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "explicit"))
    assert orch_home() == tmp_path / "explicit"


def test_a_test_that_asks_for_no_home_never_reaches_the_real_one() -> None:
    """The conftest guard: every test (and every orch it starts) has a private $ORCH_HOME."""
    home = orch_home()
    assert home != Path("~/.orch").expanduser()
    assert Path(os.environ["ORCH_HOME"]) == home
    assert "test_a_test_that_asks_for_no_home" in home.name


# ----------------------------------------------------------------------------- orch runs, RUN prefixes

REPO = Path(__file__).resolve().parents[2]
V100 = REPO / "inventory" / "v100.yaml"


def _runs(home: Path) -> dict[str, Any]:
    """Four recorded runs of the v100 inventory (4 nodes × 8), oldest first: a success, a failure
    on attempt 2 of 3, a stopped one and one still running."""
    from orchestrator.config import inventory
    from orchestrator.store import RunStore

    inv = inventory.load(V100)
    store = RunStore(home)
    nodes = [{"node": f"v100-{i}", "nproc": 8} for i in range(1, 5)]
    made = {}
    for i, (run_id, fields) in enumerate([
        ("20261201-093000-v100", {"state": "succeeded", "wall_s": 52.4}),
        ("20261201-101500-v100", {"state": "failed", "wall_s": 130.0, "attempt": 2, "max_attempts": 3,
                                  "first_failure": {"node": "v100-3", "rank": 17, "exit_code": 1,
                                                    "reason": "exit code 1", "cause": "torch.OutOfMemoryError: "
                                                    "CUDA out of memory. Tried to allocate 2.00 GiB"}}),
        ("20261201-101533-v100", {"state": "stopped", "wall_s": 7.25}),
        ("20261201-193300-v100", {"state": "running"}),
    ]):
        run = store.create(inv, run_id)
        made[run_id] = run.update(created=round(time.time()) - 4000.0 + 1000 * i, nodes=nodes, **fields)
    return made


def test_orch_runs_lists_newest_first_with_state_attempt_wall_time_shape_and_failure(orch_home: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    _runs(orch_home)
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if "20261201-" in line]
    assert [r.split()[1] for r in rows] == ["20261201-193300-v100", "20261201-101533-v100",
                                           "20261201-101500-v100", "20261201-093000-v100"]
    assert "running for" in rows[0]
    assert "52.4 s" in rows[3] and "succeeded" in rows[3] and "4×8" in rows[3]
    assert "2/3" in rows[2] and "v100-3 rank 17: torch.OutOfMemoryError" in rows[2]


def test_orch_runs_json_and_the_limit(orch_home: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli import cli

    made = _runs(orch_home)
    out = json.loads(CliRunner().invoke(cli, ["runs", "--json", "-n", "2"]).stdout)
    assert [r["run"] for r in out["runs"]] == ["20261201-193300-v100", "20261201-101533-v100"]
    assert out["left_out"] == 2
    every = json.loads(CliRunner().invoke(cli, ["runs", "--all", "--json"]).stdout)
    assert every["left_out"] == 0 and len(every["runs"]) == 4
    failed = every["runs"][2]
    assert failed == {**failed, "state": "failed", "attempt": 2, "max_attempts": 3, "wall_s": 130.0,
                      "nodes": 4, "procs": 32, "procs_per_node": [8] * 4, "running": False,
                      "inventory": "v100", "started": made["20261201-101500-v100"]["created"]}
    assert every["runs"][0]["running"] is True and every["runs"][0]["wall_s"] > 0


def test_runs_default_count_is_defined_once() -> None:
    from orchestrator.cli import commands
    from orchestrator.run.history import DEFAULT_LIMIT

    assert commands.DEFAULT_RUNS == DEFAULT_LIMIT


@pytest.mark.parametrize(("given", "expected"), [
    ("20261201-093000-v100", "20261201-093000-v100"),
    ("20261201-09", "20261201-093000-v100"),
    ("2026120", None),                          # all four
    ("20261201-1015", None),                    # two
    ("20261201-10153", "20261201-101533-v100"),
    ("1933", "20261201-193300-v100"),           # the date left out
    ("latest", "20261201-193300-v100"),
])
def test_any_unique_prefix_names_a_run_and_an_ambiguous_one_lists_the_candidates(
        orch_home: Path, given: str, expected: str | None) -> None:
    from orchestrator.errors import UsageError
    from orchestrator.store import RunStore

    _runs(orch_home)
    if expected is not None:
        assert RunStore().get(given).run_id == expected
        return
    with pytest.raises(UsageError) as info:
        RunStore().get(given)
    assert info.value.exit_code == 2 and "ambiguous" in info.value.message
    assert all(r in info.value.message for r in RunStore().matching(given) for r in [r.run_id])


def test_a_prefix_works_wherever_a_run_is_taken_and_an_ambiguous_one_exits_2(
        orch_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    _runs(orch_home)
    with pytest.raises(SystemExit) as info:
        main(["status", "--json", "1015"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "20261201-101500-v100" in err and "20261201-101533-v100" in err
    with pytest.raises(SystemExit) as info:
        main(["logs", "20261201-0930"])
    assert info.value.code == 0


def test_latest_cannot_be_a_run_id(orch_home: Path) -> None:
    from orchestrator.config import inventory
    from orchestrator.errors import UsageError
    from orchestrator.store import RunStore

    with pytest.raises(UsageError):
        RunStore().create(inventory.load(V100), "latest")
