"""The `container` check and the container launch on both real runtimes of the test bed: podman 4.3
(Debian 12's, tests/containers.py, a store per node) and docker (the session's own dockerd, every
node's logins pointed at it), each with what the field found (issue 54): a leftover container
named on podman 4.3, `pull: never` passed to the runtime, one line for a missing image instead of
three rows of wrong hints, and the fixes for a node that grants no CAP_SYS_RESOURCE or has no
init binary for `--init` (issue 53.9)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import TestCluster
from tests.containers import IMAGE, Dockerd, PodmanBed
from tests.integration.test_up_container import container_keys
from tests.ports import job_port
from tests.up_helpers import DDP_JOB, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NODES = ["node1", "node2"]


@pytest.fixture
def docker_cluster(cluster: TestCluster, dockerd: Dockerd) -> Iterator[Dockerd]:
    """The shared loopback cluster whose logins reach the session's dockerd (DOCKER_HOST); every
    container a test leaves fails it, as the podman bed's."""
    for node in NODES:
        cluster.set_env(node, **dockerd.env)
    before = set(dockerd.containers())
    yield dockerd
    left = sorted(set(dockerd.containers()) - before)
    if left:
        dockerd.docker("rm", "-f", *left, check=False)
    assert left == [], f"containers left behind: {left}"


def inventory(cluster: TestCluster, tmp: Path, runtime: str, name: str = "ddp", **container: Any) -> Path:
    keys = {**container_keys(), "runtime": runtime, **container}
    return cluster.write_inventory(
        tmp / f"{name}.yaml",
        only=NODES,
        job={"module": None, "script": DDP_JOB, "nproc_per_node": 1, "workdir": "/tmp", "container": keys},
        env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
        master={"port": job_port()},
    )


def rows(res: Any, check: str = "container") -> dict[str, dict[str, Any]]:
    return {r["node"]: r for r in json.loads(res.stdout)["results"] if r["check"] == check}


def cluster_name(inv: Path) -> str:
    import yaml

    return str(yaml.safe_load(inv.read_text())["name"])


# ----------------------------------------------------------------------------- 54.3 leftovers


def _leftover_argv(cluster: str) -> list[str]:
    return [
        "run",
        "-d",
        "--name",
        "orch-old-run-node2-abc",
        "--label",
        "orch.run=old-run",
        "--label",
        f"orch.cluster={cluster}",
        "--label",
        "orch.node=node2",
        "--network",
        "host",
        IMAGE,
        "sleep",
        "600",
    ]


def _judge_leftover(res: Any, rm: str) -> None:
    assert res.returncode == 1, res.stdout + res.stderr
    got = rows(res)
    assert got["node1"]["status"] == "ok", got["node1"]
    assert got["node2"]["status"] == "fail", got["node2"]
    assert "container orch-old-run-node2-abc of run old-run is still here (" in got["node2"]["detail"], got
    assert got["node2"]["hint"] == f"orch down old-run (or {rm} rm -f orch-old-run-node2-abc)", got["node2"]


