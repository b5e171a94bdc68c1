"""`orch up` when a node's cable is pulled mid-run (network namespaces, root only): the run ends
naming the node, the others are stopped, and the node cut off stops its own ranks (its lease)."""

from __future__ import annotations

import re
import time

import pytest

from orchestrator.config.inventory import load
from orchestrator.run.supervise import Tunables
from tests.cluster import TestCluster
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, leftover, node_log, node_state, wait_for

GRACE_S = 5
"""ORCH_UNREACHABLE_GRACE_S here (the lease is 3 x this: `Tunables.lease_s`)."""

# foreground: a pulled cable must end the run within a bound of a few seconds
pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300), pytest.mark.foreground]


def test_link_down_mid_run_is_detected_and_the_others_are_stopped(netns_cluster: TestCluster, tmp_path) -> None:
    c = netns_cluster
    inv = c.write_inventory(
        job={"script": DDP_JOB, "nproc_per_node": 1, "workdir": str(REPO), "stop_grace_s": 5},
        env={"GLOO_SOCKET_IFNAME": "eth0", **ddp_job(steps=1000, sleep=0.2)},
        master={"port": 29500},
        only=["node1", "node2", "node4"],
    )  # node4 is cut off; two others are stopped
    env = {"ORCH_UNREACHABLE_GRACE_S": str(GRACE_S)}
    tune, connect_timeout = Tunables.from_env(env), load(inv).node("node4").ssh.connect_timeout
    orch = Orch(tmp_path / "home", env=env)
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    runs = c.root / "runs"
    wait_for(lambda: "step 2 " in node_log(runs, run_id, "node4"), 90, "node4 to step")
    c.link_down("node4")
    t = time.monotonic()
    try:
        code = up.wait(90)
        elapsed = time.monotonic() - t
        assert code == 1, up.err
        # the stream's silence before a poll (3 s), the grace, one connect timeout for the stop it
        # cannot confirm (the status poll, the log stream and the stop share one attempt: before,
        # they took theirs in turn, and orch up ended 28 s after the cut with an 8 s grace), then
        # a few seconds for the others' last lines: 17 s measured
        exit_bound = tune.stream_silent_s + tune.unreachable_grace_s + connect_timeout + 12
        assert elapsed < exit_bound, (
            f"orch up took {elapsed:.1f} s to end after the link went down (bound {exit_bound:g} s)"
        )
        assert re.search(r"first failure on node4 \(node rank 2.*unreachable for \d+ s", up.err), up.err
        assert leftover(c, run_id, ["node1", "node2"]) == {}
        assert "could not confirm the stop on node4" in up.err, up.err
        print(f"link down -> orch up exit after {elapsed:.1f} s")
        # node4, cut off, stops its own ranks once its lease (3 x the grace: 15 s) runs out: SIGTERM,
        # SIGKILL after stop_grace_s (5 s), the cleanup of what is left: the README's bound,
        # 3 x grace + stop_grace_s + 10 s
        bound = tune.lease_s + 5 + 10
        wait_for(lambda: leftover(c, run_id, ["node4"]) == {}, bound + 30, "node4 to stop its ranks on its own")
        stopped = time.monotonic() - t
        state = wait_for(
            lambda: (st := node_state(runs, run_id, "node4")).get("lease_expired") and st,
            15,
            "node4's state.json to say why",
        )
        assert state["state"] == "stopped" and "was not heard from" in state["reason"], state
        assert stopped <= bound, f"node4's ranks outlived the cut by {stopped:.1f} s (bound {bound:g} s)"
        assert f"lease {tune.lease_s:g} s" in node_log(runs, run_id, "node4")
        print(f"link down -> every rank on node4 stopped after {stopped:.1f} s (bound {bound:g} s)")
    finally:
        c.link_up("node4")
    down = orch.run("down", run_id, timeout=120)
    assert down.returncode == 0, down.stderr
    assert leftover(c, run_id) == {}
