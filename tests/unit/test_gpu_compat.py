"""The `gpus` check against the node's torch: kernels for each GPU's compute capability, a driver
new enough for torch's CUDA, and the GPUs CUDA_VISIBLE_DEVICES and --device leave the job. On
recorded nvidia-smi output (tests/fixtures/probe), recorded arch lists of real torch builds
(tests/fixtures/torch/arch_lists.json) and this machine's own torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.inventory import Inventory, parse
from orchestrator.preflight import checks, cudacompat, parsers
from orchestrator.preflight.facts import NodeFacts
from tests.unit.test_checks import by, make_facts, only_failure

FIX = Path(__file__).resolve().parent.parent / "fixtures"
RECORDED = {
    k: v["arch_list"]
    for k, v in json.loads((FIX / "torch" / "arch_lists.json").read_text()).items()
    if not k.startswith("_")
}


PINNED = json.loads((FIX / "torch" / "arch_lists.json").read_text())["2.14.1+cu130"]["probe"]
"""What the probe's child reports for the pinned torch (recorded; tests/local/test_torch_arch.py
asks the installed one)."""


@pytest.fixture(scope="module")
def this_torch() -> dict[str, Any]:
    """The probe's answer for the pinned torch 2.14.1+cu130: the unit tier imports no torch."""
    return dict(PINNED)


def gpus_of(fixture: str) -> dict[str, Any]:
    """The probe's `gpus` answer in fixture mode for one recorded set."""
    d = FIX / "probe" / fixture
    read = {
        n: (d / n).read_text() if (d / n).exists() else None for n in ("nvidia-smi-query-gpu.csv", "nvidia-smi.txt")
    }
    return {
        "source": f"fixture {d}",
        "query": {"rc": 0, "out": read["nvidia-smi-query-gpu.csv"], "err": ""}
        if read["nvidia-smi-query-gpu.csv"]
        else {"rc": None, "out": "", "err": "absent"},
        "table": {"rc": 0, "out": read["nvidia-smi.txt"], "err": ""}
        if read["nvidia-smi.txt"]
        else {"rc": None, "out": "", "err": "absent"},
    }


def gpu_inventory(extra_env: str = "", args: str = "", nproc: int = 8, gpus: int = 8) -> Inventory:
    return parse(
        f"""
name: t
nodes:
  - host: 10.0.0.[1-4]
    name: n[1-4]
    gpus: {gpus}
env: {{{extra_env}}}
job:
  python: /opt/py/bin/python
  workdir: /work
  nproc_per_node: {nproc}
  args: {{data: /data/coco.yaml, batch: 64{args}}}
""",
        "t.yaml",
    )


def judge(inv: Inventory, fixture: str, torch: dict[str, Any], edit: Any = None) -> dict[str, checks.CheckResult]:
    def put(raw: dict[str, Any], nf: NodeFacts) -> None:
        raw["gpus"] = gpus_of(fixture)
        raw["torch_cuda"] = torch
        raw["env"].update({k: v for k, v in nf.node.env.items() if k == "CUDA_VISIBLE_DEVICES"})  # as the probe sees it
        if edit:
            edit(raw, nf)

    facts = make_facts(inv, {n.name: put for n in inv.nodes})
    return by(checks.run_checks(inv, facts, ["gpus"]), "gpus")


# ----------------------------------------------------------------------------- the rules


@pytest.mark.parametrize(
    "code,cc,runs",
    [
        ("sm_70", (7, 0), True),
        ("sm_70", (7, 5), True),
        ("sm_75", (7, 0), False),
        ("sm_80", (8, 6), True),
        ("sm_86", (8, 0), False),
        ("sm_80", (9, 0), False),
        ("sm_90a", (9, 0), True),
        ("sm_100a", (10, 3), False),
        ("sm_100f", (10, 3), True),
        ("sm_120", (12, 0), True),
        ("sm_100", (12, 0), False),
        ("compute_120", (12, 1), True),
        ("compute_70", (9, 0), True),
        ("compute_90", (8, 0), False),
    ],
)
def test_nvidia_binary_and_ptx_compatibility(code: str, cc: tuple[int, int], runs: bool) -> None:
    arch = cudacompat.parse_arch(code)
    assert arch is not None and arch.runs_on(cc) is runs


