"""`timezone`: the zone a job sees on each node, against checks.timezone or the majority."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, majority, probed
from ..shapes import Opt

FACTS = {
    "tz": {
        "TZ": Opt(str),
        "localtime": Opt(str),
        "etc_timezone": Opt(str),
        "abbr": Opt(str),
        "utcoffset": Opt(str),
    },
}
"""The probe's facts this check reads: TZ, /etc/localtime, /etc/timezone and what the zone says."""

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
