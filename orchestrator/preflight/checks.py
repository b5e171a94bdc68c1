"""Checks: pure functions of (inventory, facts of every node) → one result per (check, node).

Every pitfall of the field guides becomes a finding with the measured value and a hint that
fixes it. A node that could not be probed fails `ssh` and is `skip` everywhere else, with the
reason. Checks that compare nodes (versions, env, file contents) report on each node that differs
from the majority and name the majority value. What a check returns and the helpers it judges
with are `results.py`; the fabric check's verdict is `fabric/judge.py`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..config.container import Container
from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.nodeset import fold
from ..config.plan import world_size
from ..config.trainer import batch_choices, batch_problem, is_builtin_model
from ..contract import CHECK_NAMES
from . import cudacompat, jobcheck
from .fabric.judge import check_fabric
from .facts import HeldImage, NodeFacts, held_image
from .jobargs import device_ids, is_output_key, job_files, path_args, raw_setting
from .parsers import Gpu, GpuFacts, IbDevice
from .results import CheckResult, Facts, Findings, majority, odd_one_out, probed

__all__ = ["CHECKS", "CheckResult", "Findings", "majority", "odd_one_out", "probed", "run_checks"]

UTC_ALIASES = {
    "UTC",
    "UCT",
    "UNIVERSAL",
    "ZULU",
    "GMT",
    "GMT0",
    "GREENWICH",
    "ETC/UTC",
    "ETC/UCT",
    "ETC/UNIVERSAL",
    "ETC/ZULU",
    "ETC/GMT",
    "ETC/GMT0",
    "ETC/GREENWICH",
    "ETC/GMT+0",
    "ETC/GMT-0",
}
NCCL_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")
BUSY_MIB = 1024


def _show(v: Any) -> str:
    return "unset" if v is None else str(v)


# ----------------------------------------------------------------------------- ssh


def check_ssh(inv: Inventory, facts: Facts) -> list[CheckResult]:
    out = []
    for node in inv.nodes:
        nf = facts[node.name]
        if not nf.ok:
            detail = (nf.error or "").removeprefix(f"{node.name}: ")
            kind = f"{nf.error_kind}: " if nf.error_kind and nf.error_kind != "error" else ""
            out.append(CheckResult("ssh", node.name, "fail", "", kind + detail, nf.hint or _ssh_hint(nf.error_kind)))
            continue
        total = (nf.connect_ms or 0) + (nf.rtt_ms or 0)
        target = (
            "local process (transport: local)"
            if inv.transport == "local"
            else f"{node.ssh.user + '@' if node.ssh.user else ''}{node.host}:{node.ssh.port}"
        )
        detail = f"{target}: connect {nf.connect_ms or 0:.0f} ms + round trip {nf.rtt_ms or 0:.0f} ms on the session"
        if nf.malformed:
            shown = "; ".join(nf.malformed[:3]) + (
                f" (and {len(nf.malformed) - 3} more)" if len(nf.malformed) > 3 else ""
            )
            out.append(
                CheckResult(
                    "ssh",
                    node.name,
                    "fail",
                    f"{total:.0f} ms",
                    f"{detail}; the probe's answer is not what orch's probe writes: {shown}",
                    "the checks that rest on those facts cannot be trusted: is something on the node "
                    "(a login script, a wrapper around python) changing the probe's output?",
                )
            )
        elif total > inv.checks.ssh_warn_ms:
            out.append(
                CheckResult(
                    "ssh",
                    node.name,
                    "warn",
                    f"{total:.0f} ms",
                    f"{detail} (slower than {inv.checks.ssh_warn_ms:.0f} ms)",
                    "a slow control link delays launch and teardown: check latency/DNS (UseDNS no in sshd_config)",
                )
            )
        else:
            out.append(CheckResult("ssh", node.name, "ok", f"{total:.0f} ms", detail))
    return out


def _ssh_hint(kind: str | None) -> str:
    return {
        "probe": "the probe needs Python >= 3.8 on the node (job.python or python3)",
        "timeout": "the node answered too slowly; check its load and network",
    }.get(kind or "", "")


# ----------------------------------------------------------------------------- clock


def clock_offsets(inv: Inventory, facts: Facts) -> tuple[dict[str, float], dict[str, float], str]:
    """(offset ms per node, uncertainty ms per node, reference) — node clock minus reference.

    With `checks.clock.ntp_server` the reference is that server, measured from the node (SNTP).
    Without, each node's clock (the probe answering a ping on its SSH channel) is compared with
    the controller's at the midpoint of that round trip, ± rtt/2: one fixed reference, so the
    node that is off is the one blamed (against the nodes' median, two nodes would share it)."""
    server = inv.checks.clock.ntp_server
    offsets: dict[str, float] = {}
    unc: dict[str, float] = {}
    if server:
        for node, nf in probed(inv, facts):
            ntp = nf.raw.get("ntp") or {}
            if ntp.get("offset_ms") is not None:
                offsets[node.name] = float(ntp["offset_ms"])
                unc[node.name] = float(ntp.get("delay_ms") or 0) / 2
        return offsets, unc, f"NTP server {server}"
    for node, nf in probed(inv, facts):
        if nf.ssh_offset_ms is not None:
            offsets[node.name] = nf.ssh_offset_ms
            unc[node.name] = (nf.rtt_ms or 0) / 2
    return offsets, unc, CONTROLLER_REFERENCE


CONTROLLER_REFERENCE = "the controller (SSH round-trip estimate)"


def check_clock(inv: Inventory, facts: Facts) -> list[CheckResult]:
    limit = inv.checks.clock.max_offset_ms
    offsets, unc, ref = clock_offsets(inv, facts)
    server = inv.checks.clock.ntp_server
    out = []
    for node, nf in probed(inv, facts):
        f = Findings("clock", node.name)
        if node.name not in offsets and not server:
            f.add(
                "warn",
                "not measured: the probe did not answer the clock ping on its SSH channel",
                "set checks.clock.ntp_server so every node measures itself against one server",
            )
            out.append(f.result())
            continue
        if node.name not in offsets:
            ntp = nf.raw.get("ntp") or {}
            errs = "; ".join(ntp.get("errors") or []) or "no answer"
            f.add(
                "fail",
                f"cannot query NTP server {server} from this node: {errs}",
                f"is an NTP server (chronyd/ntpd) serving on {server}, and UDP reachable from the node?",
            )
            out.append(f.result())
            continue
        off = offsets[node.name]
        f.value = f"{round(off) or 0:+d} ms"  # never "-0 ms"
        what = f"offset to {ref} is {off:+.1f} ms (±{unc[node.name]:.1f})"
        hint = (
            f"sync the clock: chronyc makestep, or fix its NTP source (server {server.split(':')[0]} iburst "
            "in chrony.conf)"
            if server
            else "sync the clock: chronyc makestep, or point every node's chrony at one NTP server "
            "(and set checks.clock.ntp_server to measure against it)"
        )
        # the measurement's own uncertainty must not turn a good clock into a failure
        excess = abs(off) - unc[node.name]
        if excess > limit:
            f.add("fail", f"{what} (limit {limit:g} ms)", hint)
        elif excess > limit / 2:
            f.add("warn", f"{what} (over half the {limit:g} ms limit)", hint)
        else:
            f.add("ok", f"{what} (limit {limit:g} ms)")
        _judge_chrony(nf, limit, f)
        _judge_controller(inv, node, nf, limit, f)
        out.append(f.result())
    return out


def _judge_controller(inv: Inventory, node: Node, nf: NodeFacts, limit: float, f: Findings) -> None:
    """The reference itself: with an NTP server, how far the controller's own clock is off it (on
    every row: each offset above is against the server, not the controller); without one, that
    every offset is relative to the controller's clock, said once, on the master's row."""
    server = inv.checks.clock.ntp_server
    cc = nf.controller_clock
    if not server:
        if node.name == inv.master.name:
            f.add(
                "ok",
                "every offset here is relative to the controller's own clock, which nothing measures "
                "(set checks.clock.ntp_server to measure every clock, the controller's too, against one server)",
            )
        return
    if cc is None:
        return
    if cc.offset_ms is None:
        if node.name == inv.master.name:
            f.add(
                "warn",
                f"the controller could not ask {server} for the time ({cc.error}): its own clock is not measured",
                f"open UDP 123 from this machine to {server}, or run orch where it can reach it",
            )
        return
    text = f"the controller is {cc.offset_ms:+.1f} ms off {server}"
    if abs(cc.offset_ms) - (cc.delay_ms or 0) / 2 > limit and node.name == inv.master.name:
        f.add(
            "warn",
            f"{text}: orch logs --since and orch status' log ages are off by as much (nodes are measured "
            "against the server, so the merged log's order is not)",
            f"sync this machine's clock to {server.split(':')[0]} (chronyc makestep; server ... iburst in chrony.conf)",
        )
    else:
        f.add("ok", text)


def _judge_chrony(nf: NodeFacts, limit: float, f: Findings) -> None:
    """What the node's own chrony says (when chronyc answers): unsynchronised is a warning."""
    ch = nf.chrony
    if ch is None:
        return
    hint = "check chrony's sources: chronyc sources -v; then chronyc makestep"
    if ch.local_reference:
        # normal on the node that serves the cluster's time (`local stratum N`); anywhere else the
        # offset measured above is what matters today, and this note explains tomorrow's drift
        f.add("ok", f"chrony here follows its own local clock (Reference ID {ch.reference}), not a server")
    elif ch.leap_status and ch.leap_status.lower() != "normal":
        f.add("warn", f"chrony here is not synchronised (Leap status: {ch.leap_status})", hint)
    elif ch.system_offset_ms is not None and abs(ch.system_offset_ms) > limit:
        f.add(
            "warn",
            f"chrony says this clock is {ch.system_offset_ms:+.0f} ms off its source "
            f"({ch.reference}) and still converging",
            hint,
        )
    else:
        f.add("ok", f"chrony: synchronised to {ch.reference}, stratum {ch.stratum}")


# ----------------------------------------------------------------------------- timezone


def zone_of(tz: Mapping[str, Any]) -> tuple[str, str]:
    """(zone name as a job sees it, display) from the probe's TZ / /etc/timezone / /etc/localtime."""
    name = None
    if tz.get("TZ"):
        name = str(tz["TZ"]).lstrip(":")
        if "zoneinfo/" in name:
            name = name.split("zoneinfo/", 1)[1]
    elif tz.get("etc_timezone"):
        name = str(tz["etc_timezone"]).strip()
    elif tz.get("localtime") and "zoneinfo/" in str(tz["localtime"]):
        name = str(tz["localtime"]).split("zoneinfo/", 1)[1]
    elif tz.get("localtime") is None and not tz.get("etc_timezone"):
        name = "UTC"  # glibc's default when neither TZ nor /etc/localtime exists
    name = name or f"{tz.get('abbr')}{tz.get('utcoffset')}"
    return name, f"{name} ({tz.get('abbr')} {tz.get('utcoffset')})"


def same_zone(a: str, b: str) -> bool:
    return a == b or (a.upper() in UTC_ALIASES and b.upper() in UTC_ALIASES)


def check_timezone(inv: Inventory, facts: Facts) -> list[CheckResult]:
    zones = {n.name: zone_of(nf.raw.get("tz") or {}) for n, nf in probed(inv, facts)}
    if not zones:
        return []
    expected = inv.checks.timezone
    want, count, _ = (expected, 0, True) if expected else majority({k: v[0] for k, v in zones.items()})
    out = []
    for node, nf in probed(inv, facts):
        name, shown = zones[node.name]
        f = Findings("timezone", node.name)
        f.value = shown
        tz_env = (nf.raw.get("tz") or {}).get("TZ")
        src = (
            ("TZ in the inventory env" if "TZ" in node.env else "TZ in the login environment")
            if tz_env
            else "/etc/localtime"
        )
        if same_zone(name, str(want)):
            f.add("ok", f"{name} from {src}")
        else:
            wanted = f"checks.timezone is {want}" if expected else f"the majority ({count} nodes) is in {want}"
            hint = f"sudo timedatectl set-timezone {want}"
            if tz_env:
                hint += f"; and fix TZ={tz_env} ({src})"
            f.add(
                "fail",
                f"a job here sees {name} (from {src}); {wanted}: timestamps in logs and TensorBoard would disagree",
                hint,
            )
        out.append(f.result())
    return out


# ----------------------------------------------------------------------------- nccl_env


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
                    f"{var}={_show(env.get(var))} here, but {count} of {len(others)} nodes have {var}={_show(common)}",
                    f"set {var} in the inventory `env` so every node gets the same value",
                )
        out.append(f.result(f"{len(env)} NCCL/Gloo variables, none needs attention"))
    return out