def test_recorded_arch_lists_against_recorded_gpus() -> None:
    v100 = parsers.parse_gpu_query_csv((FIX / "probe" / "v100" / "nvidia-smi-query-gpu.csv").read_text())[0]
    h100 = parsers.parse_gpu_query_csv((FIX / "probe" / "h100-capture" / "nvidia-smi-query-gpu.csv").read_text())[0]
    assert (v100.compute_cap, h100.compute_cap) == ((7, 0), (9, 0))
    assert h100.uuid == "GPU-00000000-0000-0000-0000-000000000000"  # masked by the capture's author
    fits = {build: cudacompat.kernel_fit(arch_list, v100.compute_cap).ok for build, arch_list in RECORDED.items()}
    # Volta: in the CUDA 12.6 builds and in 2.10's cu128, gone from 2.11's cu128 (pytorch#182250)
    assert fits == {
        "2.14.1+cu130": False,
        "2.11.0+cu126": True,
        "2.11.0+cu128": False,
        "2.10.0+cu128": True,
        "cu128-with-ptx": True,
        "2.0-cu118-flags": True,
    }
    assert all(cudacompat.kernel_fit(arch_list, h100.compute_cap).ok for arch_list in RECORDED.values())
    blackwell = (12, 0)  # no sm_120 cubin and no PTX in the cu126 build
    assert not cudacompat.kernel_fit(RECORDED["2.11.0+cu126"], blackwell).ok
    assert cudacompat.kernel_fit(["sm_90", "compute_90"], blackwell).ptx_only


def test_driver_minimum_per_cuda_major() -> None:
    assert cudacompat.min_driver("13.0") == (580,) and cudacompat.min_driver("12.6") == (525,)
    assert cudacompat.dotted(cudacompat.min_driver("11.8") or ()) == "450.80.02"
    assert cudacompat.version("535.129.03") < (580,) <= cudacompat.version("590.48.01")
    assert cudacompat.min_driver("10.2") is None


# ----------------------------------------------------------------------------- the gpus check


def test_v100s_with_a_cuda_13_torch_fail_on_kernels_and_driver_naming_the_fix(this_torch: dict[str, Any]) -> None:
    inv = gpu_inventory()
    rows = judge(inv, "v100", this_torch)
    assert {n for n, r in rows.items() if r.status == "fail"} == {"n1", "n2", "n3", "n4"}
    r = rows["n2"]
    assert (
        f"GPU 0-7 Tesla V100-SXM2-16GB (sm_70, compute capability 7.0): torch 2.14.1+cu130 has kernels for "
        f"{' '.join(this_torch['arch_list'])} and no PTX this GPU can compile"
    ) in r.detail
    assert "no kernel image is available for execution on the device" in r.detail
    assert (
        "driver 535.129.03 is too old for torch 2.14.1+cu130 (CUDA 13.0 needs driver >= 580; NVIDIA's "
        "minor-version compatibility table)"
    ) in r.detail
    # the fix, from torch's own table of its builds: the CUDA 12.6 build still has sm_70
    assert (
        "install torch 2.14.1 built for CUDA 12.6, which has sm_70 kernels (it needs driver >= 525: this one, "
        "535.129.03, will do), in /opt/py/bin/python's environment on every node"
    ) in r.hint
    assert "--index-url https://download.pytorch.org/whl/cu126" in r.hint


def test_v100s_with_a_cuda_12_6_torch_pass(this_torch: dict[str, Any]) -> None:
    cu126 = {**this_torch, "torch": "2.11.0+cu126", "cuda": "12.6", "arch_list": RECORDED["2.11.0+cu126"]}
    rows = judge(gpu_inventory(), "v100", cu126)
    assert {r.status for r in rows.values()} == {"warn"}  # the recorded node runs 8 python ranks: busy, not broken
    assert "torch 2.11.0+cu126 (CUDA 12.6) has kernels for GPU 0-7 Tesla V100-SXM2-16GB" in rows["n1"].detail


def test_an_h100_with_its_driver_passes_and_a_cpu_torch_fails(this_torch: dict[str, Any]) -> None:
    inv = gpu_inventory(nproc=1, gpus=1)
    rows = judge(inv, "h100-capture", this_torch)
    assert {r.status for r in rows.values()} == {"ok"}, rows
    assert "has kernels for GPU 0 NVIDIA H100 80GB HBM3 (sm_90" in rows["n1"].detail
    cpu = {"torch": "2.14.1+cpu", "cuda": None, "arch_list": []}
    r = judge(inv, "h100-capture", cpu)["n3"]
    assert r.status == "fail" and "is a CPU-only build" in r.detail


