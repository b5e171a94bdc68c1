"""`job.container.user: "UID:GID"` of a user other than root on the real podman test bed: the
`container` check names the `python` and `user` keys where that user cannot run the job's
interpreter, and the output folder where it cannot write; where it can, the run succeeds and the
files it wrote on the host are that user's."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import TestCluster
from tests.containers import PodmanBed, short_dir
from tests.integration.test_up_container import (
    GONE_WITHIN_S,
    TRAINER_FLAGS,
    container_keys,
    run_label,
)
from tests.ports import job_port
from tests.trainer_helpers import make_dataset
from tests.up_helpers import REPO, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

UID, GID = 1000, 1000
USER = f"{UID}:{GID}"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may enter (under /tmp, 0755): the dataset and the run's project, as on
    a cluster's shared storage (pytest's tmp_path is root's alone)."""
    d = short_dir("u")
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def enterable_root(base: Path, name: str) -> Path:
    """An empty folder (0755) to mount over the image's /root (0700 there): the host interpreter the
    bed mounts at its own path under /root is then reachable by any user, as an image's /opt/conda is."""
    d = base / f"root-{name}"
    d.mkdir()
    d.chmod(0o755)
    return d


def user_inventory(
    cluster: TestCluster, base: Path, *, reach_python: bool, project_owner: int | None, name: str
) -> tuple[Path, Path]:
    """The trainer as uid:gid 1000:1000 on node1 and node2; the inventory and its project folder."""
    data = base / "ds" / "data.yaml"
    if not data.exists():
        data = make_dataset(base / "ds", images=8)
    project = base / f"runs-{name}"
    project.mkdir()
    if project_owner is not None:
        os.chown(project, project_owner, GID)
    keys = container_keys(str(base), workdir=str(REPO))
    keys["user"] = USER
    if reach_python:
        keys["mounts"] = [*keys["mounts"], f"{enterable_root(base, name)}:/root"]
    inv = cluster.write_inventory(
        base / f"{name}.yaml",
        only=["node1", "node2"],
        job={
            "module": "trainer",
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "stop_grace_s": 5,
            "args": {**TRAINER_FLAGS, "data": str(data), "project": str(project)},
            "container": keys,
        },
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
    )
    return inv, project


def rows(res: Any, check: str = "container") -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == check}


def test_the_check_names_a_user_that_cannot_run_the_python_or_write_the_output(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, shared_dir: Path
) -> None:
    """The interpreter under the image's /root (0700): uid 1000 cannot run it, and the row names
    job.container.python and job.container.user on each node. With /root enterable but the project
    folder root's (0755): the row names the folder and the user."""
    inv, _ = user_inventory(cluster, shared_dir, reach_python=False, project_owner=UID, name="nopy")
    res = orch.run("check", str(inv), "--only", "container", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    for node, row in rows(res).items():
        assert row["status"] == "fail", row
        assert (
            f"job.container.python {sys.executable} cannot be run inside the container as uid:gid {USER} "
            "(job.container.user): "
        ) in row["detail"] and "Permission denied" in row["detail"], (node, row)
        assert "job.container.user" in row["hint"] and "/root" in row["hint"], row
    assert set(rows(res)) == {"node1", "node2"}

    inv, project = user_inventory(cluster, shared_dir, reach_python=True, project_owner=None, name="nowrite")
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert {r["status"] for r in rows(res, "software").values()} == {"ok"}  # the interpreter runs now
    for row in rows(res).values():
        assert row["status"] == "fail", row
        assert f"--project: {project} is not writable inside the container (as uid:gid {USER})" in row["detail"], row
        assert "job.container.user" in row["hint"], row


def test_a_run_as_a_non_root_user_writes_files_that_user_owns(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, shared_dir: Path
) -> None:
    bed = podman_cluster
    inv, project = user_inventory(cluster, shared_dir, reach_python=True, project_owner=UID, name="ok")
    res = orch.run("up", str(inv), "--run-id", "ctr-user", timeout=540)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "succeeded on every node" in res.stderr
    written = [p for p in project.rglob("*")]
    assert any(p.name == "last.pt" for p in written), sorted(map(str, written))
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in written}
    assert owners == {(UID, GID)}, {str(p): (p.stat().st_uid, p.stat().st_gid) for p in written}
    assert bed.wait_no_containers(run_label("ctr-user"), within=GONE_WITHIN_S) == {}
