"""The trainer's run directory is defined once, by the trainer: an `orch up` retry passes
`--resume auto` and the trainer finds its own last.pt, wherever key=value `project=` and `name=`
put it (and however it was numbered). `transport: local`, two nodes of one rank each, real
torchrun (gloo), a rank killed once mid-epoch. That the resumed weights are an uninterrupted
run's, bit for bit, is test_trainer_ddp.py's and test_trainer_preempt.py's (the trainer's resume
itself; a retry under `orch up` over SSH, in containers, is test_up_container_retry.py's): this
run is the smallest that shows the directory found."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tests.ports import job_port
from tests.trainer_helpers import make_dataset
from tests.up_helpers import REPO, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_ONCE = REPO / "tests" / "kill_once"


def test_a_retry_resumes_with_key_value_project_and_name(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", images=8, classes=2)  # 6 training images: 3 steps of 1 per rank
    project = tmp_path / "nfs" / "p"
    (project / "r1" / "weights").mkdir(parents=True)  # an older run holds r1: this one trains in r12
    (project / "r1" / "weights" / "last.pt").write_bytes(b"not this run's")
    at = 3 + 1  # the 1st optimizer step of epoch 2: last.pt holds epoch 1
    marker = tmp_path / "killed"
    # ultralytics' own settings as key=value (`yolo train` style), the trainer's others as flags
    args = [
        *("model=yolo12n.yaml", f"data={data}", "epochs=2", "batch=2", "imgsz=64", "workers=0"),
        *(f"project={project}", "name=r1", "--accumulate", "1", "--val-period", "0", "--plots", "false"),
    ]
    python = REPO / ".venv" / "bin" / "python"
    inv = tmp_path / "local.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "lt",
                "transport": "local",
                "nodes": [
                    {"host": "localhost", "name": "n0"},
                    {
                        "host": "localhost",
                        "name": "n1",
                        "env": {
                            "PYTHONPATH": str(KILL_ONCE),
                            "ORCH_TEST_KILL_RANK": "1",
                            "ORCH_TEST_KILL_AT_STEP": str(at),
                            "ORCH_TEST_KILL_MARKER": str(marker),
                        },
                    },
                ],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                "job": {
                    "python": str(python) if python.exists() else "python3",
                    "workdir": str(REPO),
                    "run_root": str(tmp_path / "nodes"),
                    "module": "trainer",
                    "nproc_per_node": 1,
                    "stop_grace_s": 5,
                    "retries": 1,
                    "args": args,
                },
            }
        )
    )
    orch = Orch(tmp_path / "home")
    res = orch.run("up", str(inv), "--skip-checks", "--run-id", "kv", timeout=500)
    assert res.returncode == 0, res.stderr[-4000:]
    assert marker.read_text() == f"rank 1 killed after optimizer step {at}\n"
    assert "the trainer is relaunched with --resume auto" in res.stderr, res.stderr[-3000:]
    assert "resuming at epoch 2 (checkpoint finished epoch 1, " in res.stdout, res.stdout[-3000:]
    plan = json.loads((orch.run_dir("kv") / "plan.json").read_text())
    assert plan["nodes"][0]["argv"][-2:] == ["--resume", "auto"]
    assert (project / "r12" / ".orch-run-id").read_text().strip() == "kv"
    assert (project / "r1" / "weights" / "last.pt").read_bytes() == b"not this run's"
    assert sorted(os.listdir(project)) == ["r1", "r12"]
    assert (project / "r12" / "weights" / "last.pt").is_file()  # the retry finished the run where it began
