"""`software`: python, torch, CUDA, NCCL and ultralytics as the job's python sees them, the same
on every node."""

from __future__ import annotations

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, odd_one_out, probed
from ..shapes import INT, ListOf, Opt
from .common import no_image, show

FACTS = {
    "software": {
        **{
            k: Opt(str)
            for k in (
                "python",
                "executable",
                "torch",
                "cuda",
                "nccl",
                "source",
                "ultralytics",
                "error",
                "torch_error",
                "nccl_error",
            )
        },
        "shm_bytes": Opt(INT),
        "memlock": Opt(INT),
        "infiniband": ListOf(str),
    },
}
"""The probe's facts this check reads (the container check too: /dev/shm, memlock, the verbs devices
inside the job's container)."""


SOFTWARE_KEYS = ("python", "torch", "cuda", "nccl", "ultralytics")


def check_software(inv: Inventory, facts: Facts) -> list[CheckResult]:
    nodes = probed(inv, facts)
    gone = {n.name: why for n, nf in nodes if (why := no_image(inv, nf))}
    sw = {n.name: dict(nf.raw.get("software") or {}) for n, nf in nodes if n.name not in gone}
    out = []
    for node, nf in nodes:
        if node.name in gone:  # nothing of the image answered here: one line, never a wrong hint
            out.append(CheckResult("software", node.name, "skip", "", gone[node.name]))
            continue
        s = sw[node.name]
        f = Findings("software", node.name)
        f.value = " ".join(f"{k} {s.get(k) or '-'}" for k in SOFTWARE_KEYS)
        if nf.python_fallback:
            f.add(
                "fail",
                f"job.python {node.python} does not work here ({nf.python_fallback}); the probe "
                "ran with python3 instead, but `orch up` would fail",
                f"install the environment at {node.python} on this node, or fix python: in the inventory",
            )
        if s.get("error"):
            f.add("fail", str(s["error"]))
        elif not s.get("torch"):
            f.add(
                "fail",
                f"torch is not importable by {node.python}: {s.get('torch_error', 'not installed')}",
                f"{node.python} -m pip install torch (the same version as the other nodes)",
            )
        if not s.get("ultralytics") and not s.get("error"):
            status = "fail" if (inv.job.module or "").startswith("trainer") else "warn"
            f.add(
                status,
                f"ultralytics is not installed for {node.python}",
                f"{node.python} -m pip install ultralytics (the same version as the other nodes)",
            )
        for key in SOFTWARE_KEYS:
            odd = odd_one_out({k: v.get(key) for k, v in sw.items()}, s.get(key))
            if odd:
                common, count = odd
                f.add(
                    "fail",
                    f"{key} {show(s.get(key))} differs from the majority ({count} nodes: {show(common)})",
                    "install identical versions everywhere (mismatched torch/CUDA/NCCL hang or fail silently)",
                )
        out.append(f.result("versions agree with every other node"))
    return out
