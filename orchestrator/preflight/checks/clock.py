"""`clock`: each node's offset to one reference (an NTP server measured from the node, else the
controller over the SSH channel), what its chrony says, and the controller's own offset."""

from __future__ import annotations

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, NodeFacts, probed
from ..shapes import INT, NUMBER, RUN, ListOf, Opt

FACTS = {
    "ntp": Opt(
        {
            "server": str,
            "method": str,
            "samples": INT,
            "errors": ListOf(str),
            "offset_ms": NUMBER,
            "delay_ms": NUMBER,
            "stratum": INT,
            "error": str,
        }
    ),
    "chrony": Opt(RUN),
}
"""The probe's facts this check reads: SNTP against checks.clock.ntp_server, `chronyc tracking`."""


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
        _judge_controller(server, node.name == inv.master.name, nf, limit, f)
        out.append(f.result())
    return out


def _judge_controller(server: str | None, on_master: bool, nf: NodeFacts, limit: float, f: Findings) -> None:
    """The reference itself: with an NTP server, how far the controller's own clock is off it (on
    every row: each offset above is against the server, not the controller); without one, that
    every offset is relative to the controller's clock, said once, on the master's row."""
    cc = nf.controller_clock
    if not server:
        if on_master:
            f.add(
                "ok",
                "every offset here is relative to the controller's own clock, which nothing measures "
                "(set checks.clock.ntp_server to measure every clock, the controller's too, against one server)",
            )
        return
    if cc is None:
        return
    if cc.offset_ms is None:
        if on_master:
            f.add(
                "warn",
                f"the controller could not ask {server} for the time ({cc.error}): its own clock is not measured",
                f"open UDP 123 from this machine to {server}, or run orch where it can reach it",
            )
        return
    text = f"the controller is {cc.offset_ms:+.1f} ms off {server}"
    if abs(cc.offset_ms) - (cc.delay_ms or 0) / 2 > limit and on_master:
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
