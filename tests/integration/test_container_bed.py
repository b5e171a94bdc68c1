"""The container test bed itself (tests/containers.py): a real podman with a store per node, the
offline-built image, the job's Python environment mounted into it, a real dockerd beside it.

What the container features' tests stand on: nodes that differ for real (the image missing on one,
another image under the same tag on one), torchrun and the trainer running inside the image over a
real SSH login, and no container outliving its test."""

from __future__ import annotations

import json
import sys

import pytest

from tests.containers import IMAGE, LABEL, python_mounts
from tests.up_helpers import REPO

pytestmark = pytest.mark.slow


def _mount_flags() -> list[str]:
    return [flag for d in python_mounts(sys.executable) for flag in ("-v", f"{d}:{d}:ro")]


def test_every_node_has_its_own_store_and_they_can_differ(podman_cluster, container_image):
    """One image ID on every node; dropping it on one node and moving the tag on another changes
    those nodes alone."""
    bed = podman_cluster
    assert {n: bed.image_id(n) for n in bed.stores} == {n: container_image.id for n in bed.stores}
    bed.drop_image("node2")
    moved = bed.move_tag("node3")
    assert moved != container_image.id
    assert bed.image_id("node1") == container_image.id
    assert bed.image_id("node2") is None
    assert bed.image_id("node3") == moved
    assert bed.image_id("node4") == container_image.id
    # the seed store itself is untouched: the next test's nodes see the original again
    assert container_image.store.image_id() == container_image.id


def test_torchrun_runs_the_job_inside_the_image_over_ssh(podman_cluster, cluster, orch):
    """Over a real SSH login (orch exec), podman on each node starts the image with the job's
    Python environment mounted, and torchrun inside runs two gloo ranks of tests/ddp_job.py with
    host networking; torch and the trainer import inside."""
    inv = cluster.write_inventory(only=["node1", "node2"])
    code = "import torch, trainer, ultralytics, sys; print('INSIDE', sys.version.split()[0], torch.__version__)"
    run = [
        "podman",
        "run",
        "--rm",
        "--init",
        "--network",
        "host",
        "--ipc",
        "host",
        "--label",
        f"{LABEL}=bedtest",
        *_mount_flags(),
        "-e",
        "OMP_NUM_THREADS=1",
        IMAGE,
    ]
    r = orch.run("exec", str(inv), "--", *run, sys.executable, "-c", code, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("INSIDE 3.") == 2, r.stdout
    ddp = [
        *run,
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "tests" / "ddp_job.py"),
        "--steps",
        "3",
        "--sleep",
        "0",
    ]
    r = orch.run("exec", str(inv), "--nodes", "node1", "--", *ddp, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "allreduce_ok=True" in r.stdout, r.stdout
    assert podman_cluster.all_containers(f"{LABEL}=bedtest") == {}


def test_a_container_left_behind_is_found_by_label(podman_cluster):
    """A detached container on one node is listed by its label on that node only, and removed."""
    bed = podman_cluster
    bed.podman(
        "node2",
        "run",
        "-d",
        "--name",
        "orch-bedtest-node2",
        "--label",
        f"{LABEL}=leak",
        "--network",
        "host",
        IMAGE,
        "sleep",
        "600",
    )
    assert bed.all_containers(f"{LABEL}=leak") == {"node2": ["orch-bedtest-node2"]}
    assert bed.all_containers(f"{LABEL}=other") == {}
    assert bed.remove_all() == {"node2": ["orch-bedtest-node2"]}
    assert bed.wait_no_containers(f"{LABEL}=leak", within=10) == {}


def test_dockerd_runs_the_image_with_the_job_python(dockerd, container_image):
    """docker.io's dockerd on its own socket runs the same image (host networking) with the job's
    Python environment mounted; `docker info` and `docker image inspect` answer as orch reads them."""
    info = json.loads(dockerd.docker("info", "--format", "{{json .}}").stdout)
    assert info["DefaultRuntime"] == "runc" and "runc" in info["Runtimes"]
    inspect = json.loads(dockerd.docker("image", "inspect", IMAGE).stdout)
    assert inspect[0]["Id"].startswith("sha256:")
    code = "import torch, trainer; print('INSIDE', torch.__version__)"
    r = dockerd.docker(
        "run",
        "--rm",
        "--init",
        "--network",
        "host",
        "--label",
        f"{LABEL}=dockertest",
        *_mount_flags(),
        IMAGE,
        sys.executable,
        "-c",
        code,
    )
    assert "INSIDE" in r.stdout
    assert dockerd.containers(f"{LABEL}=dockertest") == []