# ----------------------------------------------------------------------------- rdma


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
        _ring_reach(nf, f, verbs=True)
        out.append(f.result())
    return out


def _ring_reach(nf: NodeFacts, f: Findings, verbs: bool = False) -> None:
    """This node → its ring successor: over verbs (ibv_rc_pingpong) when `verbs` and the tool ran,
    else over TCP to a port the successor's probe opened."""
    if nf.reach_error:
        f.add("fail", f"reachability test failed: {nf.reach_error}")
        return
    ring = [r for r in nf.reach if r.get("kind") == "verbs"] if verbs else []
    method = "verbs (ibv_rc_pingpong)" if ring else "TCP to a port the peer's probe opened"
    if verbs and not ring:
        tools = (nf.raw.get("ib") or {}).get("tools") or {}
        method += (
            " (ibv_rc_pingpong is installed here, but the peer ran no verbs server)"
            if tools.get("ibv_rc_pingpong")
            else " (ibv_rc_pingpong not installed, so no verbs test)"
        )
    for r in ring or [r for r in nf.reach if r.get("kind") == "ring"]:
        if r.get("ok"):
            extra = f": {r['result']}" if r.get("result") else ""
            f.add("ok", f"reaches {r['node']} ({r['addr']}) in {r.get('ms', 0):.1f} ms over {method}{extra}")
        else:
            f.add(
                "fail",
                f"cannot reach {r['node']} at {r['addr']}:{r['port']} over {method}: {r.get('error')}",
                "check routing and firewalls between the nodes' data-plane addresses (addr:)"
                if not ring
                else f"ibv_rc_pingpong -d {r.get('device')} {r['addr']} by hand; check the HCA port, the subnet "
                "manager and (RoCE) the GID index",
            )