def test_a_leftover_container_is_named_on_podman_4_3(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """podman 4.3 knows no `{{.Label ...}}`: with a container of the cluster's runs on node2 every
    node failed with "`podman ps` does not answer"; now node2's row names it and its run."""
    bed = podman_cluster
    inv = inventory(cluster, tmp_path, "podman")
    bed.podman("node2", *_leftover_argv(cluster_name(inv)))
    try:
        res = orch.run("check", str(inv), "--only", "container", "--json", timeout=180)
        _judge_leftover(res, "podman")
    finally:
        bed.remove_all()


def test_a_leftover_container_is_named_on_docker(
    docker_cluster: Dockerd, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    inv = inventory(cluster, tmp_path, "docker")
    docker_cluster.docker(*_leftover_argv(cluster_name(inv)))
    try:
        res = orch.run("check", str(inv), "--only", "container", "--json", timeout=180)
        _judge_leftover(res, "docker")
    finally:
        docker_cluster.docker("rm", "-f", "orch-old-run-node2-abc", check=False)


# ----------------------------------------------------------------------------- 54.5 pull never, 54.6 one line


def _judge_missing(res: Any, node: str, image: str) -> None:
    """The container row fails naming the push; the software row that needed the image is `skip`
    in one line, with no hint about the host's python."""
    assert res.returncode == 1, res.stdout + res.stderr
    box, sw = rows(res)[node], rows(res, "software")[node]
    assert box["status"] == "fail" and f"{image} is not on this node" in box["detail"], box
    assert sw["status"] == "skip", sw
    assert f"{image} is not here, so no container of the job's image ran on this node" in sw["detail"], sw
    assert "pull" not in sw["detail"].lower(), sw


def test_a_missing_image_is_one_line_and_nothing_is_pulled_on_podman(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """node2 lacks the image (`pull: never`): its container row fails, its software row skips in one
    line, node1 is ok; a launch does not try to pull it (podman says "Trying to pull" otherwise)."""
    bed = podman_cluster
    bed.drop_image("node2")
    inv = inventory(cluster, tmp_path, "podman")
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    _judge_missing(res, "node2", IMAGE)
    assert rows(res, "software")["node1"]["status"] == "ok", rows(res, "software")["node1"]
    up = orch.run("up", str(inv), "--run-id", "nopull", "--skip-checks", timeout=300)
    assert up.returncode == 1, up.stderr[-3000:]
    log = orch.run("logs", "nopull", "--node", "node2", timeout=120).stdout
    assert "image not known" in log or "no such image" in log.lower(), log[-2000:]
    assert "Trying to pull" not in log, log[-2000:]


def test_a_missing_image_is_one_line_and_nothing_is_pulled_on_docker(
    docker_cluster: Dockerd, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """docker with an image no node holds: the preflight's containers and the launch are told
    `--pull never` (docker went to the registry otherwise: "Unable to find image ... locally")."""
    absent = "localhost/orch-test:absent"
    inv = inventory(cluster, tmp_path, "docker", image=absent)
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    for node in NODES:
        _judge_missing(res, node, absent)
    up = orch.run("up", str(inv), "--run-id", "nopull", "--skip-checks", timeout=300)
    assert up.returncode == 1, up.stderr[-3000:]
    log = orch.run("logs", "nopull", timeout=120).stdout
    assert "No such image: localhost/orch-test:absent" in log, log[-2000:]
    assert "Unable to find image" not in log, log[-2000:]


# ----------------------------------------------------------------------------- 53.9 strict hosts


def test_a_node_without_cap_sys_resource_runs_a_launch_without_rdma_and_the_row_names_the_fix(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """This sandbox grants no CAP_SYS_RESOURCE: the tests' containers needed `--ulimit` options
    within its hard limits while orch asked for `memlock=-1` on every launch. Without RDMA orch
    asks for no `--ulimit`, so the container starts with no options; an option that raises a limit
    past the node's fails every start, and the container row says why and how to fix it."""
    inv = inventory(cluster, tmp_path, "podman", options=[])
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    inv = inventory(cluster, tmp_path, "podman", name="memlock", options=["--ulimit=memlock=-1:-1"])
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    for row in rows(res).values():
        assert row["status"] == "fail", row
        assert "error setting rlimit" in row["detail"], row
        assert "CAP_SYS_RESOURCE" in row["hint"] and "default_ulimits" in row["hint"], row


def test_a_podman_without_catatonit_names_the_init_fix(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """Debian's podman only recommends catatonit, its `--init` binary: without it (and no
    init_path) every start fails; the container row names catatonit and init_path."""
    bed = podman_cluster
    store = bed.stores["node1"]
    store.conf.write_text(store.conf.read_text().replace('init_path = "/usr/bin/tini"\n', ""))
    inv = inventory(cluster, tmp_path, "podman")
    res = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    row = rows(res)["node1"]
    assert row["status"] == "fail" and "container-init binary not found" in row["detail"], row
    assert "catatonit" in row["hint"] and "init_path" in row["hint"], row
    assert rows(res)["node2"]["status"] == "ok", rows(res)["node2"]
