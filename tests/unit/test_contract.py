"""The contract's names are defined once, and where they must be spelled again they agree."""

from __future__ import annotations

import json

from orchestrator.contract import CHECK_NAMES, FINAL_STATES, NodeState, RunState
from orchestrator.node import agent


def test_the_agent_writes_exactly_the_run_states() -> None:
    """The agent (which imports nothing of orch) spells out what state.json may say."""
    assert tuple(RunState) == agent.STATES
    assert set(agent.FINAL_STATES) == FINAL_STATES
    assert {s.value for s in RunState} <= {s.value for s in NodeState}


def test_a_state_reads_as_its_string_in_json_messages_and_lookups() -> None:
    assert json.dumps({"state": RunState.FAILED, RunState.RUNNING: 1}) == '{"state": "failed", "running": 1}'
    assert f"{NodeState.UNREACHABLE}" == "unreachable" and str(RunState.STOPPED) == "stopped"
    assert f"[{RunState.RUNNING:>9}]" == "[  running]"
    assert {"failed": 1}[NodeState.FAILED] == 1 and RunState.SUCCEEDED in {"succeeded"}
    assert "stopped" in FINAL_STATES and NodeState.STOPPED in FINAL_STATES and "running" not in FINAL_STATES
    assert RunState("failed") is RunState.FAILED and NodeState.FAILED == RunState.FAILED == "failed"


def test_the_checks_are_the_ones_the_contract_names() -> None:
    from orchestrator.preflight import checks

    assert tuple(checks.CHECKS) == CHECK_NAMES
    assert CHECK_NAMES == (
        "ssh",
        "clock",
        "timezone",
        "nccl_env",
        "rdma",
        "gpus",
        "software",
        "job",
        "ports",
        "container",
        "fabric",
    )


def test_every_check_name_the_probe_and_its_client_test_for_is_a_check() -> None:
    """node/probe.py and preflight/facts.py spell check names as strings (`"gpus" in want`): each
    must be one the contract names, so renaming a check cannot silently switch a fact off."""
    import ast
    from pathlib import Path

    root = Path(agent.__file__).resolve().parents[1]
    found: dict[str, set[str]] = {}
    for rel in ("node/probe.py", "preflight/facts.py"):
        tree = ast.parse((root / rel).read_text())
        found[rel] = {
            n.left.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Compare)
            and isinstance(n.left, ast.Constant)
            and isinstance(n.left.value, str)
            and any(isinstance(op, ast.In) for op in n.ops)
            and any(isinstance(c, ast.Name) and c.id == "want" for c in n.comparators)
        }
    assert found["node/probe.py"] and found["preflight/facts.py"], found  # the scan sees them
    for rel, names in found.items():
        assert names <= set(CHECK_NAMES), f"{rel} tests for {names - set(CHECK_NAMES)}, which no check is called"


def test_the_supervision_defaults_the_docs_state_are_the_codes() -> None:
    """run.supervise.Tunables is the one definition; CONTRACT.md and the user guide state its defaults."""
    import re
    from dataclasses import fields
    from pathlib import Path

    from orchestrator.run.supervise import Tunables

    root = Path(agent.__file__).resolve().parents[2]
    contract, guide = (root / "docs" / "CONTRACT.md").read_text(), (root / "docs" / "guide.md").read_text()
    stated = 0
    for f in fields(Tunables):
        var, default = Tunables.ENV[f.name], f"{f.default:g}"
        assert re.search(rf"`{var}` \({re.escape(default)}\)", contract), f"CONTRACT.md: {var} ({default})"
        for said in re.findall(rf"`{var}` \(([\d.]+) s\)", guide):
            assert said == default, f"docs/guide.md says {var} ({said} s), the code {default}"
            stated += 1
    assert stated >= 3, "docs/guide.md no longer states the supervision defaults users tune"
    assert Tunables.from_env(
        {"ORCH_UNREACHABLE_GRACE_S": "4", "ORCH_POLL_INTERVAL_S": "-1", "ORCH_STREAM_SILENT_S": "nan"}
    ) == Tunables(unreachable_grace_s=4.0)
    assert Tunables(unreachable_grace_s=4.0).silent_after_s == 2.0
