"""`job.container` on a real Slurm (the loopback bed) with a real podman (tests/containers.py): the
preflight's probe container and the job's container run in steps of the allocation, and a real
preemption (a job of the higher partition wanting every node) sends the allocation's warning
signal, USR2, which the runtime's client forwards into the container. There torchrun lives
through it (`node/warned.py`), the ranks get it and write their checkpoint (tests/ddp_job.py's
`--checkpoint`, the trainer's way in small), orch calls the attempt preempted, waits for Slurm
to requeue the allocation and run it again (`scontrol update StartTime=now` instead of 22.05's
two minutes), and resumes in it: the same job id, the job continuing from its checkpoint. No
container, job or process is left."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.containers import IMAGE, LABEL, PodmanStore, TestImage, python_mounts, short_dir
from tests.ports import job_port
from tests.slurm_bed import URGENT, SlurmBed
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, node_log, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture
def store(container_image: TestImage) -> Iterator[PodmanStore]:
    """A podman store that sees the test image, for every node of the loopback bed (one machine);
    a container left in it at the end fails the test."""
    root = short_dir("s")
    st = PodmanStore(root, images_from=(container_image.store.graph,))
    try:
        yield st
    finally:
        left = st.remove_all()
        shutil.rmtree(root, ignore_errors=True)
        if left:
            pytest.fail(f"containers left behind (removed now): {left}", pytrace=False)


def container_inventory(tmp_path: Path, env: dict[str, str], **job: Any) -> Path:
    """tests/ddp_job.py in the test image on 2 nodes of the bed, one rank each, the job's Python
    environment and `tmp_path` (its checkpoint) mounted."""
    path = tmp_path / "lab.yaml"
    mounts = [m for m in python_mounts(sys.executable) if m != str(REPO)]
    doc: dict[str, Any] = {
        "name": "lab",
        "transport": "slurm",
        "slurm": {"nodes": 2},
        "master": {"port": job_port()},
        "env": {"GLOO_SOCKET_IFNAME": "lo", **env},
        "job": {
            "script": DDP_JOB,
            "python": sys.executable,
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "run_root": str(tmp_path / "nodes"),
            "stop_grace_s": 5,
            "container": {
                "runtime": "podman",
                "image": IMAGE,
                "python": sys.executable,
                "mounts": [*mounts, str(tmp_path)],
                "user": "root",
            },
            **job,
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_container_job_warned_by_a_preemption_checkpoints_and_resumes_in_its_requeued_allocation(
    slurm_bed: SlurmBed, store: PodmanStore, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    inv = container_inventory(tmp_path, ddp_job(steps=40, sleep=0.2, checkpoint=str(ckpt)), retries=1)
    orch = Orch(tmp_path / "home", env={**slurm_bed.env, **store.env})

    check = orch.run("check", str(inv), "--only", "container,software", "--json", timeout=240)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    rows = json.loads(check.stdout)["results"]
    assert {r["node"] for r in rows} == {"sn1", "sn2"} and {r["status"] for r in rows} == {"ok"}, rows
    assert slurm_bed.jobs() == [] and store.containers() == []  # the probe's allocation and containers gone

    up = orch.start(str(inv), "--skip-checks", "--run-id", "boxed")
    run = up.wait_running(180)
    job = orch.run_json(run)["slurm"]["job_id"]
    nodes = tmp_path / "nodes"
    wait_for(lambda: "step 3 " in node_log(nodes, run, "sn1"), 120, "rank 0's fourth step")
    assert len(store.containers(f"{LABEL}={run}")) == 2
    slurm_bed.run("sbatch", "-p", URGENT, "-N4", "--exclusive", "--wrap", "true")  # preempts ours: USR2 at once
    # slurmctld requeues it at its next 30 s pass after the partition's GraceTime, then holds it
    # back two minutes (BeginTime): let it run again now
    slurm_bed.run_requeued_now(job)
    assert up.wait(240) == 0, up.err[-4000:]

    record = orch.run_json(run)
    assert record["state"] == "succeeded" and record["attempt"] == 2, record
    assert record["slurm"]["job_id"] == job  # requeued, the same allocation ran both attempts
    cause = record["attempts"][0]["first_failure"]["cause"]
    # the cause adds "the trainer wrote its checkpoint" only where the first failure is a rank's own
    # preempted exit (75); under load the first can be the other node's torchrun, ended by Slurm or by
    # the lost peer: its node log below is what proves the checkpoint. And Slurm's words depend on
    # when orch asks: before slurmctld's pass that requeues the job (GraceTime, then up to 30 s) the
    # job is RUNNING with a PreemptTime; after it, PENDING with Restarts 1 and no trace of why
    # (`scontrol show job` drops PreemptTime), which orch words as a requeue (seen in a full run)
    said = (f"Slurm job {job} is being preempted", f"Slurm job {job} was requeued (preempted or scontrol requeue)")
    assert any(words in cause for words in said), cause
    log0 = node_log(nodes, run, "sn1")
    assert f"preempted (SIGUSR2): checkpoint {ckpt} after step " in log0, log0[-3000:]
    resumed = int(ckpt.read_text())
    assert f"[rank 0] resuming at step {resumed}" in log0, log0[-3000:]
    log1 = node_log(nodes, run, "sn2")
    assert "[rank 1] done steps=40 allreduce_ok=True" in log1, log1[-3000:]
    # the wait said why (BeginTime, or None once the test's StartTime=now was taken)
    assert re.search(rf"Slurm job {job}: PENDING \((BeginTime|None)\)", up.err), up.err[-3000:]
    assert slurm_bed.job(job)["Restarts"] == "1"
    assert store.containers(f"{LABEL}={run}") == []
    assert slurm_bed.jobs() == [] and slurm_bed.left_behind() == []


def test_a_container_run_whose_allocation_is_requeued_is_swept_in_it_before_the_relaunch(
    slurm_bed: SlurmBed, store: PodmanStore, tmp_path: Path
) -> None:
    """`scontrol requeue` ends every step at once, and the teardown finds the allocation completing,
    where Slurm starts no step: the containers' sweep cannot run there. The retry waits for the
    allocation to run again, stops and sweeps those nodes in it, and only then relaunches."""
    marker = tmp_path / "requeued"
    inv = container_inventory(tmp_path, ddp_job(steps=10_000, sleep=0.2, stop_file=str(marker)), retries=1)
    orch = Orch(tmp_path / "home", env={**slurm_bed.env, **store.env})
    up = orch.start(str(inv), "--skip-checks", "--run-id", "again")
    run = up.wait_running(180)
    job = orch.run_json(run)["slurm"]["job_id"]
    wait_for(lambda: "step 1 " in node_log(tmp_path / "nodes", run, "sn1"), 120, "rank 0's second step")
    slurm_bed.run("scontrol", "requeue", job)
    slurm_bed.run_requeued_now(job, before=marker.touch)  # the relaunch ends after its first step
    assert up.wait(180) == 0, up.err[-4000:]
    data = orch.run_json(run)
    assert data["state"] == "succeeded" and data["attempt"] == 2 and data["slurm"]["job_id"] == job, data
    cause = data["attempts"][0]["first_failure"]["cause"]
    assert cause.startswith(f"Slurm job {job} was requeued"), cause
    assert store.containers(f"{LABEL}={run}") == []
    assert slurm_bed.jobs() == [] and slurm_bed.left_behind() == []
