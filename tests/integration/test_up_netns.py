"""`orch up` when a node's cable is pulled mid-run (network namespaces, root only)."""

from __future__ import annotations

import re
import time

import pytest

from tests.cluster import TestCluster
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, leftover, node_log, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(300)]


def test_link_down_mid_run_is_detected_and_the_others_are_stopped(netns_cluster: TestCluster, tmp_path) -> None:
    c = netns_cluster
    inv = c.write_inventory(
        job={"script": DDP_JOB, "nproc_per_node": 1, "workdir": str(REPO), "stop_grace_s": 5},
        env={"GLOO_SOCKET_IFNAME": "eth0", **ddp_job(steps=1000, sleep=0.2)}, master={"port": 29500})
    orch = Orch(tmp_path / "home", env={"ORCH_UNREACHABLE_GRACE_S": "8"})
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
        assert elapsed < 45, f"orch up took {elapsed:.1f} s to end after the link went down"
        assert re.search(r"first failure on node4 \(node rank 3.*unreachable for \d+ s", up.err), up.err
        assert leftover(c, run_id, ["node1", "node2", "node3"]) == {}
        assert "could not confirm the stop on node4" in up.err, up.err
        print(f"link down -> orch up exit after {elapsed:.1f} s")
    finally:
        c.link_up("node4")
    down = orch.run("down", run_id, timeout=120)
    assert down.returncode == 0, down.stderr
    assert leftover(c, run_id) == {}
