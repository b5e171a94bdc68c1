"""`ssh`: every node answered the probe, how fast, and with an answer of the probe's shape."""

from __future__ import annotations

from ...config.inventory import Inventory
from ...transport import transport_of
from ..results import CheckResult, Facts


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
        target = transport_of(inv).target(node)
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
