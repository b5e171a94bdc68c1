"""The job's paths in a container run, on the real podman bed (issue 54.1, 54.2): an inventory shaped
like the field's (`HOST:/ckpt` and `project: /ckpt/yoloe`, the dataset under a remapped read-only
mount whose YAML names its container path) passes the `job` check, trains, and `orch report` names
where the weights and results.csv are on the master's host; a run directory under no mount fails
the check, with the fix. The non-root account's side: tests/integration/test_up_container_account.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster import TestCluster
from tests.containers import PodmanBed
from tests.integration.test_up_container import GONE_WITHIN_S, TRAINER_FLAGS, container_keys, run_label
from tests.ports import job_port
from tests.trainer_helpers import make_dataset
from tests.up_helpers import REPO, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def remapped(cluster: TestCluster, base: Path, nodes: list[str], **container: Any) -> tuple[Path, Path]:
    """The trainer with its dataset at /ds (a read-only mount of `base/ds`, its YAML naming /ds) and
    `project: /ckpt/yoloe` (a mount of `base/ckpt`); the inventory and the host's ckpt folder."""
    data = make_dataset(base / "ds", images=8)
    doc = yaml.safe_load(data.read_text())
    data.write_text(yaml.safe_dump({**doc, "path": "/ds"}, sort_keys=False))
    ckpt = base / "ckpt"
    ckpt.mkdir()
    keys = container_keys(workdir=str(REPO))
    keys["mounts"] = [*keys["mounts"], f"{base / 'ds'}:/ds:ro", f"{ckpt}:/ckpt"]
    keys.update(container)
    args = {**TRAINER_FLAGS, "data": "/ds/data.yaml", "project": "/ckpt/yoloe"}
    if "workdir" in container:
        del args["project"]
    inv = cluster.write_inventory(
        base / "remapped.yaml",
        only=nodes,
        job={
            "module": "trainer",
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "stop_grace_s": 5,
            "args": args,
            "container": keys,
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
    )
    return inv, ckpt


def rows(res: Any, check: str) -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == check}


def test_paths_under_remapped_mounts_are_judged_on_the_host_and_reported_there(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """Before: "data: /ds/data.yaml does not exist on this node" (looked up as such on the host) while
    the container row, looking from inside, was ok; and `orch report` named the container's path
    (on gpu1) and copied no results.csv (its fallback to the log said nothing)."""
    inv, ckpt = remapped(cluster, tmp_path, ["node1", "node2"])
    res = orch.run("check", str(inv), "--only", "job,container", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    job = rows(res, "job")
    assert {r["status"] for r in job.values()} == {"ok"}, job
    assert "what /ds/data.yaml lists (train 6 files" in job["node2"]["detail"], job["node2"]  # listed on the host
    up = orch.run("up", str(inv), "--run-id", "remap", timeout=540)
    assert up.returncode == 0, up.stderr[-4000:]
    assert podman_cluster.wait_no_containers(run_label("remap"), within=GONE_WITHIN_S) == {}
    report = orch.run("report", "remap", timeout=240)
    assert report.returncode == 0, report.stdout + report.stderr
    weights = next(p for p in ckpt.rglob("weights") if p.is_dir())
    said = report.stderr  # the page's path alone on stdout
    assert f"weights: {weights} (on node1; /ckpt/yoloe/remap/weights in the container)" in said, said
    assert f"results: {weights.parent / 'results.csv'} (on node1; /ckpt/yoloe/remap/results.csv in the" in said, said
    assert "not fetched" not in said, said
    copy = orch.run_dir("remap") / "results.csv"
    assert copy.read_text() == (weights.parent / "results.csv").read_text()


def test_a_run_directory_under_no_mount_fails_the_check(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """Issue 54.1: `job.container.workdir` (the guide's `cd /root/yoloe`) and no `project`: the
    trainer would write into the container's own files, which `--rm` deletes; `orch check` said
    ok and printed where it would write."""
    inv, _ = remapped(cluster, tmp_path, ["node1"], workdir="/opt")
    res = orch.run("check", str(inv), "--only", "job", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    row = rows(res, "job")["node1"]
    assert row["status"] == "fail", row
    assert "the trainer would write its run to /opt/runs/detect/" in row["detail"], row
    assert "inside the container only (under no mount: podman run --rm deletes it with the container" in row["detail"]
    assert "- /mnt/nfs/ckpt:/ckpt" in row["hint"], row
