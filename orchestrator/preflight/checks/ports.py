"""`ports`: the master port free on the master and reached from every node, each node's addr
listenable, and its ring successor reached over TCP."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, NodeFacts, probed
from ..shapes import ListOf, Opt
from .common import ring_reach
from .nccl_env import _ifaces, _is_loopback

FACTS = {"master_addr": {"addr": str, "addrs": ListOf(str), "error": Opt(str)}, "net_stack": Opt(str)}
"""The probe's facts this check reads beyond its listen and reach tests: the master's address as
this node resolves it, and the network stack it runs in (boot id and network namespace)."""


def check_ports(inv: Inventory, facts: Facts) -> list[CheckResult]:
    master = facts.get(inv.master.name)
    mp = (master.listen.get("master_port") if master and master.ok else None) or {}
    out = []
    separate = len(inv.nodes) > 1 and not one_network(inv, facts)
    for node, nf in probed(inv, facts):
        f = Findings("ports", node.name)
        f.value = str(inv.master_port)
        ring = nf.listen.get("ring") or {}
        if ring.get("error"):
            f.add(
                "fail",
                f"cannot listen on this node's addr {node.addr}: {ring['error']}",
                "addr: must be an IP of this node on the data-plane network (ip -br addr); rendezvous and NCCL use it",
            )
        if len(inv.nodes) > 1:
            _master_resolves(nf.raw.get("master_addr"), inv.master.addr, separate, f)
        if node.name == inv.master.name:
            if mp.get("bound"):
                f.add("ok", f"port {inv.master_port} is free on the master (bound 0.0.0.0:{inv.master_port})")
            else:
                holder = f" by {mp['holder']}" if mp.get("holder") else ""
                f.add(
                    "fail",
                    f"master port {inv.master_port} is taken{holder}: {mp.get('error') or 'not tested'}",
                    f"stop what listens there (ss -ltnp 'sport = :{inv.master_port}') or pick another master.port",
                )
        else:
            _master_reach(inv.master.name, f"{inv.master.addr}:{inv.master_port}", inv.master_port, nf, mp, master, f)
        ring_reach(nf, f)
        out.append(f.result())
    return out


def one_network(inv: Inventory, facts: Facts) -> bool:
    """Whether every probed node is the same network stack (one machine), where loopback reaches
    every node: the same boot id and network namespace where every probe says them; else (a probe
    of an older orch) the same IPv4 addresses on the same interfaces, which a veth added between
    two probes (a container starting) can tell apart."""
    stacks = {nf.raw.get("net_stack") for _node, nf in probed(inv, facts)}
    if None not in stacks:
        return len(stacks) <= 1
    seen = {
        tuple(sorted((i.get("name"), tuple(i.get("ipv4") or [])) for i in _ifaces(nf)))
        for _node, nf in probed(inv, facts)
    }
    return len(seen) <= 1


def _master_resolves(got: Mapping[str, Any] | None, master: str, separate: bool, f: Findings) -> None:
    """The master's address (`master`) as a node resolved it (`got`, its probe's `master_addr`):
    never loopback when the nodes are separate machines (`separate`; Debian's `127.0.1.1 <hostname>`
    line: the master's store, Gloo and NCCL would listen where no other node can reach them), and
    never unresolved."""
    if not got:
        return
    addr, addrs = got.get("addr", master), list(got.get("addrs") or [])
    if got.get("error") or not addrs:
        f.add(
            "fail",
            f"the master's address {addr} does not resolve on this node: {got.get('error') or 'no address'}",
            "give every node a name for it (DNS, /etc/hosts), or name the master by an IP",
        )
    elif any(_is_loopback(a) for a in addrs) and separate:
        loop = ", ".join(a for a in addrs if _is_loopback(a))
        f.add(
            "fail",
            f"the master's address {addr} resolves to {', '.join(addrs)} on this node: loopback ({loop}), and the "
            "nodes are separate machines: the rendezvous would listen or connect where no other node can",
            f"remove the loopback line for {addr} from this node's /etc/hosts (Debian's `127.0.1.1 {addr}`), "
            "or name the master by an address every node reaches",
        )
    else:
        f.add("ok", f"the master's address {addr} resolves to {', '.join(addrs)}")


def _master_reach(
    name: str, target: str, port: int, nf: NodeFacts, mp: Mapping[str, Any], master: NodeFacts | None, f: Findings
) -> None:
    """This node reaches the master's port (`target`: ADDR:PORT) where the master's probe listened."""
    if master is None or not master.ok:
        f.add("skip", f"master {name} was not probed; {target} not tested")
        return
    if not mp.get("bound"):
        f.add("skip", f"the master port is not free on the master, so reaching {target} was not tested")
        return
    if nf.reach_error:
        f.add("fail", f"reachability test failed: {nf.reach_error}")
        return
    for r in nf.reach:
        if r.get("kind") == "master":
            if r.get("ok"):
                f.add("ok", f"reaches the master at {target} in {r.get('ms', 0):.1f} ms (the probe listened there)")
            else:
                f.add(
                    "fail",
                    f"cannot connect to the master at {target}: {r.get('error')}",
                    f"open TCP {port} on the master's firewall (ufw allow {port}/tcp) and check the route to its addr",
                )
