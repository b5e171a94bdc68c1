"""A non-root SSH account (tests/conftest.py `account_cluster`: every login drops to uid:gid 4242,
as a team's `train` account) running its jobs in the session's dockerd (`account_docker`: the
account in the docker group): what the field found with such an account (issue 54)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.cluster import ACCOUNT, TestCluster
from tests.containers import Dockerd, short_dir
from tests.integration.test_up_container import TRAINER_FLAGS, container_keys
from tests.integration.test_up_container_user import enterable_root
from tests.ports import job_port
from tests.trainer_helpers import make_dataset
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, run_root

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NODES = ["node1", "node2"]


def test_the_bed_logs_in_as_the_account_and_reaches_docker(
    account_docker: Dockerd, account_cluster: TestCluster, orch: Orch
) -> None:
    inv = account_cluster.write_inventory()
    res = orch.run("exec", str(inv), "--", "id -u; docker info --format '{{.ServerVersion}}'", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("4242") == 2, res.stdout


def owners(top: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(top)): (p.lstat().st_uid, p.lstat().st_gid) for p in [top, *top.rglob("*")]}


def test_a_root_container_leaves_the_accounts_run_directory_its_own(
    account_docker: Dockerd, account_cluster: TestCluster, orch: Orch
) -> None:
    """Issue 54.7: `user: root` under a rootful runtime wrote torchrun's `--log-dir` (root-owned,
    0700 folders) into the account's own run directory, which the account then could not delete.
    Every file of the run on the nodes is the account's, and the account removes its run."""
    keys = {**container_keys(), "runtime": "docker", "user": "root"}
    inv = account_cluster.write_inventory(
        only=NODES,
        job={"module": None, "script": DDP_JOB, "nproc_per_node": 1, "workdir": "/tmp", "container": keys},
        env={"GLOO_SOCKET_IFNAME": "lo", **ddp_job(steps=3, sleep=0.05)},
        master={"port": job_port()},
    )
    res = orch.run("up", str(inv), "--run-id", "rootjob", timeout=540)
    assert res.returncode == 0, res.stderr[-4000:]
    root = run_root(account_cluster)
    found = owners(root)
    assert any("rootjob" in p for p in found), found
    assert {o for o in found.values()} == {ACCOUNT}, {p: o for p, o in found.items() if o != ACCOUNT}
    gone = orch.run("exec", str(inv), "--", f"rm -rf {root}/* && ls -A {root} | wc -l", timeout=120)
    assert gone.returncode == 0 and gone.stdout.split().count("0") == 2, gone.stdout + gone.stderr


def test_the_accounts_paths_under_remapped_mounts_pass_the_job_check(
    account_docker: Dockerd, account_cluster: TestCluster, orch: Orch
) -> None:
    """Issue 54.2 as the field met it: `- HOST:/ckpt` and `project: /ckpt/yoloe`, the dataset under
    a remapped read-only mount. Before, the account got "project: /ckpt/yoloe cannot be created: /
    is not writable" and "data: /ds/data.yaml does not exist on this node" from the `job` row while
    the `container` row (looking from inside) was ok."""
    base = short_dir("acct")
    try:
        base.chmod(0o755)
        data = make_dataset(base / "ds", images=8)
        data.write_text(yaml.safe_dump({**yaml.safe_load(data.read_text()), "path": "/ds"}, sort_keys=False))
        ckpt = base / "ckpt"
        ckpt.mkdir()
        os.chown(ckpt, *ACCOUNT)
        keys = {**container_keys(workdir=str(REPO)), "runtime": "docker", "user": "host"}
        keys["mounts"] = [
            *keys["mounts"],
            f"{enterable_root(base, 'a')}:/root",
            f"{base / 'ds'}:/ds:ro",
            f"{ckpt}:/ckpt",
        ]
        inv = account_cluster.write_inventory(
            only=NODES,
            job={
                "module": "trainer",
                "nproc_per_node": 1,
                "workdir": str(REPO),
                "args": {**TRAINER_FLAGS, "data": "/ds/data.yaml", "project": "/ckpt/yoloe"},
                "container": keys,
            },
            env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
            master={"port": job_port()},
        )
        res = orch.run("check", str(inv), "--only", "job,container", "--json", timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        found = {(r["check"], r["node"]): r for r in json.loads(res.stdout)["results"]}
        assert {r["status"] for r in found.values()} == {"ok"}, found
        assert "writes /ckpt/yoloe/" in found["job", "node1"]["detail"], found["job", "node1"]
    finally:
        shutil.rmtree(base, ignore_errors=True)
