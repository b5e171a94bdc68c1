"""The trainer on 4 nodes of a real Slurm (the loopback bed), one rank each: `orch up` asks for the
allocation, launches, and Slurm's warning signal (`scancel --signal=USR2`, what a preemption or a
coming time limit sends every step) makes the trainer write its checkpoint and exit 75; orch calls
the attempt preempted and relaunches it in the same allocation with `--resume auto`, and the run
succeeds. `orch stacks` while it trains; then `orch status`, `orch logs`, `orch top`, `orch report` and
`orch runs` on it, and
nothing left in `squeue` or the process table. One trainer run of a tiny synthetic dataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.ports import job_port
from tests.slurm_bed import SlurmBed
from tests.trainer_helpers import make_dataset
from tests.up_helpers import Orch, node_log, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(420)]


def test_a_4_node_trainer_run_warned_by_slurm_checkpoints_resumes_in_its_allocation_and_reports(
    slurm_bed: SlurmBed, tmp_path: Path
) -> None:
    data = make_dataset(tmp_path / "ds", images=40, imgsz=32)  # 32 to train: 4 batches of 2 per rank
    nodes = tmp_path / "nodes"
    inv = tmp_path / "lab.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "lab",
                "transport": "slurm",
                "slurm": {"nodes": 4},
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                "job": {
                    "python": sys.executable,
                    "workdir": str(tmp_path),
                    "run_root": str(nodes),
                    "module": "trainer",
                    "nproc_per_node": 1,
                    "stop_grace_s": 10,
                    "retries": 1,
                    "telemetry_s": 1,
                    "args": {
                        "model": "yolo12n.yaml",
                        "data": str(data),
                        "epochs": 2,
                        "batch": 8,
                        "imgsz": 32,
                        "accumulate": 1,
                        "workers": 0,
                        "log-every": 1,
                        "val-period": 0,
                        "plots": False,
                        "device": "cpu",
                        "project": str(tmp_path / "p"),
                        "name": "r",
                    },
                },
            }
        )
    )
    orch = Orch(tmp_path / "home", env=slurm_bed.env)
    up = orch.start(str(inv), "--skip-checks", "--run-id", "warned")
    run = up.wait_running(180)
    job = orch.run_json(run)["slurm"]["job_id"]
    wait_for(lambda: "epoch 1/2 batch 1/4" in node_log(nodes, run, "sn1"), 240, "rank 0's first step")
    stacks = orch.run("stacks", run, "--json", timeout=120)  # every rank's stack, each node's own step
    assert stacks.returncode == 0, stacks.stdout[-2000:] + stacks.stderr[-2000:]
    assert sorted(r["node"] for r in json.loads(stacks.stdout)["ranks"]) == ["sn1", "sn2", "sn3", "sn4"]
    slurm_bed.run("scancel", "--signal=USR2", job)  # every process of every step of the allocation
    assert up.wait(300) == 0, up.err[-4000:]

    said = up.err
    assert "preempted" in said and "attempt 2/2" in said, said[-3000:]
    assert "the trainer is relaunched with --resume auto" in said, said[-3000:]
    log0 = node_log(nodes, run, "sn1")
    assert "preempted (SIGUSR2): checkpoint " in log0, log0[-3000:]
    assert "resuming " in up.out, up.out[-3000:]  # mid-epoch, or after the epoch the signal ended
    record = orch.run_json(run)
    assert record["state"] == "succeeded" and record["attempt"] == 2
    assert record["slurm"]["job_id"] == job  # the same allocation ran both attempts
    assert "preempted" in record["attempts"][0]["first_failure"]["cause"], record["attempts"][0]

    status = json.loads(orch.run("status", run, "--json").stdout)
    assert status["state"] == "succeeded" and [n["node"] for n in status["nodes"]] == ["sn1", "sn2", "sn3", "sn4"]
    logs = orch.run("logs", run, "--rank", "3", "--tail", "3")
    assert logs.returncode == 0 and logs.stdout.strip() and all(" sn4 " in ln for ln in logs.stdout.splitlines())
    top = orch.run("top", run, "--json")
    assert top.returncode == 0, top.stderr
    assert [n["node"] for n in json.loads(top.stdout)["nodes"]] == ["sn1", "sn2", "sn3", "sn4"]
    report = orch.run("report", run, timeout=240)
    assert report.returncode == 0, report.stderr
    assert (orch.run_dir(run) / "report" / "index.html").is_file()
    runs = json.loads(orch.run("runs", "--json").stdout)["runs"]
    assert [r["slurm_job"] for r in runs if r["run"] == run] == [job]
    assert slurm_bed.jobs() == [] and slurm_bed.left_behind() == []
