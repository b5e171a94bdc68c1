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
    assert CHECK_NAMES == ("ssh", "clock", "timezone", "nccl_env", "rdma", "gpus", "software", "job", "ports",
                           "fabric")