# ----------------------------------------------------------------------------- gpus


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


# ----------------------------------------------------------------------------- software


SOFTWARE_KEYS = ("python", "torch", "cuda", "nccl", "ultralytics")


def check_software(inv: Inventory, facts: Facts) -> list[CheckResult]:
    nodes = probed(inv, facts)
    sw = {n.name: dict(nf.raw.get("software") or {}) for n, nf in nodes}
    out = []
    for node, nf in nodes:
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
                    f"{key} {_show(s.get(key))} differs from the majority ({count} nodes: {_show(common)})",
                    "install identical versions everywhere (mismatched torch/CUDA/NCCL hang or fail silently)",
                )
        out.append(f.result("versions agree with every other node"))
    return out


# ----------------------------------------------------------------------------- job


def cluster_job_findings(inv: Inventory, said: str = "") -> list[tuple[str, str, str]]:
    """Problems of the job itself (not of a node), reported once, on the master's row; one the
    job's own check already `said` (the trainer's refusal, made with the same rule) is not
    repeated."""
    out = []
    ws = world_size(inv.nodes)
    raw = raw_setting(inv, "batch")
    batch = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    problem = batch_problem(batch, ws) if batch is not None else None
    if batch is not None and problem and problem not in said:
        out.append(
            (
                "fail",
                f"cluster-wide: {problem} ({len(inv.nodes)} nodes × {inv.nodes[0].nproc_per_node})",
                f"use a multiple of {ws}: {' or '.join(map(str, batch_choices(batch, ws)))}",
            )
        )
    elif batch is not None and batch < 0 and "batch" not in said:
        out.append(
            (
                "fail",
                f"cluster-wide: batch {batch} (auto-batch) does not work with DDP",
                f"give a global batch that divides by {ws}",
            )
        )
    base = inv.job.workdir or "<workdir>"
    for key, value in relative_args(inv).items():
        out.append(
            (
                "fail",
                f"cluster-wide: {key}: {value!r} is a relative path; torchrun workers resolve it "
                "against their own working directory, which differs per node",
                f"use an absolute path, e.g. {key}: {os.path.normpath(os.path.join(base, value))}",
            )
        )
    return out


