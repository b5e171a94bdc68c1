"""Automatic retries of a container run on the real podman test bed: a rank killed once is retried
with the trainer resuming inside its new container, the failed launch's containers removed before
the retry starts its own (each launch's names carry its nonce), and orch status and orch report
read the retried run; and a spare node taking a broken node's place runs its ranks in a container
of its own store. orch's part of a retry is the relaunch with --resume auto; that the trainer's
resume ends with an uninterrupted run's weights, bit for bit, is test_trainer_ddp.py's and
test_trainer_preempt.py's (one proof per claim: a third, under orch up over SSH, cost 3 minutes)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import TestCluster
from tests.containers import PodmanBed
from tests.integration.test_up_container import GONE_WITHIN_S, container_keys, run_label
from tests.ports import job_port
from tests.report_support import card
from tests.trainer_helpers import make_dataset
from tests.up_helpers import DDP_JOB, REPO, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_ONCE = REPO / "tests" / "kill_once"
BATCH = 4
FLAGS = {
    "model": "yolo12n.yaml",
    "epochs": 2,
    "batch": BATCH,
    "imgsz": 64,
    "workers": 0,
    "val-period": 0,
    "seed": 1,
    "plots": "false",
    "accumulate": 1,
    "warmup-epochs": 0,
    "close-mosaic": 0,
}
"""Two short epochs, an optimizer step per batch: the kill in epoch 2 leaves epoch 1's last.pt."""

START = re.compile(
    r"^(\S+) (node\d)\s+- agent \d+ on \S+ starting(?: attempt (\d+))?: podman run .*?--name (orch-\S+)", re.M
)
REMOVED = re.compile(r"^(\S+) (node\d)\s+- stop hook \([^)]*\): podman rm -f (orch-\S+)", re.M)
HOOK_DONE = re.compile(r"^(\S+) (node\d)\s+- stop hook: exit 0", re.M)


def launches(merged: str) -> list[tuple[str, str, str]]:
    """(time, node, container name) of every container start in the merged log, in order."""
    return [(t, node, name) for t, node, _, name in START.findall(merged)]


def attempts(merged: str) -> list[int]:
    """The attempt of every container start in the merged log, in order."""
    return [int(a or 1) for _, _, a, _ in START.findall(merged)]


