"""`orch up` with `transport: slurm` on a real Slurm (the loopback bed, tests/slurm_bed.py: four
slurmd `sn1`..`sn4`): the allocation asked for with sbatch, waited on with its pending reason, the
node agents held by one srun step, and every way a run ends leaving nothing in `squeue` or the
process table: a failing rank (--kill-on-bad-exit ends the others), Ctrl-C while the allocation is
pending, `orch down` of a detached run, Ctrl-C of a run inside the user's own salloc (which orch
never cancels), a drained node. The job is tests/ddp_job.py (gloo) where the trainer is not what
is proven; the trainer's own run, warned and resumed, is tests/integration/test_slurm_trainer.py."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.transport.slurm import GIVE_BACK_AFTER_S
from tests.ports import job_port
from tests.slurm_bed import MakeSlurmBed, SlurmBed
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

PYTHON = sys.executable


def slurm_inventory(
    tmp_path: Path, slurm: dict[str, Any] | None = None, env: dict[str, str] | None = None, **job: Any
) -> Path:
    """tests/ddp_job.py on the bed's nodes, one rank each, gloo over loopback (every node is this machine)."""
    path = tmp_path / "lab.yaml"
    doc: dict[str, Any] = {
        "name": "lab",
        "transport": "slurm",
        "slurm": {"nodes": 4} if slurm is None else slurm,
        "master": {"port": job_port()},
        "env": {"GLOO_SOCKET_IFNAME": "lo", **(env or ddp_job(steps=5, sleep=0.1))},
        "job": {
            "script": DDP_JOB,
            "python": PYTHON,
            "nproc_per_node": 1,
            "workdir": str(REPO),
            "run_root": str(tmp_path / "nodes"),
            "stop_grace_s": 5,
            **job,
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def nothing_left(bed: SlurmBed, settle_s: float = 0) -> None:
    """No job in the queue, no step, task, agent, torchrun or rank of one in the process table; with
    `settle_s`, after waiting that long at most for them to go (a detached run's launch on the
    controller gives its allocation back `GIVE_BACK_AFTER_S` after its step ended)."""
    assert bed.jobs() == []
    if settle_s:
        bed.wait_for(lambda: not bed.job_processes(), settle_s, "the detached launch's wrapper gone")
    assert bed.left_behind() == []


def test_a_failing_rank_ends_every_nodes_job_and_leaves_no_job_or_process_under_proctrack_cgroup(
    make_slurm_bed: MakeSlurmBed, tmp_path: Path
) -> None:
    """What real clusters run: proctrack/cgroup kills every process a finished step leaves, a daemon
    included, so an agent that daemonized from the step that started it would die with it. Each agent
    is the launch step's task, in that step's cgroup while its job runs; when rank 2 fails, its agent
    exits 1 and --kill-on-bad-exit ends the other nodes' agents (each stopping its job), then orch
    gives the allocation back."""
    bed = make_slurm_bed(n=4, proctrack="proctrack/cgroup")
    inv = slurm_inventory(tmp_path, env=ddp_job(steps=200, sleep=0.1, fail_rank=2, fail_step=3))
    orch = Orch(tmp_path / "home", env=bed.env)
    up = orch.start(str(inv), "--skip-checks", "--run-id", "fails")
    run = up.wait_running(120)
    data = orch.run_json(run)
    job = data["slurm"]["job_id"]
    for node in data["nodes"]:
        cgroup = Path(f"/proc/{node['agent_pid']}/cgroup").read_text()
        assert re.search(rf"freezer:/slurm_{node['node']}/uid_0/job_{job}/step_\d+$", cgroup, re.M), cgroup
    assert up.wait(240) == 1, up.err[-3000:]
    data = orch.run_json(run)
    first = data["first_failure"]
    assert (first["node"], first["rank"]) == ("sn3", 2), first
    assert "RuntimeError" in first["cause"], first
    states = {n["node"]: n["state"] for n in data["nodes"]}
    assert states["sn3"] == "failed" and {states[n] for n in ("sn1", "sn2", "sn4")} <= {"stopped", "failed"}, states
    assert data["slurm"]["created"] is True and data["slurm"]["nodes"] == ["sn1", "sn2", "sn3", "sn4"]
    assert f"Slurm job {job} submitted: sbatch --parsable --job-name=orch-lab --nodes=4" in up.err
    nothing_left(bed)
    assert bed.job(job)["JobState"] == "CANCELLED"  # given back by orch, not ended by a limit
    # the launch step's own account: srun saw sn3's agent fail and --kill-on-bad-exit end the others
    launch = (orch.run_dir(run) / "launch-1.log").read_text()
    assert re.search(r"srun: error: sn3: task 2: Exited with exit code 1", launch), launch[-2000:]


def test_a_drained_node_is_waited_for_until_ctrl_c_and_a_detached_run_on_the_others_is_downed(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    slurm_bed.drain("sn2")
    orch = Orch(tmp_path / "home", env=slurm_bed.env)
    waiting = orch.start(str(slurm_inventory(tmp_path)), "--skip-checks")
    pending = re.compile(r"Slurm job (\d+): PENDING \(.*DRAINED.*\)")
    said = wait_for(lambda: pending.search(waiting.err), 30, "the pending reason")
    job = said.group(1)
    waiting.proc.send_signal(signal.SIGINT)
    assert waiting.wait(60) == 130, waiting.err[-2000:]
    nothing_left(slurm_bed)
    assert slurm_bed.job(job)["JobState"] == "CANCELLED"

    inv = slurm_inventory(tmp_path, slurm={"nodes": 3}, env=ddp_job(steps=10_000, sleep=0.2))
    res = orch.run("up", str(inv), "--detach", "--run-id", "away", timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    data = orch.run_json("away")
    assert [n["node"] for n in data["nodes"]] == ["sn1", "sn3", "sn4"] and data["state"] == "running"
    job = data["slurm"]["job_id"]
    status = json.loads(orch.run("status", "away", "--json").stdout)
    assert {n["state"] for n in status["nodes"]} == {"running"}
    runs = json.loads(orch.run("runs", "--json").stdout)["runs"]
    assert [r["slurm_job"] for r in runs if r["run"] == "away"] == [job]
    said = orch.run("exec", "--json", "--", "echo $SLURMD_NODENAME $SLURM_JOB_ID")  # the latest run's nodes
    assert said.returncode == 0, said.stderr
    assert {n["node"]: n["stdout"].split() for n in json.loads(said.stdout)["nodes"]} == {
        name: [name, job] for name in ("sn1", "sn3", "sn4")
    }
    down = orch.run("down", "away")
    assert down.returncode == 0 and f"Slurm job {job} cancelled" in down.stdout + down.stderr, down.stderr
    assert orch.run_json("away")["state"] == "stopped"
    nothing_left(slurm_bed, settle_s=GIVE_BACK_AFTER_S + 10)


def test_inside_the_users_salloc_orch_uses_its_nodes_and_ctrl_c_leaves_the_allocation_to_its_owner(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    inv = slurm_inventory(tmp_path, slurm={}, env=ddp_job(steps=10_000, sleep=0.2))
    home = tmp_path / "home"
    env = {**slurm_bed.env, "ORCH_HOME": str(home), "NO_COLOR": "1"}
    out, err = tmp_path / "salloc.out", tmp_path / "salloc.err"
    with out.open("wb") as o, err.open("wb") as e:
        salloc = slurm_bed.popen(
            "salloc", "-N2", PYTHON, "-m", "orchestrator", "up", str(inv), "--skip-checks", "--run-id", "mine",
            env=env, stdout=o, stderr=e, cwd=REPO,
        )  # fmt: skip
    orch = Orch(home, env=slurm_bed.env)
    wait_for(lambda: orch.run_json("mine").get("state") == "running", 120, "the run inside salloc running")
    data = orch.run_json("mine")
    assert data["slurm"]["created"] is False and [n["node"] for n in data["nodes"]] == ["sn1", "sn2"]
    job = data["slurm"]["job_id"]
    children = Path(f"/proc/{salloc.pid}/task/{salloc.pid}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGINT)  # Ctrl-C of orch up, inside salloc
    assert salloc.wait(90) == 130, err.read_text()[-3000:]
    said = err.read_text()
    assert f"salloc: Relinquishing job allocation {job}" in said, said[-2000:]  # salloc ended it, once orch was done
    assert orch.run_json("mine")["state"] == "stopped"
    slurm_bed.wait_for(lambda: not slurm_bed.jobs(), 30, "salloc's allocation released by salloc")
    assert slurm_bed.job(job)["JobState"] == "FAILED"  # its command (orch) exited 130; CANCELLED had orch cancelled it
    nothing_left(slurm_bed)


def test_dry_run_prints_the_slurm_lines_and_touches_nothing(slurm_bed: SlurmBed, tmp_path: Path) -> None:
    inv = slurm_inventory(tmp_path, slurm={"nodes": 2, "time": "10", "options": ["--qos=normal"]})
    res = Orch(tmp_path / "home", env=slurm_bed.env).run("up", str(inv), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert (
        "sbatch --parsable --job-name=orch-lab --nodes=2 --time=10 --exclusive --signal=USR2@120 --requeue "
        "--output=/dev/null --chdir=/ --qos=normal --wrap 'exec sleep infinity'" in res.stdout
    ), res.stdout
    assert "srun '--jobid=<JOBID>' --overlap --nodes=2 --ntasks-per-node=1" in res.stdout, res.stdout
    assert slurm_bed.jobs() == []


def test_an_allocation_that_ends_under_the_run_is_named_and_the_retry_gets_a_new_one(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    """Slurm ends the allocation (here scancel, as a time limit or a preemption without requeue would):
    the attempt's first failure says so in words, and the retry runs in a new allocation orch asks for."""
    marker = tmp_path / "cancelled"
    inv = slurm_inventory(
        tmp_path, slurm={"nodes": 2}, env=ddp_job(steps=15, sleep=0.2, stop_file=str(marker)), retries=1
    )
    orch = Orch(tmp_path / "home", env=slurm_bed.env)
    up = orch.start(str(inv), "--skip-checks", "--run-id", "again")
    run = up.wait_running(120)
    first = orch.run_json(run)["slurm"]["job_id"]
    slurm_bed.run("scancel", first)
    marker.write_text("")  # the relaunch then ends after its first step
    assert up.wait(240) == 0, up.err[-3000:]
    data = orch.run_json(run)
    assert data["attempt"] == 2 and data["state"] == "succeeded"
    cause = data["attempts"][0]["first_failure"]["cause"]
    assert cause.startswith(f"Slurm job {first} ended: CANCELLED"), cause
    assert data["slurm"]["job_id"] != first and data["slurm"]["created"] is True
    assert f"Slurm job {first} ended: CANCELLED" in up.err and "asking for a new allocation" in up.err, up.err[-3000:]
    nothing_left(slurm_bed)


@pytest.mark.slow
@pytest.mark.waits
def test_a_run_that_reaches_its_time_limit_says_so_in_words(slurm_bed: SlurmBed, tmp_path: Path) -> None:
    """`slurm.time: 1` (a minute, Slurm's least): the warning comes at slurmctld's first 30 s pass and
    tests/ddp_job.py, which keeps it ignored, trains on; Slurm ends the allocation at its first pass
    after the minute (60 to 90 s in). The run fails with the cause in words, Slurm's limit and the
    fix, not as a signal its ranks died of."""
    inv = slurm_inventory(tmp_path, slurm={"nodes": 2, "time": "1"}, env=ddp_job(steps=100_000, sleep=0.2))
    orch = Orch(tmp_path / "home", env=slurm_bed.env)
    up = orch.start(str(inv), "--skip-checks", "--run-id", "timed")
    run = up.wait_running(120)
    job = orch.run_json(run)["slurm"]["job_id"]
    assert up.wait(150) == 1, up.err[-3000:]
    data = orch.run_json(run)
    assert data["state"] == "failed", data
    first = data["first_failure"]
    words = f"Slurm job {job} reached its time limit (00:01:00): the job was ended by Slurm"
    assert first["cause"].startswith(words), first
    assert first["hint"] == "a longer slurm.time, or job.retries to resume in a new allocation", first
    assert words in up.err, up.err[-3000:]
    assert slurm_bed.job(job)["JobState"] == "TIMEOUT"  # Slurm's doing, not a cancel of orch's
    nothing_left(slurm_bed)


def test_a_requeued_allocation_runs_the_retry_once_slurm_starts_it_again(slurm_bed: SlurmBed, tmp_path: Path) -> None:
    """`scontrol requeue` of orch's allocation (an admin's, or a preemption's): Slurm ends its steps and
    holds the job back (BeginTime); the retry asks for no second allocation, waits for this one to run
    again, and relaunches in it: the same job id, Restarts 1, the first attempt's cause in words."""
    marker = tmp_path / "requeued"
    inv = slurm_inventory(
        tmp_path, slurm={"nodes": 2}, env=ddp_job(steps=10_000, sleep=0.2, stop_file=str(marker)), retries=1
    )
    orch = Orch(tmp_path / "home", env=slurm_bed.env)
    up = orch.start(str(inv), "--skip-checks", "--run-id", "requeued")
    run = up.wait_running(120)
    job = orch.run_json(run)["slurm"]["job_id"]
    slurm_bed.run("scontrol", "requeue", job)
    slurm_bed.run_requeued_now(job, before=marker.touch)  # the relaunch ends after its first step
    assert up.wait(180) == 0, up.err[-3000:]
    data = orch.run_json(run)
    assert data["state"] == "succeeded" and data["attempt"] == 2, data
    assert data["slurm"]["job_id"] == job and slurm_bed.job(job)["Restarts"] == "1"
    cause = data["attempts"][0]["first_failure"]["cause"]
    assert cause.startswith(f"Slurm job {job} was requeued"), cause
    assert "asking for a new allocation" not in up.err and f"Slurm job {job} is running" in up.err, up.err[-3000:]
    nothing_left(slurm_bed)
