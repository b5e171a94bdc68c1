"""`orch top` over real sshd nodes: the node agents sample the recorded GPUs (a fake nvidia-smi on
each node's PATH answering from tests/fixtures/telemetry: 8xH100 throttling, 8xV100, 3xA100, a GPU
with ERR!), and `orch top --once --json` from another shell shows the rows, the throttle flag and
the bad GPU of a detached run; the ranks torchrun started are each node's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cluster import TestCluster
from tests.up_helpers import Orch, ddp_inventory, ddp_job, leftover, node_log, run_root, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "telemetry"
SETS = {"node1": "h100x8", "node2": "v100x8", "node3": "a100", "node4": "err"}


def test_top_once_json_shows_every_node_its_gpus_the_throttle_and_the_bad_gpu(
    cluster: TestCluster, tmp_path: Path
) -> None:
    c = cluster
    for node, gpu_set in SETS.items():
        c.set_env(node, PATH=f"{FIX / gpu_set / 'bin'}{os.pathsep}{os.environ['PATH']}")
    inv = ddp_inventory(c, job_env=ddp_job(steps=400, sleep=0.2), job={"telemetry_s": 1})
    orch = Orch(tmp_path / "home")
    up = orch.run("up", str(inv), "--skip-checks", "--detach", "--run-id", "tel", timeout=120)
    assert up.returncode == 0, up.stderr
    try:
        wait_for(
            lambda: all(node_log(run_root(c), "tel", n).count('"rank":') >= 2 for n in SETS),
            120,
            "two samples with the rank from every node",
        )
        top = orch.run("top", "tel", "--once", "--json")
        assert top.returncode == 0, top.stderr
        data = json.loads(top.stdout)
        nodes = {n["node"]: n for n in data["nodes"]}
        assert list(nodes) == ["node1", "node2", "node3", "node4"] and data["state"] == "running"
        assert [len(nodes[n]["gpus"]) for n in SETS] == [8, 8, 3, 1]
        assert "throttle" in nodes["node1"]["flags"] and nodes["node1"]["gpus"][3]["throttle"] == [
            "hw_slowdown",
            "hw_power_brake",
        ]
        assert "throttle" not in nodes["node2"]["flags"] and nodes["node2"]["gpus"][7]["util_pct"] == 100.0
        assert nodes["node3"]["gpus"][0]["name"] == "NVIDIA A100-SXM4-40GB"
        assert nodes["node4"]["gpus"][0]["error"] == "fan.speed ERR!" and "gpu-error" in nodes["node4"]["flags"]
        for i, name in enumerate(SETS):
            n = nodes[name]
            assert [r["rank"] for r in n["ranks"]] == [i], n["ranks"]  # the worker torchrun started there
            assert n["ranks"][0]["rss_mb"] > 1 and n["cpu_pct"] is not None and n["mem_total_mb"] > 0
            assert n["sample_age_s"] is not None and n["fetch_error"] is None
        shown = orch.run("top", "tel", "--once", "--gpus")
        assert shown.returncode == 0 and "86 MHz" in shown.stdout and "3087/16384 MiB" in shown.stdout, shown.stdout
    finally:
        down = orch.run("down", "tel", timeout=120)
    assert down.returncode == 0, down.stderr
    assert leftover(c, "tel") == {}
