"""The hang verdict's prime suspect over real sshd nodes, torchrun and gloo (issue 54 item 4): a
rank frozen by SIGSTOP gives no stack (py-spy cannot read a stopped process) while every other rank
waits for it in all_reduce. The verdict once named the master ("every rank stands in the same
place"); it names the stopped rank, on its node, and nothing of the run is left."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.cluster import TestCluster
from tests.up_helpers import Orch, ddp_inventory, ddp_job, leftover, node_log, run_root, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STALL_S = 5.0


def rank_process(cluster: TestCluster, node: str, run_id: str, rank: int) -> int | None:
    """The pid of that rank's worker on that node (RANK in its environment, its parent without it)."""
    pids = cluster.processes(node, run_id)
    ranked = {}
    for pid in pids:
        try:
            env = dict(kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"RANK") == str(rank).encode():
            ranked[pid] = env
    for pid in ranked:
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent not in ranked:
            return pid
    return None


@pytest.mark.foreground  # a watchdog of 5 s: a loaded machine could starve a healthy rank that long
def test_a_stopped_rank_is_named_by_the_hang_verdict_not_the_master(cluster: TestCluster, orch: Orch) -> None:
    inv = ddp_inventory(cluster, job_env=ddp_job(steps=2000, sleep=0.2), only=["node1", "node2", "node3"])
    up = orch.start(str(inv), "--skip-checks", "--stall-timeout", f"{STALL_S:g}")
    stopped = None
    try:
        run_id = up.wait_running()
        wait_for(lambda: "step 3 " in node_log(run_root(cluster), run_id, "node3"), 120, "rank 2 at step 3")
        stopped = wait_for(lambda: rank_process(cluster, "node3", run_id, 2), 30, "rank 2's process")
        os.kill(stopped, signal.SIGSTOP)
        code = up.wait(180)
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if up.proc.poll() is None:
            up.proc.kill()
    err = up.err
    assert code == 1, err[-3000:]
    assert re.search(
        r"first failure on node3 \(node rank 2, rank 2, exit code None\): hung: no rank wrote a line for \d+ s "
        r"\(stall timeout 5 s\); rank 2 on node3 gave no stack, the prime suspect: its process is stopped",
        err,
    ), err[-3000:]
    data = orch.run_json(run_id)
    assert data["state"] == "failed" and data["first_failure"]["rank"] == 2, data.get("first_failure")
    wait_for(lambda: leftover(cluster, run_id) == {}, 30, "nothing of the run left")