def test_gpus_without_a_reported_compute_capability_are_said_unchecked(this_torch: dict[str, Any]) -> None:
    r = judge(gpu_inventory(), "v100-missing-gpu", this_torch)["n1"]  # the table only: no compute_cap
    assert "does not report the compute capability of GPU 0-6" in r.detail and "not checked" in r.detail


def test_a_torch_that_would_not_answer_is_a_warning_not_a_pass(this_torch: dict[str, Any]) -> None:
    hung = {"error": "importing torch took over 120s"}
    rows = judge(gpu_inventory(), "h100-capture", hung)
    assert "architecture and driver not checked" in rows["n1"].detail


# ----------------------------------------------------------------------------- the GPUs a job sees


@pytest.mark.parametrize(
    "value,visible,problems",
    [
        (None, 8, 0),
        ("", 0, 0),
        ("0,1", 2, 0),
        ("2,1", 2, 0),
        ("0,2,-1,1", 2, 1),
        ("0,9", 1, 1),
        ("GPU-00000000-0000-0000-0000-000000000003", 1, 0),
        ("GPU-00000000", 0, 1),
        ("MIG-abc", 1, 0),
        ("1,1", 1, 1),
        ("cuda0", 0, 1),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(value: str | None, visible: int, problems: int) -> None:
    gpus = parsers.parse_gpu_query_csv((FIX / "probe" / "v100" / "nvidia-smi-query-gpu.csv").read_text())
    got = cudacompat.visible_devices(value, gpus)
    assert (got.count, len(got.problems)) == (visible, problems), got


def test_visible_devices_fewer_than_nproc_fail_naming_the_value_and_the_node(this_torch: dict[str, Any]) -> None:
    cu126 = {**this_torch, "torch": "2.11.0+cu126", "cuda": "12.6", "arch_list": RECORDED["2.11.0+cu126"]}
    inv = gpu_inventory()

    def login_env(raw: dict[str, Any], nf: NodeFacts) -> None:
        if nf.node.name == "n3":
            raw["env"]["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"

    rows = judge(inv, "v100", cu126, login_env)
    assert {n for n, r in rows.items() if r.status == "fail"} == {"n3"}
    r = rows["n3"]
    assert (
        "CUDA_VISIBLE_DEVICES='0,1,2,3' (from the login environment) leaves 4 GPU(s) visible, nproc_per_node is 8: "
        "ranks 4-7 would have no GPU; this node has GPUs 0-7 (8 × Tesla V100-SXM2-16GB)"
    ) in r.detail
    assert "remove CUDA_VISIBLE_DEVICES from the login environment" in r.hint


def test_a_device_index_beyond_the_visible_gpus_fails(this_torch: dict[str, Any]) -> None:
    cu126 = {**this_torch, "torch": "2.11.0+cu126", "cuda": "12.6", "arch_list": RECORDED["2.11.0+cu126"]}
    inv = gpu_inventory(extra_env="CUDA_VISIBLE_DEVICES: '4,5'", args=", device: '4,5'", nproc=2)
    rows = judge(inv, "v100", cu126)
    r = rows["n1"]
    assert (
        r.status == "fail" and "the job's --device 4,5 names GPU 4, but CUDA_VISIBLE_DEVICES='4,5' leaves 2" in r.detail
    )
    assert "CUDA_VISIBLE_DEVICES='4,5' (from the inventory env): GPUs 4,5 visible" in r.detail
    assert "they are --device 0,1" in r.hint
    bad = gpu_inventory(extra_env="CUDA_VISIBLE_DEVICES: '0,8'", nproc=1)
    r = judge(bad, "v100", cu126)["n2"]
    assert (
        r.status == "fail"
        and "8 is not a GPU of this node (indices 0, 1, 2, 3, 4, 5, 6, 7); CUDA ignores it" in r.detail
    )
    assert only_failure(checks.run_checks(bad, make_facts(bad), ["ssh"])) == set()


def test_a_device_list_longer_than_the_node_fails_without_cuda_visible_devices(this_torch: dict[str, Any]) -> None:
    cu126 = {**this_torch, "torch": "2.11.0+cu126", "cuda": "12.6", "arch_list": RECORDED["2.11.0+cu126"]}
    inv = gpu_inventory(args=", device: '0,1,2,3,4,5,6,7,8'", nproc=8)
    r = judge(inv, "v100", cu126)["n4"]
    assert r.status == "fail" and "the job's --device 0,1,2,3,4,5,6,7,8 names GPU 8, but only 8 are visible" in r.detail