def relative_args(inv: Inventory) -> dict[str, str]:
    """The path-like job arguments that are relative (so no node's copy is checked)."""
    return {
        key: value for key, value in path_args(inv).items() if not (_is_absolute(value) or _builtin_model(key, value))
    }


def _is_absolute(path: str) -> bool:
    return path.startswith(("/", "~/"))


def _builtin_model(key: str, value: str) -> bool:
    """`model: yolo12m.yaml`, `cfg: yoloe-v8l-seg.yaml` name a model config shipped with ultralytics,
    not a file (the trainer's rule, `config/trainer.is_builtin_model`)."""
    return is_builtin_model(key.replace("-", "_"), value)


def check_job(inv: Inventory, facts: Facts) -> list[CheckResult]:
    """Workdir and the job's files on every node; the job's own verdict on its arguments
    (`jobcheck`: the trainer's `--check` on the master, or whether `job.module` imports); what is
    wrong with the job as a whole once, on the master's row, and every other row says what it
    checked, never more."""
    nodes = probed(inv, facts)
    paths = {k: v for k, v in job_files(inv).items() if _is_absolute(v)}
    digests = {key: {n.name: _digest((nf.raw.get("paths") or {}).get(key) or {}) for n, nf in nodes} for key in paths}
    answers = {n.name: jobcheck.read(inv, n, nf.raw.get("job_check")) for n, nf in nodes}
    master_answer = answers.get(inv.master.name)
    said = master_answer.detail if master_answer is not None and master_answer.status == "fail" else ""
    relative = relative_args(inv)
    out = []
    for node, nf in nodes:
        f = Findings("job", node.name)
        if node.name == inv.master.name:
            for item in cluster_job_findings(inv, said):
                f.add(*item)
        wd = nf.raw.get("workdir")
        if inv.job.workdir and wd is not None and not wd.get("is_dir"):
            f.add(
                "fail",
                f"workdir {inv.job.workdir} does not exist"
                if not wd.get("exists")
                else f"workdir {inv.job.workdir} is not a directory",
                _SYNC_HINT if synced(inv, inv.job.workdir) else "create it or mount the shared filesystem on this node",
            )
        root = nf.raw.get("run_root") or {}
        if root.get("problem"):
            f.add(
                "fail",
                f"job.run_root {inv.job.run_root}: the node agent would refuse its run directory: {root['problem']}",
                "a run directory, and every directory above it, must be writable by its owner only",
            )
        for key, path in paths.items():
            _judge_path(key, path, (nf.raw.get("paths") or {}).get(key) or {}, digests[key], node, f, synced(inv, path))
            if key.replace("-", "_") == "data":
                _judge_dataset(path, node.name, datasets(nodes, key), f, synced(inv, path))
        answer = answers.get(node.name)
        if answer is not None and nf.python_fallback:  # the software row says why; once is enough
            f.add(
                "warn",
                f"the job's own check could not run: job.python {node.python} does not work here (see the "
                "software check)",
            )
        elif answer is not None:
            f.add(answer.status, answer.detail, answer.hint)
        elif jobcheck.checks_on(inv, node) and "job_check" not in nf.raw:
            f.add(
                "warn",
                "the probe brought back no answer from the job's own check: the job's arguments are not verified",
                "run orch check -v to see the probe's command",
            )
        f.value = f"world size {world_size(inv.nodes)}, {len(paths)} file(s)"
        out.append(f.result(_job_checked(inv, node, paths, relative, answer) + _datasets_checked(nodes, node, paths)))
    return out


def _datasets_checked(nodes: list[tuple[Node, NodeFacts]], node: Node, paths: Mapping[str, str]) -> str:
    """What an `ok` job row says of the dataset comparison."""
    for key in (k for k in paths if k.replace("-", "_") == "data"):
        listed = datasets(nodes, key)
        mine = listed.get(node.name)
        if mine and len(listed) > 1:
            splits = ", ".join(f"{s} {_split_text(d)}" for s, d in mine.items() if " " not in s)
            return f"; what {paths[key]} lists ({splits}) the same on every node"
    return ""


def _job_checked(
    inv: Inventory, node: Node, paths: Mapping[str, str], relative: Mapping[str, str], answer: jobcheck.JobAnswer | None
) -> str:
    """What an `ok` job row verified on this node, and what it did not."""
    what = ([f"workdir {inv.job.workdir}"] if inv.job.workdir else []) + (
        [f"{len(paths)} file(s) ({', '.join(paths)})"] if paths else []
    )
    text = (" and ".join(what) + " in place and identical on every node") if what else "no file arguments to check"
    if relative and node.name != inv.master.name:
        text += (
            f"; not checked on any node: {', '.join(relative)} (relative path: cluster-wide, on "
            f"{inv.master.name}'s row)"
        )
    if answer is None and jobcheck.kind(inv) is not None and node.name != inv.master.name:
        text += f"; the job's own check runs on {inv.master.name}"
    return text


def _digest(p: Mapping[str, Any]) -> tuple[Any, ...]:
    return (p.get("exists"), p.get("size"), p.get("sha256"))


_SYNC_HINT = "it is under job.sync: orch sync copies it to every node (orch up does before its preflight)"


