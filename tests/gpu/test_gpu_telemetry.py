"""Telemetry and per-rank timing on a real GPU: the live nvidia-smi answers every field the node
agent's sampler asks (`node/telemetry.py`; a driver that refused one would leave `gpus` empty), and
the trainer's `Pace` times a forward with CUDA events (`trainer/pace.py`).

Collected everywhere, run where torch sees a GPU; elsewhere skipped with the reason.
"""

from __future__ import annotations

import pytest
import torch

from orchestrator.node import telemetry
from trainer.logs import parse_timing
from trainer.pace import Pace

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False"),
]


def test_the_live_nvidia_smi_answers_every_sampled_field() -> None:
    gpus, why = telemetry.read_gpus()
    assert why is None and gpus, why
    assert len(gpus) >= torch.cuda.device_count()
    g = gpus[0]
    assert g["error"] is None, g
    for key in ("index", "name", "uuid", "util_pct", "mem_used_mb", "mem_total_mb", "temp_c", "sm_mhz"):
        assert g[key] is not None, (key, g)
    assert isinstance(g["throttle"], list)
    assert g["mem_total_mb"] * 2**20 >= torch.cuda.get_device_properties(0).total_memory * 0.9


def test_pace_times_the_forward_with_cuda_events() -> None:
    dev = torch.device("cuda", 0)
    x = torch.randn(2048, 2048, device=dev)
    pace = Pace(dev)
    for _ in range(5):
        pace.data(0.001)
        pace.forward_begins()
        for _ in range(20):
            x = torch.tanh(x @ x)
        pace.forward_ends(8)
    t = parse_timing(pace.line(1, 5))
    assert t is not None and t.steps == 5 and t.images == 40
    assert t.compute_s > 0 and t.compute_s <= t.wall_s
    assert t.data_s == pytest.approx(0.005)


def test_nvml_and_nvidia_smi_describe_the_same_gpus() -> None:
    """Where nvidia-ml-py is installed (torch's CUDA wheels bring it), the agent samples through
    NVML: the same GPUs, in the same order, with the same fixed facts as nvidia-smi gives."""
    pynvml = pytest.importorskip("pynvml")
    pynvml.nvmlInit()
    try:
        nvml = telemetry.read_gpus_nvml(pynvml)
    finally:
        pynvml.nvmlShutdown()
    smi, why = telemetry.read_gpus()
    assert why is None, why
    fixed = ("index", "uuid", "name", "mem_total_mb", "error")
    assert [{k: g[k] for k in fixed} for g in nvml] == [{k: g[k] for k in fixed} for g in smi]
    for g in nvml:
        assert g["util_pct"] is not None and g["temp_c"] is not None and isinstance(g["throttle"], list), g
