"""The installed torch, asked through the probe's child (an `import torch`): it is the pinned
build whose answer tests/unit/test_gpu_compat.py judges from tests/fixtures/torch/arch_lists.json."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.node import probe
from orchestrator.preflight import cudacompat

FIX = Path(__file__).resolve().parent.parent / "fixtures"


def test_this_machines_torch_is_the_recorded_pinned_build_without_volta_kernels() -> None:
    live = probe.gather_torch_cuda({})
    assert live["cuda"] and live["arch_list"], live
    assert not cudacompat.kernel_fit(live["arch_list"], (7, 0)).ok
    assert cudacompat.kernel_fit(live["arch_list"], (9, 0)).cubin
    recorded = json.loads((FIX / "torch" / "arch_lists.json").read_text())
    if live["torch"] in recorded and "probe" in recorded[live["torch"]]:
        assert live == recorded[live["torch"]]["probe"], "the recorded answer is stale: record it again"