def synced(inv: Inventory, path: str) -> bool:
    """`path` is one of `job.sync` or inside one of its directories."""
    return any(path == s or path.startswith(s + "/") for s in inv.job.sync)


def _judge_path(
    key: str,
    path: str,
    p: Mapping[str, Any],
    digests: Mapping[str, tuple[Any, ...]],
    node: Node,
    f: Findings,
    in_sync: bool = False,
) -> None:
    if is_output_key(key):
        _judge_output(key, path, p, node, f)
        return
    if not p.get("exists"):
        f.add(
            "fail",
            f"{key}: {path} does not exist on this node",
            _SYNC_HINT if in_sync else "copy it there (scp/rsync) or put it on a filesystem every node mounts",
        )
        return
    if not p.get("is_file"):
        if key.replace("-", "_") in ("weights", "data", "script"):
            f.add("fail", f"{key}: {path} is not a file")
        return
    common_any, count, unique = majority(digests)
    common: tuple[Any, ...] = tuple(common_any)  # type: ignore[arg-type]
    mine = _digest(p)
    if len(digests) > 1 and mine != common and unique:
        f.add(
            "fail",
            f"{key}: {path} differs from the majority ({count} nodes): size {p.get('size')} vs "
            f"{common[1]}, sha256 {str(p.get('sha256'))[:12]} vs {str(common[2])[:12]}",
            _SYNC_HINT if in_sync else "sync the file so every node reads the same bytes (rsync -c)",
        )
    if key.replace("-", "_") == "data":
        _judge_data_yaml(path, p, f)


def datasets(nodes: list[tuple[Node, NodeFacts]], key: str) -> dict[str, Mapping[str, Any]]:
    """What the data YAML `key` lists on each node that listed it (the probe's `dataset`)."""
    out = {}
    for n, nf in nodes:
        p = (nf.raw.get("paths") or {}).get(key) or {}
        if isinstance(p.get("dataset"), Mapping):
            out[n.name] = p["dataset"]
    return out


