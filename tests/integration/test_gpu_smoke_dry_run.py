"""bench/gpu_smoke.py --cpu-dry-run end to end, on this CPU machine: every step that can run without
a GPU runs (real trainer, two ranks under torchrun, ultralytics, orch check, orch up and orch
stacks, the fabric job over gloo, pytest), the GPU-only parts are skipped with the reason, the
JSON and the table say so, a step that overruns its budget is stopped and recorded while the next
still runs, and nothing the script started outlives it. The children see only the GPU machine's
packages and the carried wheels (the dry run's module block), as they would there.

Three minutes of real training on this machine: not part of `make test` (a run over the directories
leaves it out, tests/integration/conftest.py); `make gpu-smoke-dry-run` runs it, before a GPU
lease. tests/unit/test_gpu_smoke.py holds the script's plumbing in the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bench.gpu_smoke import STEP_NAMES

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def survivors(marker: str) -> list[int]:
    """Pids of this machine whose environment mentions ``marker`` (the run's own scratch dir)."""
    want = marker.encode()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if want in fh.read():
                        out.append(int(name))
            except OSError:
                continue
    return out


def smoke(tmp_path: Path, *args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    p = subprocess.run(
        [
            sys.executable,
            "bench/gpu_smoke.py",
            "--cpu-dry-run",
            "--out",
            str(out),
            "--work",
            str(work),
            "--keep-work",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    doc = json.loads((out / "gpu_smoke.json").read_text())
    assert survivors(str(work)) == [], "a process the script started outlived it"
    return p, doc


def explain(p: subprocess.CompletedProcess[str]) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-8000:]}\n--- stderr\n{p.stderr[-3000:]}"


@pytest.mark.timeout(2400)
def test_the_cpu_dry_run_runs_every_step_that_needs_no_gpu(tmp_path: Path) -> None:
    p, doc = smoke(tmp_path, timeout=2300)
    assert p.returncode == 0, explain(p)
    assert doc["mode"] == "cpu-dry-run" and doc["ok"] is True and doc["summary"] == []
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == list(STEP_NAMES)
    for name in ("data", "environment", "ddp", "sync_bn", "trainer", "syncs", "yoloe", "orch_up", "fabric"):
        assert steps[name]["status"] == "pass", (name, steps[name]["error"])
        assert 0 < steps[name]["seconds"] <= steps[name]["budget_s"]
    assert steps["gpu_tests"]["status"] in ("pass", "skip"), steps["gpu_tests"]["error"]
    assert steps["scaling"]["status"] == "skip" and "needs >= 2 GPUs" in steps["scaling"]["reason"]

    # the GPU-only parts are named, each with its reason
    assert steps["environment"]["skipped"]["real nvidia-smi"].startswith("no GPU: the gpus check reads recorded")
    assert "CUDA only" in next(iter(steps["trainer"]["skipped"].values()))
    assert steps["syncs"]["skipped"]["sync debug mode"].startswith("no CUDA")
    assert steps["fabric"]["skipped"]["NCCL_DEBUG=INFO lines"].startswith("no GPU")
    assert steps["sync_bn"]["skipped"]["--sync-bn"].startswith("CUDA only")

    env = steps["environment"]["figures"]
    assert env["versions"]["cuda_available"] is False and env["versions"]["torch"]
    gpus = env["orch_check"]["results"]["gpus@gpu0"]
    assert gpus["status"] in ("ok", "warn") and "NVIDIA H100 80GB HBM3" in gpus["value"]  # the recorded nvidia-smi
    assert env["orch_check"]["results"]["software@gpu0"]["status"] == "ok"

    tr = steps["trainer"]["figures"]
    assert tr["runs"]["trainer-off"]["ips"] > 0 and tr["runs"]["ultralytics"]["ips"] > 0
    assert tr["runs"]["trainer-off"]["ratio"] == pytest.approx(
        tr["runs"]["trainer-off"]["ips"] / tr["runs"]["ultralytics"]["ips"]
    )
    # polars is not on the GPU machine, and the dry run's children could not import it either
    assert tr["runs"]["ultralytics"]["notes"] == [
        "polars is not installed: BaseTrainer.read_results_csv reads results.csv with the csv module"
    ]
    assert tr["map"]["difference"] == pytest.approx(abs(tr["map"]["logged"] - tr["map"]["val"]))
    assert [g["goal"] for g in steps["trainer"]["goals"]] == ["report", "<= 0.002"]

    assert steps["syncs"]["figures"]["micro_steps"] > 0 and steps["syncs"]["figures"]["cuda"] is False
    assert "metrics/mAP50-95(M)" in steps["yoloe"]["figures"]["final"]
    up = steps["orch_up"]["figures"]
    assert up["exit_code"] == 0 and up["state"] == "succeeded" and up["stacks"]["ranks"] == [0]
    assert up["stacks"]["summary"] and up["stacks"]["frames"]
    fab = steps["fabric"]["figures"]
    assert fab["backend"] == "gloo" and fab["world_size"] == 1 and fab["status"] == "ok"
    ddp = steps["ddp"]["figures"]
    assert ddp["grad_comm"]["dtype"] == "float16" and ddp["optimizer_steps"] > 0
    assert steps["sync_bn"]["figures"]["bytes_ratio"] == 0.5  # fp16 all-reduces send half fp32's bytes
    assert [g["goal"] for g in steps["sync_bn"]["goals"]] == ["= 0.5"] and steps["sync_bn"]["goals"][0]["met"]

    # the table is printed last, and kept beside the JSON
    table = (tmp_path / "out" / "gpu_smoke.txt").read_text().rstrip("\n")
    said = f"\nproved: {'; '.join(doc['proved']['proved'])}"
    assert p.stdout.rstrip("\n").endswith(table + said + f"\nJSON: {tmp_path / 'out' / 'gpu_smoke.json'}")
    assert [x.split(":")[0] for x in doc["proved"]["proved"]] == ["data", "environment", "gpu_tests", "ddp", "sync_bn"]
    rows = {ln.split()[0]: ln.split()[1] for ln in table.splitlines()[2:] if ln and ln.split()[0] in steps}
    assert rows == {name: s["status"] for name, s in steps.items()}
    assert table.splitlines()[0].startswith("gpu_smoke (cpu-dry-run): 11 steps, ")

    with tarfile.open(tmp_path / "out" / "gpu_smoke_logs.tar.gz") as tar:
        logged = {Path(n).parts[1] for n in tar.getnames()}
    assert logged >= {"data", "environment", "ddp", "sync_bn", "trainer", "syncs", "yoloe", "orch_up", "fabric"}
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "gpu_smoke.json",
        "gpu_smoke.txt",
        "gpu_smoke_logs.tar.gz",
    ]


@pytest.mark.timeout(900)
def test_a_step_that_overruns_is_stopped_and_the_next_still_runs(tmp_path: Path) -> None:
    tests = tmp_path / "gpu_tests"
    tests.mkdir()
    (tests / "test_cuda.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_needs_cuda():\n    pytest.importorskip('torch')\n"
        "    import torch\n    if not torch.cuda.is_available():\n        pytest.skip('no CUDA')\n\n\n"
        "def test_not_a_gpu_test():\n    pass\n"
    )
    p, doc = smoke(
        tmp_path,
        "--steps",
        "syncs,orch_up,gpu_tests",
        "--step-budget",
        "syncs=2",
        "--step-budget",
        "orch_up=6",
        "--gpu-tests",
        str(tests),
        timeout=800,
    )
    assert p.returncode == 1, explain(p)  # a timeout is not ok
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == ["data", "environment", "gpu_tests", "syncs", "orch_up"]  # the tests first
    assert steps["syncs"]["status"] == "timeout" and doc["ok"] is False and doc["counts"]["timeout"] == 2
    assert steps["syncs"]["error"] == "gpu-syncs still running at the step's budget (2 s): stopped"
    # stopped mid-run (in orch up, or in an orch stacks of it): SIGTERM tears the run down, orch down makes sure,
    # and what orch up left in sessions of their own (its preflight's probe, when stopped during the preflight)
    # is stopped and named in the JSON (smoke() finds no survivor of it)
    assert isinstance(doc["strays"], list)
    assert steps["orch_up"]["status"] == "timeout"
    assert "still running at the step's budget (6 s): stopped" in steps["orch_up"]["error"]
    assert steps["gpu_tests"]["status"] == "pass", steps["gpu_tests"]["error"]
    assert steps["gpu_tests"]["figures"]["tests"] == 1 and steps["gpu_tests"]["figures"]["skipped"] == 1
    assert any(ln.startswith("syncs ") and " timeout " in ln for ln in p.stdout.splitlines())
