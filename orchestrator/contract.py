"""The names docs/CONTRACT.md promises, defined once: checks, check statuses, run and node states,
exit codes. Every layer takes them from here.

The node programs (`orchestrator/node/`) import nothing of orch: the agent spells the run states
out for state.json, and tests/unit/test_contract.py holds its spelling to `RunState`.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class Name(str, Enum):
    """A name the contract fixes. It is its string: equal to it, hashed and formatted like it, and
    written to JSON as it, so run.json, `--json` output and messages read as plain strings."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    __hash__ = str.__hash__


class RunState(Name):
    """A run's state (run.json `state`; each node's state.json `state`, written by its agent)."""

    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class NodeState(Name):
    """A node's state as the controller knows it (run.json `nodes[].state`, `orch status`): its
    agent's state, or what the controller could tell without one."""

    PENDING = "pending"
    """Planned; not started yet."""
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    UNREACHABLE = "unreachable"
    """The controller could not ask the node's agent."""
    UNKNOWN = "unknown"
    """The node has no state where its run should have left one."""


FINAL_STATES: frozenset[str] = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED})
"""States a run or node never leaves. Holds the enums' strings: `"failed" in FINAL_STATES`."""

CHECK_NAMES = (
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
"""Every check of `orch check`, in the order they are run and reported."""

OPT_IN_CHECKS = ("fabric",)
"""Checks that run only when asked for (`--only`, the inventory's `checks.<name>`, `orch up --fabric`);
otherwise each node gets a `skip` row that says how to turn them on."""

CHECK_STATUSES = ("ok", "warn", "fail", "skip")
"""A check result's status; `skip` means the check said nothing about that node (and why)."""


class ExitCode(IntEnum):
    """What orch's commands exit with (docs/CONTRACT.md, "Commands")."""

    OK = 0
    FAILED = 1
    """A check failed, the job failed, or a node could not be stopped."""
    USAGE = 2
    """Bad usage or inventory, an unknown run or check: nothing was done."""
    PREFLIGHT_FAILED = 3
    """`orch up`: the preflight failed, nothing was launched."""
    INTERRUPTED = 130
    """Ctrl-C or SIGTERM, after every node was stopped."""
