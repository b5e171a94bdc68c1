"""`rdma`: with checks.rdma.devices, each HCA present with an ACTIVE port, and the ring successor
reached over verbs."""

from __future__ import annotations

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, probed
from ..shapes import MapOf, Opt
from .common import ring_reach

FACTS = {
    "ib": {
        "root": str,
        "source": str,
        "tools": MapOf(Opt(str)),
        "error": str,
        "devices": MapOf(
            {
                "hca_type": Opt(str),
                "fw_ver": Opt(str),
                "board_id": Opt(str),
                "ports": MapOf({k: Opt(str) for k in ("state", "phys_state", "rate", "link_layer")}),
            }
        ),
    },
}
"""The probe's facts this check reads: /sys/class/infiniband, and which verbs tools are installed."""


def check_rdma(inv: Inventory, facts: Facts) -> list[CheckResult]:
    wanted = inv.checks.rdma_devices
    out = []
    for node, nf in probed(inv, facts):
        f = Findings("rdma", node.name)
        ib = nf.ib
        if not wanted:
            out.append(
                CheckResult(
                    "rdma",
                    node.name,
                    "skip",
                    f"{len(ib)} HCAs seen",
                    "RDMA not required (checks.rdma.devices is empty); TCP reachability between "
                    "nodes is reported under `ports`",
                )
            )
            continue
        shown = []
        for dev in wanted:
            d = ib.get(dev)
            if d is None:
                f.add(
                    "fail",
                    f"{dev} missing (have: {', '.join(sorted(ib)) or 'no HCAs'})",
                    "load the driver (modprobe mlx5_ib) / install MLNX_OFED, or fix checks.rdma.devices",
                )
                continue
            active = [p for p in d.ports if p.active]
            ports = ", ".join(f"port {p.port} {p.state}/{p.phys_state}" for p in d.ports) or "no ports"
            if not active:
                f.add(
                    "fail",
                    f"{dev}: no ACTIVE LinkUp port ({ports})",
                    f"check the cable and switch port; ibstat {dev}; the subnet manager (opensm) must be running",
                )
                continue
            p = active[0]
            shown.append(f"{dev} {p.rate or '?'} {p.link_layer or '?'}")
            if not p.rate or not p.link_layer:
                f.add("warn", f"{dev} port {p.port}: rate or link layer not reported")
            else:
                f.add("ok", f"{dev} port {p.port} ACTIVE, {p.rate}, {p.link_layer}")
        f.value = "; ".join(shown)
        ring_reach(nf, f, verbs=True)
        out.append(f.result())
    return out
