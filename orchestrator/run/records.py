"""A run's record on the controller: run.json's per-node entries, updated from several threads.

run.json (in `store.RunDir`) holds the run's state and, per node, where its run lives on the node
and how to reach its agent later (`node_records`: a `store.NodeRecord` each), with the agent's
latest facts merged in (`merge_status`, on the JSON as written, so a record keeps its keys).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..config.inventory import Inventory
from ..config.jobenv import job_env
from ..config.plan import Plan
from ..errors import UsageError
from ..store import NodeRecord, RunDir, check_nonce, recorded_nodes, remote_dir
from ..store import warn as store_warn
from .agents import NodeStatus


def node_records(plan: Plan) -> list[NodeRecord]:
    """run.json `nodes`: where each node's run lives, how to reach its agent later, and what sweeps
    the containers a killed agent left there (its environment's `sweep`)."""
    inv = plan.inventory
    out = []
    for p in plan.nodes:
        sweep = p.environment.sweep() if p.environment is not None else None
        out.append(
            NodeRecord(
                node=p.node.name,
                host=p.node.host,
                addr=p.node.addr,
                node_rank=p.node_rank,
                base_rank=p.global_ranks.start,
                nproc=p.node.nproc_per_node,
                remote_dir=remote_dir(inv, p.node, plan.run_id),
                python=p.node.python,
                nonce=plan.nonce or None,
                sweep=sweep.listing if sweep is not None else None,
                sweep_remove=sweep.remove if sweep is not None else None,
            )
        )
    return out


TRUSTED = ("python", "remote_dir", "sweep", "sweep_remove")
"""What of a run.json node record runs on its node, taken from the run's inventory snapshot."""


def trusted_records(run: RunDir, inv: Inventory, records: Sequence[NodeRecord]) -> list[NodeRecord]:
    """run.json's node records as something to run on the nodes: each node's `python`,
    `remote_dir` and container sweep (`TRUSTED`) are what the run's inventory snapshot (`inv`, as
    the run ran) says for the record's launch, never taken from run.json alone; a record that says
    otherwise is refused (UsageError, exit 2) naming the node and the key, and so is a `nonce` not
    of the form orch writes (`store.check_nonce`). Records of nodes the inventory does not have
    are dropped."""
    nodes = {n.name: n for n in inv.nodes}
    out = []
    for r in records:
        node = nodes.get(r.node)
        if node is None:
            continue
        check_nonce(r.nonce, f"{run.path / 'run.json'}: node {node.name}")
        sweep = job_env(inv, node, run_id=run.run_id, nonce=r.nonce or "").sweep()
        trusted = replace(
            r,
            python=node.python,
            remote_dir=remote_dir(inv, node, run.run_id),
            sweep=sweep.listing if sweep is not None else None,
            sweep_remove=sweep.remove if sweep is not None else None,
        )
        for key in TRUSTED:
            said, value = getattr(r, key), getattr(trusted, key)
            if said and said != value and not (key == "sweep" and sweep is not None and said == sweep.recorded_before):
                raise UsageError(
                    f"{run.path / 'run.json'}: node {node.name}: {key} {said!r} is not what the "
                    f"run's inventory snapshot says ({value!r}): refusing to run it",
                    "run.json was changed after the launch; only the inventory snapshot says what runs",
                )
        out.append(trusted)
    return out


def merge_status(record: Mapping[str, Any], status: NodeStatus) -> dict[str, Any]:
    """A run.json node record updated with what the node's agent reported."""
    return {**record, **status.recorded()}


class RunRecord:
    """run.json updates from several threads (poller callbacks, teardown) and processes (`orch
    status`, `orch down` beside `orch up`), serialized: a thread lock here, run.json's flock
    (`RunDir.locked`) across processes.

    A write that fails (the controller's disk full) never stops what is being recorded: it is
    warned about once, and the record is written again, whole, with the next update."""

    def __init__(self, run: RunDir, warn: Callable[[str], None] = store_warn) -> None:
        self.run = run
        self.lock = threading.Lock()
        self.warn = warn
        self.failed: str | None = None
        self.pending: tuple[dict[str, NodeStatus], dict[str, Any]] = ({}, {})
        """What failed writes did not get into run.json yet (merged into the next update)."""

    def nodes(self) -> list[NodeRecord]:
        return recorded_nodes(self.run.read())

    def update_nodes(self, statuses: Mapping[str, NodeStatus], **fields: Any) -> bool:
        """Merge each node's status into its record, set the run's `fields`, write run.json;
        whether it was written."""
        with self.lock:
            statuses = {**self.pending[0], **statuses}
            fields = {**self.pending[1], **fields}

            def change(data: dict[str, Any]) -> None:
                data["nodes"] = [
                    merge_status(r, statuses[r["node"]]) if r["node"] in statuses else r
                    for r in data.get("nodes") or []
                ]
                data.update(fields)

            try:
                self.run.modify(change)
            except OSError as exc:
                self.pending = (statuses, fields)
                if self.failed is None:
                    self.warn(
                        f"cannot write {self.run.path / 'run.json'}: {exc.strerror or exc}; the run goes on, "
                        "its record is written again once it can be"
                    )
                self.failed = str(exc)
                return False
            if self.failed is not None:
                self.warn(f"{self.run.path / 'run.json'} is written again")
            self.pending, self.failed = ({}, {}), None
            return True