def _split_key(split: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What two nodes must agree on for one split: count, bytes, names and sizes, sampled bytes."""
    if split is None:
        return ("absent",)
    if split.get("error"):
        return None
    return (split.get("files"), split.get("bytes"), split.get("listing"), split.get("sample"))


def _split_text(split: Mapping[str, Any] | None) -> str:
    if split is None:
        return "not listed"
    more = "+" if split.get("capped") else ""
    return f"{split.get('files')}{more} files, {_size(split.get('bytes'))}"


def _size(n: Any) -> str:
    if not isinstance(n, int):
        return "? bytes"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _judge_dataset(
    path: str, me: str, listed: Mapping[str, Mapping[str, Any]], f: Findings, in_sync: bool = False
) -> None:
    """The data YAML's splits on this node against every other node's: the same number of files,
    bytes, names and sizes, and sampled bytes (`node/probe.dataset_facts`). A node that differs
    from a unique majority fails, naming the split; with no majority every node that differs fails."""
    mine = listed.get(me)
    if mine is None or len(listed) < 2:
        return
    hint = (
        _SYNC_HINT
        if in_sync
        else "copy the dataset again so every node holds the same files (rsync -a --delete from the good copy), "
        "or put it on storage every node mounts"
    )
    for split in sorted({s for d in listed.values() for s in d}, key=lambda s: (s.split()[0] != "train", s)):
        here = mine.get(split)
        if here is not None and here.get("error"):
            f.add("warn", f"data: {split} ({here.get('path')}) not compared with the other nodes: {here['error']}")
            continue
        keys = {n: _split_key(d.get(split)) for n, d in listed.items()}
        keys = {n: k for n, k in keys.items() if k is not None}
        if len(set(keys.values())) < 2 or me not in keys:
            continue
        common, count, unique = majority(keys)
        if keys[me] == common and unique:
            continue
        at = f" ({here.get('path')})" if here is not None else ""
        if unique:
            other = next(d.get(split) for n, d in listed.items() if keys.get(n) == common)
            same = (
                "; the same count and size, but other names or contents"
                if here is not None
                and other is not None
                and (here.get("files"), here.get("bytes")) == (other.get("files"), other.get("bytes"))
                else ""
            )
            f.add(
                "fail",
                f"data: the {split} split of {path}{at} differs here from the other nodes: {_split_text(here)} "
                f"here, {_split_text(other)} on {count} node(s){same}",
                hint,
            )
        else:
            others = ", ".join(f"{n}: {_split_text(d.get(split))}" for n, d in listed.items() if n != me)
            f.add(
                "fail",
                f"data: the {split} split of {path}{at} differs between the nodes (no majority): "
                f"{_split_text(here)} here; {others}",
                hint,
            )


def _judge_output(key: str, path: str, p: Mapping[str, Any], node: Node, f: Findings) -> None:
    """An output directory is fine when it is a writable directory or can be created."""
    who = node.ssh.user or "the ssh user"
    if p.get("exists") and not p.get("is_dir"):
        f.add("fail", f"{key}: {path} exists and is not a directory", "point it at a directory, or remove the file")
    elif p.get("is_dir") and p.get("writable") is False:
        f.add("fail", f"{key}: {path} is not writable by {who}", f"chown/chmod it, or pick a directory {who} owns")
    elif not p.get("exists") and p.get("ancestor_writable") is False:
        anc = p.get("ancestor") or "/"
        why = f"{anc} is not writable by {who}" if p.get("ancestor_is_dir", True) else f"{anc} is a file"
        f.add(
            "fail",
            f"{key}: {path} cannot be created: {why}",
            f"create {path} on this node with the right owner, or write under a directory {who} owns",
        )


def _judge_data_yaml(path: str, p: Mapping[str, Any], f: Findings) -> None:
    text = p.get("text")
    if text is None:
        return
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        f.add("fail", f"data: {path} is not valid YAML: {str(exc).splitlines()[0]}")
        return
    names = doc.get("names") if isinstance(doc, dict) else None
    if not names:
        f.add(
            "fail",
            f"data: {path} has no `names` (class names)",
            "add names: {0: person, 1: car, ...} (ultralytics refuses a dataset without them)",
        )
        return
    nc = doc.get("nc")
    if isinstance(nc, int) and nc != len(names):
        f.add("fail", f"data: {path} says nc: {nc} but lists {len(names)} names")


# ----------------------------------------------------------------------------- ports


def check_ports(inv: Inventory, facts: Facts) -> list[CheckResult]:
    master = facts.get(inv.master.name)
    mp = (master.listen.get("master_port") if master and master.ok else None) or {}
    out = []
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
            _master_reach(inv, nf, mp, master, f)
        _ring_reach(nf, f)
        out.append(f.result())
    return out


def _master_reach(inv: Inventory, nf: NodeFacts, mp: Mapping[str, Any], master: NodeFacts | None, f: Findings) -> None:
    target = f"{inv.master.addr}:{inv.master_port}"
    if master is None or not master.ok:
        f.add("skip", f"master {inv.master.name} was not probed; {target} not tested")
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
                    f"open TCP {inv.master_port} on the master's firewall (ufw allow {inv.master_port}/tcp) "
                    "and check the route to its addr",
                )


# ----------------------------------------------------------------------------- container


def check_container(inv: Inventory, facts: Facts) -> list[CheckResult]:
    """`job.container`: no container of this cluster's orch runs is left on a node (it would hold
    the GPUs and the master port, and a launch of its run would collide with its name)."""
    c = inv.job.container
    out = []
    held = {node.name: h for node, nf in probed(inv, facts) if (h := held_image(nf)) is not None}
    for node, nf in probed(inv, facts):
        f = Findings("container", node.name)
        if c is None:
            out.append(CheckResult("container", node.name, "skip", "", "the job runs on the host (no job.container)"))
            continue
        f.value = c.runtime
        listing = nf.raw.get("containers")
        if c.runtime == "apptainer":
            f.add("ok", "apptainer: no daemon keeps a container; nothing outlives the job's processes")
        elif not listing:
            f.add("skip", "the leftover containers were not listed (a probe without that fact)")
        elif listing.get("rc") != 0:
            said = (listing.get("err") or "").strip().splitlines()
            f.add(
                "fail",
                f"`{c.runtime} ps` does not answer: {said[-1] if said else 'exit ' + str(listing.get('rc'))}",
                f"install {c.runtime} on this node and let the SSH user run it ({c.runtime} info), or fix "
                "job.container.runtime",
            )
        else:
            left = [line.split("\t") for line in (listing.get("out") or "").splitlines() if line.strip()]
            for row in left:
                name = row[1] if len(row) > 1 else row[0]
                run = row[2] if len(row) > 2 and row[2] else "?"
                state = row[3] if len(row) > 3 else "?"
                f.add(
                    "fail",
                    f"container {name} of run {run} is still here ({state}): it holds its GPUs and ports",
                    (f"orch down {run} (or {c.runtime} rm -f {name})" if run != "?" else f"{c.runtime} rm -f {name}"),
                )
            if not left:
                f.add("ok", f"no container of {inv.name}'s runs left on this node")
        image_findings(inv, node, nf, held, f)
        shm_finding(inv, nf, f)
        gpu_finding(inv, node, nf, f)
        if not python_finding(inv, nf, f):
            outputs_finding(inv, nf, f)
        rdma_finding(inv, nf, f)
        out.append(f.result())
    return out


def image_cuda(env: Mapping[str, str]) -> str | None:
    """The CUDA version an image is built for: `NVIDIA_REQUIRE_CUDA` (`cuda>=12.1 brand=...`), else
    `CUDA_VERSION` (12.1.0), as NVIDIA's container toolkit reads them; None when it says neither."""
    require = env.get("NVIDIA_REQUIRE_CUDA", "")
    for word in require.split():
        if word.startswith("cuda>="):
            return word.removeprefix("cuda>=")
    return env.get("CUDA_VERSION") or None


