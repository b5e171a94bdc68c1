"""`gpus`: the GPUs each node declares are there, visible (CUDA_VISIBLE_DEVICES, the job's
--device), idle, of one model and driver across nodes, and driven by the node's torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...config.inventory import Inventory
from ...config.nodes import Node
from .. import cudacompat
from ..jobargs import device_ids
from ..parsers import Gpu, GpuFacts
from ..results import CheckResult, Facts, Findings, NodeFacts, odd_one_out, probed
from ..shapes import INT, RUN, ListOf, MapOf, Opt

FACTS = {
    "gpus": {"source": str, "query": RUN, "table": RUN, "error": str},
    "torch_cuda": Opt(
        {
            "torch": Opt(str),
            "cuda": Opt(str),
            "arch_list": ListOf(str),
            "releases": MapOf(ListOf(INT)),
            "device_count": INT,
            "error": str,
        }
    ),
}
"""The probe's facts this check reads: nvidia-smi's query and table, and the job's torch's CUDA build."""
BUSY_MIB = 1024


def check_gpus(inv: Inventory, facts: Facts) -> list[CheckResult]:
    nodes = probed(inv, facts)
    if not any(n.gpus for n in inv.nodes):
        return [
            CheckResult("gpus", n.name, "skip", "", "no node declares `gpus`: GPU checks not applicable")
            for n, _ in nodes
        ]
    gf = {n.name: nf.gpus for n, nf in nodes if n.gpus}
    seen = {k: g for k, g in gf.items() if g.gpus}
    models = {k: _models(g) for k, g in seen.items()}
    drivers = {k: g.driver for k, g in seen.items()}
    ids = device_ids(inv)
    out = []
    for node, nf in nodes:
        if not node.gpus:
            out.append(CheckResult("gpus", node.name, "skip", "", "this node declares no `gpus`"))
            continue
        out.append(_judge_gpus(node, nf, gf[node.name], models, drivers, ids))
    return out


def _models(g: GpuFacts) -> str:
    return " + ".join(sorted({x.name for x in g.gpus}))


def _judge_gpus(
    node: Node,
    nf: NodeFacts,
    g: GpuFacts,
    models: Mapping[str, str],
    drivers: Mapping[str, str | None],
    ids: tuple[int, ...] | None,
) -> CheckResult:
    f = Findings("gpus", node.name)
    if g.error or not g.gpus:
        f.add(
            "fail",
            f"no GPU visible: {g.error or 'nvidia-smi lists none'} ({g.source})",
            "install the NVIDIA driver and check that nvidia-smi works on this node",
        )
        return f.result()
    n = len(g.gpus)
    f.value = f"{n} × {_models(g)}, driver {g.driver}"
    visible = cudacompat.visible_devices(nf.env.get("CUDA_VISIBLE_DEVICES"), g.gpus)
    _judge_visible(node, g, visible, ids, f)
    if visible.value is None and n < node.nproc_per_node:
        f.add(
            "fail",
            f"{n} GPUs visible but nproc_per_node is {node.nproc_per_node}",
            "a worker needs its own GPU: fix the failed GPU (nvidia-smi -q) or lower nproc_per_node",
        )
    elif node.gpus and n < node.gpus:
        f.add("warn", f"{n} GPUs visible, the inventory declares {node.gpus}")
    if " + " in _models(g):
        f.add("warn", f"mixed GPU models on one node: {_models(g)}")
    for label, values, mine in (("model", models, _models(g)), ("driver", drivers, g.driver)):
        odd = odd_one_out(values, mine)
        if odd:
            common, count = odd
            f.add(
                "fail",
                f"GPU {label} {mine} differs from the majority ({count} nodes: {common})",
                "install the same driver on every node (mismatched drivers/CUDA fail silently in NCCL)",
            )
    _judge_torch_cuda(node, nf, g, visible.gpus or g.gpus, f)
    busy = sorted({p.gpu for p in g.processes} | {x.index for x in g.gpus if (x.memory_used_mib or 0) >= BUSY_MIB})
    if busy:
        procs = ", ".join(f"pid {p.pid} {p.name} on GPU {p.gpu} ({p.memory})" for p in g.processes[:4])
        f.add(
            "warn",
            f"GPUs {','.join(map(str, busy))} already in use" + (f": {procs}" if procs else ""),
            "stop the other job first (nvidia-smi shows its pids) or the run will OOM",
        )
    if not f.items:
        f.add("ok", f"{n} GPUs ≥ nproc_per_node {node.nproc_per_node}, idle ({g.source})")
    return f.result()


def _indices(gpus: Sequence[Gpu]) -> str:
    """GPU indices folded: `0-7`, `0,2,5`."""
    nums = sorted(g.index for g in gpus)
    if nums and nums == list(range(nums[0], nums[-1] + 1)) and len(nums) > 2:
        return f"{nums[0]}-{nums[-1]}"
    return ",".join(map(str, nums))


def _judge_visible(
    node: Node, g: GpuFacts, visible: cudacompat.Visible, ids: tuple[int, ...] | None, f: Findings
) -> None:
    """CUDA_VISIBLE_DEVICES against nvidia-smi's list and nproc_per_node; the job's --device inside it."""
    has = f"this node has GPUs {_indices(g.gpus)} ({len(g.gpus)} × {_models(g)})"
    if visible.value is not None:
        src = "the inventory env" if "CUDA_VISIBLE_DEVICES" in node.env else "the login environment"
        var = f"CUDA_VISIBLE_DEVICES={visible.value!r} (from {src})"
        fix = (
            "fix CUDA_VISIBLE_DEVICES in the inventory env"
            if "CUDA_VISIBLE_DEVICES" in node.env
            else "remove CUDA_VISIBLE_DEVICES from the login environment (~/.bashrc, /etc/environment) or set it in "
            "the inventory env"
        )
        for problem in visible.problems:
            f.add("fail", f"{var}: {problem}; {has}", f"{fix}: indices or UUIDs nvidia-smi -L lists")
        unchecked = (
            f", {visible.unverified} not checked (MIG or UUIDs nvidia-smi did not list)" if visible.unverified else ""
        )
        if visible.count < node.nproc_per_node:
            f.add(
                "fail",
                f"{var} leaves {visible.count} GPU(s) visible{unchecked}, nproc_per_node is "
                f"{node.nproc_per_node}: ranks {visible.count}-{node.nproc_per_node - 1} would have no GPU; "
                f"{has}",
                f"{fix}, or lower nproc_per_node to {visible.count}",
            )
        elif not visible.problems:
            f.add("ok", f"{var}: GPUs {_indices(visible.gpus) or '-'} visible{unchecked}")
    if ids is not None:
        count = visible.count
        beyond = [i for i in ids if i >= count]
        if beyond:
            seen = (
                f"CUDA_VISIBLE_DEVICES={visible.value!r} leaves {count}"
                if visible.value is not None
                else f"only {count} are visible"
            )
            f.add(
                "fail",
                f"the job's --device {','.join(map(str, ids))} names GPU {beyond[0]}, but {seen}: "
                f"--device counts the visible GPUs from 0; {has}",
                "list visible GPUs only (with CUDA_VISIBLE_DEVICES=2,3 they are --device 0,1), or drop --device "
                "(each rank takes its LOCAL_RANK's GPU)",
            )


def _judge_torch_cuda(node: Node, nf: NodeFacts, g: GpuFacts, gpus: Sequence[Gpu], f: Findings) -> None:
    """The node's torch against its GPUs (kernels for their compute capability) and its driver
    (new enough for torch's CUDA); see `cudacompat`."""
    tc = nf.raw.get("torch_cuda")
    if tc is None:
        return
    torch_v, cuda = tc.get("torch"), tc.get("cuda")
    if tc.get("error") or not torch_v:
        f.add(
            "warn",
            f"could not ask {node.python}'s torch which GPUs it supports: {tc.get('error') or 'no answer'}; "
            "architecture and driver not checked",
            "the software check says whether torch imports",
        )
        return
    if not cuda:
        f.add(
            "fail",
            f"torch {torch_v} of {node.python} is a CPU-only build: the job would not use the GPUs",
            "install a CUDA build of torch in that environment (pip install torch --index-url "
            "https://download.pytorch.org/whl/cu126, or the CUDA version the driver supports)",
        )
        return
    arch_list = list(tc.get("arch_list") or [])
    shown = " ".join(arch_list) or "none"
    by_cc: dict[tuple[int, int], list[Gpu]] = {}
    unknown = [x for x in gpus if x.compute_cap is None]
    for x in gpus:
        if x.compute_cap is not None:
            by_cc.setdefault(x.compute_cap, []).append(x)
    for cc, group in sorted(by_cc.items()):
        fit = cudacompat.kernel_fit(arch_list, cc)
        which = f"GPU {_indices(group)} {group[0].name} ({cudacompat.sm(cc)}, compute capability {cc[0]}.{cc[1]})"
        if not arch_list:
            f.add("warn", f"torch {torch_v} reports no architecture list: kernels for {which} not checked")
        elif not fit.ok:
            f.add(
                "fail",
                f"{which}: torch {torch_v} has kernels for {shown} and no PTX this GPU can compile: "
                "the job would die at its first CUDA kernel ('no kernel image is available for execution "
                "on the device')",
                _arch_hint(node, torch_v, cc, tc.get("releases") or {}, g.driver),
            )
        elif fit.ptx_only and g.cuda and cudacompat.version(g.cuda) < cudacompat.version(cuda):
            f.add(
                "fail",
                f"{which}: torch {torch_v} has no kernels for it, only PTX, which needs a driver for CUDA "
                f"{cuda} to compile; this driver is for CUDA {g.cuda} ({cudacompat.PTX_NOTE})",
                f"install a driver for CUDA >= {cuda}, or a torch build with {cudacompat.sm(cc)} kernels",
            )
        else:
            how = "PTX compiled when the job starts" if fit.ptx_only else "kernels"
            f.add("ok", f"torch {torch_v} (CUDA {cuda}) has {how} for {which}")
    need = cudacompat.min_driver(cuda)
    have = cudacompat.version(g.driver)
    if need is not None and have and have < need:
        f.add(
            "fail",
            f"driver {g.driver} is too old for torch {torch_v} (CUDA {cuda} needs driver >= "
            f"{cudacompat.dotted(need)}; NVIDIA's minor-version compatibility table): torch sees no GPU "
            "here, 'CUDA driver version is insufficient'",
            f"install an NVIDIA driver >= {cudacompat.dotted(need)} on this node, or a torch built for the CUDA this "
            f"driver supports{f' (nvidia-smi: CUDA {g.cuda})' if g.cuda else ''}",
        )
    if unknown:
        f.add(
            "warn",
            f"nvidia-smi does not report the compute capability of GPU {_indices(unknown)} (a driver older "
            f"than R510?): whether torch {torch_v} has kernels for them is not checked (it has {shown})",
            "a newer driver reports it (nvidia-smi --query-gpu=compute_cap --format=csv)",
        )


def _arch_hint(node: Node, torch_v: str, cc: tuple[int, int], releases: Mapping[str, Any], driver: str | None) -> str:
    """The torch to install instead: a build of the same release for a CUDA that still has
    kernels for this GPU, from the node's torch's own table where it has one."""
    base = torch_v.split("+")[0]
    fits = cudacompat.builds_for({k: list(v) for k, v in releases.items()}, cc)
    where = f"in {node.python}'s environment on every node (the same on all)"
    if fits:
        cu = "cu" + fits[-1].replace(".", "")
        need = cudacompat.min_driver(fits[-1])
        runs = (
            f" (it needs driver >= {cudacompat.dotted(need)}: this one, {driver}, will do)"
            if need and driver and cudacompat.version(driver) >= need
            else ""
        )
        return (
            f"install torch {base} built for CUDA {fits[-1]}, which has {cudacompat.sm(cc)} kernels{runs}, {where}: "
            f"{node.python} -m pip install torch=={base} --index-url https://download.pytorch.org/whl/{cu} "
            "(torchvision from the same index); see the README's GPU generations"
        )
    return (
        f"install a torch build for a CUDA version that still has {cudacompat.sm(cc)} kernels {where} "
        f"(check with python -c 'import torch; print(torch.cuda.get_arch_list())'); see the README's GPU "
        "generations"
    )
