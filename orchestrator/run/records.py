"""A run's record on the controller: run.json's per-node entries, updated from several threads.

run.json (in `store.RunDir`) holds the run's state and, per node, where its run lives on the node
and how to reach its agent later (`node_records`), with the agent's latest facts merged in.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from ..config.plan import Plan
from ..contract import NodeState
from ..store import RunDir, remote_dir
from .agents import NodeStatus


def node_records(plan: Plan) -> list[dict[str, Any]]:
    """run.json `nodes`: where each node's run lives and how to reach its agent later."""
    inv = plan.inventory
    return [{"node": p.node.name, "host": p.node.host, "addr": p.node.addr, "node_rank": p.node_rank,
             "base_rank": p.global_ranks.start, "nproc": p.node.nproc_per_node,
             "remote_dir": remote_dir(inv, p.node, plan.run_id), "python": p.node.python,
             "state": NodeState.PENDING, "exit_code": None, "pid": None, "pgid": None,
             "started_at": None, "finished_at": None} for p in plan.nodes]


def merge_status(record: Mapping[str, Any], status: NodeStatus) -> dict[str, Any]:
    """A run.json node record updated with what the node's agent reported."""
    return {**record, **status.recorded()}


class RunRecord:
    """run.json updates from several threads (poller callbacks, teardown), serialized."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.lock = threading.Lock()

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.run.read().get("nodes") or [])

    def update_nodes(self, statuses: Mapping[str, NodeStatus], **fields: Any) -> None:
        """Merge each node's status into its record, set the run's `fields`, write run.json."""
        with self.lock:
            data = self.run.read()
            data["nodes"] = [merge_status(r, statuses[r["node"]]) if r["node"] in statuses else r
                             for r in data.get("nodes") or []]
            data.update(fields)
            self.run.write(data)
