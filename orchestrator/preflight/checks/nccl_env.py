"""`nccl_env`: the NCCL and Gloo variables a job sees on each node: interfaces that exist and are
up, HCAs that exist, where Gloo would listen, and the same values on every node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...config.inventory import Inventory
from ...config.nodes import Node
from ..parsers import IbDevice
from ..results import CheckResult, Facts, Findings, NodeFacts, odd_one_out, probed
from ..shapes import ListOf, Opt
from .common import show

FACTS = {
    "ifaces": ListOf({"name": str, "up": bool, "ipv4": ListOf(str)}),
    "gloo_host": {"hostname": str, "addrs": ListOf(str), "usable": ListOf(str), "error": Opt(str)},
}
"""The probe's facts this check reads: the node's interfaces, and where Gloo would listen."""
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")


@dataclass(frozen=True)
class IfSpec:
    """NCCL_SOCKET_IFNAME syntax: `^` excludes, `=` matches exactly, else prefixes; comma list."""

    exclude: bool
    exact: bool
    names: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, exact_default: bool = False) -> IfSpec:
        s = text.strip()
        exclude = s.startswith("^")
        s = s[1:] if exclude else s
        exact = s.startswith("=")
        s = s[1:] if exact else s
        return cls(exclude, exact or exact_default, tuple(p.strip() for p in s.split(",") if p.strip()))

    def matches(self, entry: str, name: str) -> bool:
        return name == entry if self.exact else name.startswith(entry)


def _ifaces(nf: NodeFacts) -> list[dict[str, Any]]:
    return list(nf.raw.get("ifaces") or [])


def _describe_if(i: Mapping[str, Any]) -> str:
    state = "up" if i.get("up") else "DOWN"
    return f"{i['name']} ({state}, {', '.join(i.get('ipv4') or []) or 'no IPv4'})"


def judge_ifname(var: str, value: str, ifaces: Sequence[Mapping[str, Any]], f: Findings) -> None:
    """Would NCCL/Gloo find a usable interface (up, with IPv4) for this setting here?"""
    spec = IfSpec.parse(value, exact_default=var.startswith("GLOO_"))
    usable = [i for i in ifaces if i.get("up") and i.get("ipv4")]
    have = ", ".join(_describe_if(i) for i in ifaces) or "none"
    hint = f"set {var} to an interface that exists and is up with an IPv4 address on every node (ip -br addr)"
    if spec.exclude:
        left = [i for i in usable if not any(spec.matches(e, i["name"]) for e in spec.names)]
        if not [i for i in left if i["name"] != "lo"]:
            f.add("fail", f"{var}={value} excludes every usable interface here (have: {have})", hint)
        return
    matched = [i for i in ifaces if any(spec.matches(e, i["name"]) for e in spec.names)]
    good = [i for i in matched if i.get("up") and i.get("ipv4")]
    if not matched:
        f.add("fail", f"{var}={value}: no such interface on this node (have: {have})", hint)
    elif not good:
        f.add(
            "fail",
            f"{var}={value}: {', '.join(_describe_if(i) for i in matched)} is not up with an IPv4 address",
            f"bring it up: ip link set {matched[0]['name']} up, and give it an address",
        )
    else:
        missing = [e for e in spec.names if not any(spec.matches(e, i["name"]) for i in ifaces)]
        if missing:
            f.add(
                "warn",
                f"{var}={value}: {', '.join(missing)} not found; NCCL will use {', '.join(i['name'] for i in good)}",
                hint,
            )
        else:
            f.add("ok", f"{var}={value} → {', '.join(_describe_if(i) for i in good)}")


def judge_ib_hca(value: str, ib: Mapping[str, IbDevice], f: Findings) -> None:
    """NCCL_IB_HCA entries (`[^][=]mlx5_0[:port],...`) must name devices this node has."""
    spec = IfSpec.parse(value)
    if spec.exclude:
        return
    have = ", ".join(sorted(ib)) or "none"
    missing = [e for e in spec.names if not any(spec.matches(e.split(":")[0], d) for d in ib)]
    if missing:
        f.add(
            "fail",
            f"NCCL_IB_HCA={value}: {', '.join(missing)} not under /sys/class/infiniband (have: {have})",
            "name HCAs that exist on every node (ibv_devices / ls /sys/class/infiniband), or unset NCCL_IB_HCA",
        )
    else:
        f.add("ok", f"NCCL_IB_HCA={value} present")


def _is_loopback(addr: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return addr == "localhost"


def gloo_needed(inv: Inventory, node: Node) -> bool:
    """Whether the job makes a Gloo group on `node`: any job but this repository's trainer on a node
    with GPUs (its NCCL runs keep their start-up barriers on torchrun's store, not on Gloo), and
    the trainer told `device: cpu`."""
    on_cpu = str(inv.job.raw_args.get("device", "")).strip().lower() == "cpu"
    return not (inv.job.script is None and inv.job.module == "trainer" and (node.gpus or 0) > 0) or on_cpu


def judge_gloo_listen(inv: Inventory, node: Node, nf: NodeFacts, env: Mapping[str, str], f: Findings) -> None:
    """Where Gloo would listen on this node without GLOO_SOCKET_IFNAME (the probe's `gloo_host`:
    the hostname's first bindable address, else loopback): loopback while the other nodes are
    other machines means every Gloo group of the job times out in connectFullMesh."""
    gh = nf.raw.get("gloo_host")
    if env.get("GLOO_SOCKET_IFNAME") or not gh or len(inv.nodes) < 2 or _is_loopback(inv.master.addr):
        return
    usable = list(gh.get("usable") or [])
    host = gh.get("hostname", "?")
    if usable and not _is_loopback(usable[0]):
        f.add("ok", f"Gloo would listen on {usable[0]} (hostname {host})")
        return
    found = ", ".join(gh.get("addrs") or []) or "nothing"
    mine = next((i["name"] for i in _ifaces(nf) if node.addr in (i.get("ipv4") or [])), None)
    nccl = env.get("NCCL_SOCKET_IFNAME", "").lstrip("=")
    iface = mine or (nccl if nccl and not any(c in nccl for c in "^,") else None)
    fix = (
        f"set GLOO_SOCKET_IFNAME={iface} in the inventory env"
        + (f" (the interface of this node's addr {node.addr})" if mine else " (the NCCL interface)")
        if iface
        else f"set GLOO_SOCKET_IFNAME in the inventory env to the interface of this node's addr {node.addr}"
    )
    said = (
        f"GLOO_SOCKET_IFNAME is not set and hostname {host!r} resolves to {found}: Gloo would listen on "
        f"{usable[0] if usable else '127.0.0.1'} (loopback), so the other nodes cannot connect (connectFullMesh "
        "times out)"
    )
    if gloo_needed(inv, node):
        f.add("fail", said, fix)
    else:
        f.add("warn", said + "; the trainer's NCCL runs do not use Gloo, a job that makes a Gloo group would", fix)


def nccl_vars(nf: NodeFacts) -> dict[str, str]:
    return {k: v for k, v in nf.env.items() if k.startswith(NCCL_PREFIXES)}


def check_nccl_env(inv: Inventory, facts: Facts) -> list[CheckResult]:
    nodes = probed(inv, facts)
    envs = {n.name: nccl_vars(nf) for n, nf in nodes}
    names = sorted({k for e in envs.values() for k in e})
    out = []
    for node, nf in nodes:
        env = envs[node.name]
        f = Findings("nccl_env", node.name)
        f.value = ", ".join(f"{k}={v}" for k, v in env.items() if k.endswith(("IFNAME", "IB_HCA", "IB_DISABLE"))) or (
            f"{len(env)} set" if env else "none set"
        )
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if env.get(var):
                judge_ifname(var, env[var], _ifaces(nf), f)
        judge_gloo_listen(inv, node, nf, env, f)
        if env.get("NCCL_IB_HCA"):
            judge_ib_hca(env["NCCL_IB_HCA"], nf.ib, f)
        if env.get("NCCL_IB_DISABLE", "").strip() == "1" and inv.checks.rdma_devices:
            src = "the inventory env" if "NCCL_IB_DISABLE" in node.env else "the login environment"
            f.add(
                "fail",
                f"NCCL_IB_DISABLE=1 (from {src}) while checks.rdma.devices lists "
                f"{', '.join(inv.checks.rdma_devices)}: NCCL would silently fall back to TCP sockets",
                "unset NCCL_IB_DISABLE (or set it to 0) on this node"
                + ("" if "NCCL_IB_DISABLE" in node.env else " (check ~/.bashrc, /etc/environment)"),
            )
        for var in names:
            others = {n: e.get(var) for n, e in envs.items()}
            odd = odd_one_out(others, env.get(var))
            if odd:
                common, count = odd
                f.add(
                    "warn",
                    f"{var}={show(env.get(var))} here, but {count} of {len(others)} nodes have {var}={show(common)}",
                    f"set {var} in the inventory `env` so every node gets the same value",
                )
        out.append(f.result(f"{len(env)} NCCL/Gloo variables, none needs attention"))
    return out
