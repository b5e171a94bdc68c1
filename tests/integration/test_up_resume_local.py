"""The trainer's run directory is defined once, by the trainer: an `orch up` retry passes
`--resume auto` and the trainer finds its own last.pt, wherever key=value `project=` and `name=`
put it (and however it was numbered). `transport: local`, two nodes of one rank each, real
torchrun (gloo), a rank killed once mid-epoch; the resumed weights are the uninterrupted run's."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from tests.ports import job_port
from tests.trainer_helpers import RESUME_BATCH, RESUME_FLAGS, Reference
from tests.up_helpers import REPO, Orch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_ONCE = REPO / "tests" / "kill_once"


def test_a_retry_resumes_with_key_value_project_and_name(trainer_reference: Reference, tmp_path: Path) -> None:
    ref = trainer_reference
    project = tmp_path / "nfs" / "p"
    (project / "r1" / "weights").mkdir(parents=True)  # an older run holds r1: this one trains in r12
    (project / "r1" / "weights" / "last.pt").write_bytes(b"not this run's")
    train = len(list((ref.data.parent / "images" / "train").iterdir()))
    at = 2 * math.ceil(math.ceil(train / 2) / (RESUME_BATCH // 2)) + 2  # 2nd optimizer step of epoch 3
    marker = tmp_path / "killed"
    # the reference's flags, ultralytics' own as key=value (`yolo train` style), the trainer's others as flags
    keys = {
        "--lr": "lr0",
        "--model": "model",
        "--epochs": "epochs",
        "--batch": "batch",
        "--imgsz": "imgsz",
        "--seed": "seed",
        "--warmup-epochs": "warmup_epochs",
        "--workers": "workers",
        "--close-mosaic": "close_mosaic",
    }
    args: list[str] = []
    for flag, value in zip(RESUME_FLAGS[::2], RESUME_FLAGS[1::2]):
        args += [f"{keys[flag]}={value}"] if flag in keys else [flag, value]
    args += [f"data={ref.data}", f"project={project}", "name=r1", "--debug-dir", str(tmp_path / "debug")]
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
    assert "resuming at epoch 3 (checkpoint finished epoch 2, " in res.stdout, res.stdout[-3000:]
    plan = json.loads((orch.run_dir("kv") / "plan.json").read_text())
    assert plan["nodes"][0]["argv"][-2:] == ["--resume", "auto"]
    assert (project / "r12" / ".orch-run-id").read_text().strip() == "kv"
    assert (project / "r1" / "weights" / "last.pt").read_bytes() == b"not this run's"
    assert sorted(os.listdir(project)) == ["r1", "r12"]
    for rank in (0, 1):  # the final weights are the uninterrupted run's
        assert json.loads((tmp_path / "debug" / f"rank{rank}.json").read_text())["checksum"] == ref.checksum(rank)