def image_findings(inv: Inventory, node: Node, nf: NodeFacts, held: Mapping[str, HeldImage], f: Findings) -> None:
    """The image rows of the container check on one node: the image is here (or `pull: missing`
    lets the launch pull it), it is the image ID the other nodes hold (a tag that moved on one node
    runs another image there: another NCCL, a hang), and the node's driver runs the image's CUDA."""
    c = inv.job.container
    mine = held.get(node.name)
    if c is None or mine is None:
        return
    key = "job.container.image"
    if mine.error is not None:
        f.add(
            "fail",
            f"could not ask {c.runtime} for {c.image}: {mine.error}",
            f"install {c.runtime} on this node and let the SSH user run it ({c.runtime} info)",
        )
        return
    if mine.image_id is None:
        if c.pull == "missing" and c.runtime != "apptainer":
            f.add(
                "warn",
                f"{c.image} is not on this node: the launch pulls it (job.container.pull: missing)",
                f"or put it there first: orch image push {c.image} {inv.path}",
            )
        else:
            f.add(
                "fail",
                f"{c.image} is not on this node ({key})",
                f"orch image push {c.image} {inv.path} (no registry needed)"
                + ("" if c.runtime == "apptainer" else ", or set job.container.pull: missing"),
            )
        return
    ids = {name: h.image_id for name, h in held.items() if h.image_id is not None}
    common, count, unique = majority(ids)
    short = mine.image_id[:12]
    if mine.image_id != common or not unique:
        others = sorted({i for i in ids.values() if i != mine.image_id})
        where = ", ".join(f"{i[:12]} on {fold_names(n for n, x in ids.items() if x == i)}" for i in others)
        f.add(
            "fail",
            f"{c.image} is {short} here but {where}: the name resolves to another image on some nodes "
            "(a tag that moved), and they would run different software",
            f"put one image on every node: orch image push {c.image} {inv.path} from a machine that holds "
            f"the right one, or name it by ID in {key}",
        )
        return
    what = "sha256" if c.runtime == "apptainer" else "image"
    f.add("ok", f"{c.image} is {what} {short} on every node that has it ({count})")
    if not node.gpus:
        return
    gpus = nf.gpus
    require = next(
        (w.removeprefix("cuda>=") for w in mine.env.get("NVIDIA_REQUIRE_CUDA", "").split() if w.startswith("cuda>=")),
        None,
    )
    if require and gpus.cuda and cudacompat.version(gpus.cuda) < cudacompat.version(require):
        # NVIDIA's container toolkit refuses the start ("unsatisfied condition: cuda>=12.8")
        f.add(
            "fail",
            f"the image requires CUDA {require} or newer (its NVIDIA_REQUIRE_CUDA); this node's driver "
            f"{gpus.driver or '?'} supports CUDA {gpus.cuda}: the runtime would refuse to start it",
            f"upgrade the driver on this node, or use an image built for CUDA {gpus.cuda} or older",
        )
        return
    cuda = image_cuda(mine.env)
    need = cudacompat.min_driver(cuda) if cuda else None
    if cuda and gpus.driver and need and cudacompat.version(gpus.driver) < need:
        f.add(
            "fail",
            f"the image is built for CUDA {cuda}, which needs NVIDIA driver {cudacompat.dotted(need)} "
            f"or newer; this node's driver is {gpus.driver}",
            "upgrade the driver on this node, or use an image built for an older CUDA",
        )


MIN_SHM = 1 << 30
"""The least /dev/shm a job's container may have: DataLoader workers pass batches through it
("Bus error" below), NCCL its intra-node buffers (`posix_fallocate` failures)."""


def shm_finding(inv: Inventory, nf: NodeFacts, f: Findings) -> None:
    """/dev/shm inside the job's container as the software facts measured it there (the launch's
    own line): at least `MIN_SHM`. orch shares the host's IPC unless job.container.options say
    `--ipc` or `--shm-size`; this row catches the size those give."""
    c = inv.job.container
    size = (nf.raw.get("software") or {}).get("shm_bytes")
    if c is None or c.runtime == "apptainer" or not isinstance(size, int) or size >= MIN_SHM:
        return
    f.add(
        "fail",
        f"/dev/shm in the container is {size / (1 << 20):.0f} MiB: DataLoader workers die with "
        '"Bus error" and NCCL cannot allocate its shared memory below 1 GiB',
        "leave --ipc and --shm-size out of job.container.options (orch then shares the host's IPC), "
        "or give --shm-size=16g",
    )


_NO_GPU_RUNTIME = ("unresolvable CDI devices", "could not select device driver", "nvidia-container-cli")


def gpu_finding(inv: Inventory, node: Node, nf: NodeFacts, f: Findings) -> None:
    """On a GPU node: torch inside the job's container (the `gpus` check's torch facts, gathered in
    a container started as the launch's, with the node's GPUs) sees `nproc_per_node` GPUs; a
    runtime that cannot pass them (no NVIDIA runtime for docker, no CDI spec for podman) is named."""
    c = inv.job.container
    tc = nf.raw.get("torch_cuda")
    if c is None or c.runtime == "apptainer" or not node.gpus or not isinstance(tc, dict):
        return
    error = str(tc.get("error") or "")
    if any(k in error for k in _NO_GPU_RUNTIME):
        said = next((ln.strip() for ln in error.splitlines() if any(k in ln for k in _NO_GPU_RUNTIME)), error)
        fix = (
            "generate the CDI spec podman reads: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"
            if c.runtime == "podman"
            else "install nvidia-container-toolkit, then nvidia-ctk runtime configure --runtime=docker"
            " and restart docker"
        )
        f.add("fail", f"{c.runtime} cannot give the container this node's GPUs: {said}", fix)
        return
    count = tc.get("device_count")
    if isinstance(count, int) and count != node.nproc_per_node:
        f.add(
            "fail",
            f"torch in the container sees {count} GPU(s), but nproc_per_node is {node.nproc_per_node}: "
            "ranks without a GPU of their own",
            "check the GPUs the container gets (orch up --dry-run shows --gpus/--device), and the NVIDIA "
            f"runtime ({c.runtime} info), or set nproc_per_node to {count}"
            if count
            else f"the container got no GPU: check the NVIDIA runtime ({c.runtime} info: nvidia) or CDI spec",
        )


_NO_EXEC = re.compile(
    r"permission denied|no such file or directory|not found|exec format error|"
    r"Fatal Python error",
    re.I,
)


