"""On a real GPU machine: the probe's live nvidia-smi query (with compute_cap, index and uuid), the
torch it asks about, and the gpus check's verdict on what they say; the trainer's --check picking
the GPU. Skipped where there is no NVIDIA GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.node import probe
from orchestrator.preflight import checks, cudacompat, parsers
from tests.trainer_helpers import make_dataset
from tests.unit.test_checks import by, make_facts
from tests.unit.test_gpu_compat import gpu_inventory

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"),
]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def need_gpu() -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi: not a GPU machine")


def test_the_live_query_reports_what_the_checks_need_and_this_torch_fits() -> None:
    os.environ.pop("ORCH_PROBE_FIXTURES", None)
    raw = probe.gather_gpus()
    g = parsers.parse_gpus(raw)
    assert g.gpus and not g.error, raw
    assert all(x.compute_cap is not None and x.uuid and x.uuid.startswith("GPU-") for x in g.gpus), g.gpus
    assert [x.index for x in g.gpus] == list(range(len(g.gpus)))
    torch = probe.gather_torch_cuda({})
    assert torch.get("cuda") and torch.get("arch_list"), torch
    for x in g.gpus:
        assert cudacompat.kernel_fit(torch["arch_list"], x.compute_cap).ok, (x, torch)  # type: ignore[arg-type]
    n = len(g.gpus)
    inv = gpu_inventory(nproc=n, gpus=n)

    def live(facts_raw: dict, nf: object) -> None:
        facts_raw.update(gpus=raw, torch_cuda=torch)

    rows = by(checks.run_checks(inv, make_facts(inv, {node.name: live for node in inv.nodes}), ["gpus"]), "gpus")
    assert rows["n1"].status in ("ok", "warn"), rows["n1"]  # warn: another job may hold the GPU
    assert "has kernels for GPU" in rows["n1"].detail, rows["n1"]


def test_the_trainers_check_picks_the_gpu(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "d", images=8, imgsz=32)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--check", "--data", str(data), "--batch", "4", "--device", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["device"] == "cuda:0" and answer["amp"] == "fp16" and answer["device_ids"] == [0], answer