def test_a_killed_rank_is_retried_in_new_containers_and_resumes(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    bed = podman_cluster
    data = make_dataset(tmp_path / "ds", images=8)
    (tmp_path / "runs").mkdir()
    train = len(list((data.parent / "images" / "train").iterdir()))
    per_epoch = math.ceil(math.ceil(train / 2) / (BATCH // 2))
    marker = tmp_path / "killed"  # under tmp_path: mounted into the containers, so the retry's rank sees it
    kill = {
        "PYTHONPATH": str(KILL_ONCE),
        "ORCH_TEST_KILL_RANK": "1",
        "ORCH_TEST_KILL_AT_STEP": str(per_epoch + 1),
        "ORCH_TEST_KILL_MARKER": str(marker),
    }
    inv = cluster.write_inventory(
        tmp_path / "cut.yaml",
        only=["node1", "node2"],
        job={
            "module": "trainer",
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "stop_grace_s": 5,
            "retries": 1,
            "args": {**FLAGS, "data": str(data), "project": str(tmp_path / "runs")},
            "container": container_keys(str(tmp_path), workdir=str(REPO)),
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
        nodes_extra={"node2": {"env": kill}},
    )
    res = orch.run("up", str(inv), "--run-id", "ctr-cut", "--skip-checks", timeout=540)
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert marker.read_text() == f"rank 1 killed after optimizer step {per_epoch + 1}\n"
    assert "the trainer is relaunched with --resume auto" in err, err[-3000:]
    assert "succeeded on every node" in err and "(attempt 2 of 2)" in err
    # the resume argument reached the trainer inside the new container: it continued epoch 1's checkpoint
    assert re.search(r"resuming at epoch 2 \(checkpoint finished epoch 1, ", res.stdout), res.stdout[-3000:]
    plan = json.loads((orch.run_dir("ctr-cut") / "plan.json").read_text())
    assert all(n["argv"][-2:] == ["--resume", "auto"] for n in plan["nodes"]), [n["argv"] for n in plan["nodes"]]

    # each launch starts its own containers, named with the run's launch nonce and, from the second
    # attempt on, the attempt (a late stop hook of attempt 1 names only attempt 1's container);
    # the first launch's are removed on both nodes, their stop hooks done, before the retry starts any
    run = orch.run_json("ctr-cut")
    merged = (orch.run_dir("ctr-cut") / "merged.log").read_text()
    started = launches(merged)
    assert sorted(n for _, n, _ in started[:2]) == sorted(n for _, n, _ in started[2:]) == ["node1", "node2"], [
        ln for ln in merged.splitlines() if "starting" in ln
    ]
    first, second = started[:2], started[2:]
    assert all(name == f"orch-ctr-cut-{node}-{run['nonce']}" for _, node, name in first), started
    assert all(name == f"orch-ctr-cut-{node}-{run['nonce']}-a2" for _, node, name in second), started
    assert attempts(merged) == [1, 1, 2, 2], attempts(merged)
    retry_at = min(t for t, _, _ in second)
    for at, node, name in first:
        removed = [t for t, n, rm in REMOVED.findall(merged) if n == node and rm == name and t > at]
        assert removed and removed[0] < retry_at, (node, removed, retry_at)
        done = [t for t, n in HOOK_DONE.findall(merged) if n == node and t > removed[0]]
        assert done and done[0] < retry_at, (node, done, retry_at)
    assert run["state"] == "succeeded" and run["attempt"] == 2
    assert run["attempts"][0]["result"] == "failed" and run["attempts"][0]["first_failure"]["node"] in (
        "node1",
        "node2",
    )
    assert bed.wait_no_containers(run_label("ctr-cut"), within=GONE_WITHIN_S) == {}

    # orch status and orch report read the trainer's own lines after the retry: done, and the card
    # holds the run as it ended (no validation with --val-period 0: no mAP, and none made up)
    status = json.loads(orch.run("status", "--json", "ctr-cut").stdout)
    assert status["progress"]["done"] is True and status["progress"]["epochs"] == FLAGS["epochs"], status
    report = orch.run("report", "ctr-cut", timeout=240)
    assert report.returncode == 0, report.stderr
    summary = card(Path(report.stdout.strip()).read_text())
    rows = (orch.run_dir("ctr-cut") / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + FLAGS["epochs"] and "mAP50-95" not in rows[0], rows
    assert summary["best_map50_95"] == "" and summary["attempts"] == "2" and summary["state"] == "succeeded", summary
    assert summary["world_size"] == "2" and float(summary["wall_s"]) == run["wall_s"], summary


def test_a_spare_replaces_a_broken_node_in_a_container_run(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """node2's rank fails at step 4 and deletes its node's data file on the way (inside its
    container, on a mount of the node's own directory): the retry's preflight fails there, and the
    spare node3 takes node rank 1, its rank in a container of node3's own store. (Two nodes and a
    spare: a third node in the run proved nothing more and cost two more preflights and launches.)"""
    bed = podman_cluster
    if not cluster._private_fs:
        pytest.skip("node-local files need root (a mount namespace per node)")
    for name in ("node1", "node2", "node3"):
        (cluster.node(name).local_dir / "data.yaml").write_text("names: {0: a}\n")
    path = f"{cluster.NODE_LOCAL}/data.yaml"
    inv = cluster.write_inventory(
        tmp_path / "spare.yaml",
        only=["node1", "node2", "node3"],
        job={
            "module": None,
            "script": DDP_JOB,
            "nproc_per_node": 1,
            "workdir": "/tmp",
            "stop_grace_s": 3,
            "retries": 1,
            "args": {"steps": 8, "sleep": 0.1, "data": path},
            "container": container_keys(cluster.NODE_LOCAL),
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
        nodes_extra={"node2": {"env": {"DDP_FAIL_RANK": "1", "DDP_FAIL_STEP": "4", "DDP_BREAK_FILE": path}}},
    )
    doc: dict[str, Any] = yaml.safe_load(inv.read_text())
    doc["spare"] = [doc["nodes"].pop()]  # node3
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = orch.run("up", str(inv), "--run-id", "ctr-spare", timeout=540)
    err = res.stderr
    assert res.returncode == 0, err[-4000:]
    assert re.search(r"node2 failed the preflight \([^)]*\): spare node3 takes its place", err), err[-3000:]
    assert not (cluster.node("node2").local_dir / "data.yaml").exists()  # deleted inside node2's container
    run = orch.run_json("ctr-spare")
    assert run["attempt"] == 2 and run["replaced"] == {"node2": "node3"}
    assert [(n["node"], n["node_rank"], n["state"]) for n in run["nodes"]] == [
        ("node1", 0, "succeeded"),
        ("node3", 1, "succeeded"),
    ]
    merged = (orch.run_dir("ctr-spare") / "merged.log").read_text()
    # the spare's rank ran in its own container of the relaunch, named for node3 and that launch
    started = launches(merged)
    assert [n for _, n, _ in started].count("node3") == 1, [ln for ln in merged.splitlines() if "starting" in ln]
    spare = next(name for _, n, name in started if n == "node3")
    assert spare.startswith("orch-ctr-spare-node3-"), spare
    assert re.search(r"\bnode3\s+r1\s+done steps=8 allreduce_ok=True", merged), merged[-3000:]
    assert bed.wait_no_containers(run_label("ctr-spare"), within=GONE_WITHIN_S) == {}