def container_user(c: Container) -> str:
    """Who the job runs as inside its container, in a row's words."""
    return {"host": "the SSH user", "root": "root"}.get(c.user, f"uid:gid {c.user}")


def python_finding(inv: Inventory, nf: NodeFacts, f: Findings) -> bool:
    """The job's interpreter could not be run inside the container as its user (the software facts'
    or the output folders' container said so: the exec refused, or the interpreter died before
    its first line): one row naming job.container.python and job.container.user. True when added."""
    c = inv.job.container
    if c is None or c.runtime == "apptainer":
        return False
    said = [
        str(e)
        for e in ((nf.raw.get("software") or {}).get("error"), (nf.raw.get("outputs_inside") or {}).get("error"))
        if e
    ]
    why = next(
        (
            ln.strip()
            for text in said
            for ln in text.splitlines()
            if _NO_EXEC.search(ln) and (c.python in ln or "Fatal Python error" in ln)
        ),
        None,
    )
    if why is None:
        return False
    why = why.removeprefix("version probe failed: ").removeprefix("could not look inside the container: ")
    f.add(
        "fail",
        f"job.container.python {c.python} cannot be run inside the container as {container_user(c)} "
        f"(job.container.user): {why}",
        "the interpreter and every folder above it must be readable by that user inside the image (one mounted "
        "under the image's /root, mode 0700, is not: mount it elsewhere), so fix job.container.python or its "
        "mount, or set job.container.user (host, root, UID:GID) to a user that can run it",
    )
    return True


def outputs_finding(inv: Inventory, nf: NodeFacts, f: Findings) -> None:
    """The job's output folders, as its container's user sees them inside the container (the
    probe looked from a container started as the launch's): each must be writable there."""
    c = inv.job.container
    inside = nf.raw.get("outputs_inside")
    if c is None or not isinstance(inside, dict):
        return
    if inside.get("error"):
        f.add(
            "fail",
            f"could not look at the output folders inside the container: {inside['error']}",
            "run the image by hand as orch up --dry-run shows it",
        )
        return
    for key, seen in (inside.get("paths") or {}).items():
        if not seen.get("writable"):
            f.add(
                "fail",
                f"--{key.replace('_', '-')}: {seen.get('checked')} is not writable inside the container "
                f"(as {container_user(c)}): the run could write no checkpoint",
                "mount it writable (no :ro in job.container.mounts), or let job.container.user write it",
            )


def rdma_finding(inv: Inventory, nf: NodeFacts, f: Findings) -> None:
    """With `checks.rdma.devices`: inside the job's container (the software facts' own, started as
    the launch's) memlock is unlimited and the verbs devices are there; otherwise NCCL does not use
    InfiniBand and falls back to sockets without an error."""
    c = inv.job.container
    sw = nf.raw.get("software") or {}
    if c is None or c.runtime == "apptainer" or not inv.checks.rdma_devices or "memlock" not in sw:
        return
    memlock = sw.get("memlock")
    if isinstance(memlock, int) and memlock != -1:
        f.add(
            "fail",
            f"memlock is {memlock >> 10} KiB inside the container, not unlimited: NCCL cannot pin its "
            "RDMA buffers and falls back to sockets without an error",
            "leave --ulimit memlock out of job.container.options (orch sets memlock=-1), and raise the "
            "runtime's own limit (docker: default-ulimits in daemon.json; the node's hard limit)",
        )
    if not sw.get("infiniband"):
        f.add(
            "fail",
            "no /dev/infiniband inside the container although checks.rdma.devices is set: NCCL would use sockets",
            "orch passes --device /dev/infiniband: check that the node has it (ibv_devices)",
        )


def fold_names(names: Iterable[str]) -> str:
    return fold(sorted(names))


# ----------------------------------------------------------------------------- all


CHECKS: dict[str, Callable[[Inventory, Facts], list[CheckResult]]] = {
    "ssh": check_ssh,
    "clock": check_clock,
    "timezone": check_timezone,
    "nccl_env": check_nccl_env,
    "rdma": check_rdma,
    "gpus": check_gpus,
    "software": check_software,
    "job": check_job,
    "ports": check_ports,
    "container": check_container,
    "fabric": check_fabric,
}
assert tuple(CHECKS) == CHECK_NAMES


def run_checks(inv: Inventory, facts: Facts, selected: Iterable[str]) -> list[CheckResult]:
    """Every selected check in contract order; unprobed nodes `skip` (except on `ssh`);
    checks listed in the inventory's checks.skip become `skip` rows."""
    results = []
    for name in [c for c in CHECK_NAMES if c in set(selected)]:
        if name in inv.checks.skip:
            results += [
                CheckResult(name, n.name, "skip", "", "skipped by checks.skip in the inventory") for n in inv.nodes
            ]
            continue
        try:
            got = {r.node: r for r in CHECKS[name](inv, facts)}
        except Exception as exc:  # the last line of defence: a check that cannot judge fails, loudly
            got = {
                n.name: CheckResult(
                    name, n.name, "fail", "", f"could not judge the facts the nodes sent: {type(exc).__name__}: {exc}"
                )
                for n in inv.nodes
                if facts[n.name].ok
            }
        for node in inv.nodes:
            nf = facts[node.name]
            if node.name in got:
                results.append(got[node.name])
            elif not nf.ok:
                reason = (nf.error or "").removeprefix(f"{node.name}: ")
                results.append(CheckResult(name, node.name, "skip", "", f"node not probed: {reason}"))
    return results
