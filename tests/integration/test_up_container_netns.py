"""`orch up` with `job.container` across 4 netns nodes (each node its own network, UTS and mount
namespace, a real sshd on its 198.18.0.0/15 address, root only): each node's ranks run in a real
podman container of that node's own store, started with `--network host` inside the node's
namespace, so the ranks meet over the nodes' own addresses as they would across machines."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cluster import TestCluster
from tests.containers import PodmanBed
from tests.integration.test_up_container import GONE_WITHIN_S, container_keys, run_label
from tests.up_helpers import DDP_JOB, Orch

pytestmark = [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(600)]

NODES = ["node1", "node2", "node3", "node4"]


def test_a_four_node_netns_run_in_podman_containers(
    netns_cluster: TestCluster, podman_bed: Callable[..., PodmanBed], orch: Orch, tmp_path: Path
) -> None:
    c = netns_cluster
    bed = podman_bed(c)
    inv = c.write_inventory(
        tmp_path / "ddp.yaml",
        job={
            "module": None,
            "script": DDP_JOB,
            "nproc_per_node": 1,
            "workdir": "/tmp",
            "stop_grace_s": 3,
            "args": {"steps": 6, "sleep": 0.05},
            "container": container_keys(),
        },
        env={"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"},
        master={"port": 29500},
    )
    res = orch.run("up", str(inv), "--run-id", "ctr-netns", timeout=540)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "succeeded on every node" in res.stderr
    # every rank of the world of 4 ran its all_reduces to the end, each on its own node, in the merged log
    merged = (orch.run_dir("ctr-netns") / "merged.log").read_text()
    for rank, node in enumerate(NODES):
        assert re.search(rf"\b{node}\s+r{rank}\s+done steps=6 allreduce_ok=True", merged), merged[-3000:]
    # the ranks met over the nodes' own addresses: the master is node1's, on the bridge between namespaces
    plan = json.loads((orch.run_dir("ctr-netns") / "plan.json").read_text())
    assert plan["master_addr"].startswith("198.1"), plan.get("master_addr")
    status = json.loads(orch.run("status", "--json", "ctr-netns").stdout)
    assert status["state"] == "succeeded", status
    assert [n["state"] for n in status["nodes"]] == ["succeeded"] * 4, status["nodes"]
    # `podman ps -a` in each node's own store (and namespaces): none of the run's containers is left
    assert bed.wait_no_containers(run_label("ctr-netns"), within=GONE_WITHIN_S) == {}
