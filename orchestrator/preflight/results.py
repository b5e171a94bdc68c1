"""What a check reads and returns, and the helpers every check judges with: `NodeFacts` (one
node's facts after the probe), one `CheckResult` per (check, node), `Findings` that collect a
node's findings (the worst status wins), the majority rule of checks that compare nodes, and the
nodes that were probed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config.inventory import Inventory
from ..config.nodes import Node
from ..config.runtimes import HeldImage, Runtime, held
from ..contract import CHECK_STATUSES
from .parsers import ChronyTracking, GpuFacts, IbDevice, parse_chrony_tracking, parse_gpus, parse_ib

if TYPE_CHECKING:
    from .controller_clock import ControllerClock
    from .fabric.job import FabricFacts


@dataclass
class NodeFacts:
    """Everything known about one node after the probe (or why nothing is)."""

    node: Node
    error: str | None = None
    """Why the node could not be probed; then every other field may be empty."""
    error_kind: str | None = None
    hint: str | None = None
    connect_ms: float | None = None
    rtt_ms: float | None = None
    ssh_offset_ms: float | None = None
    """Node clock minus controller clock, from the `date` round trip (± rtt/2)."""
    python_fallback: str | None = None
    """Set when node.python could not run the probe and python3 did: what went wrong."""
    raw: dict[str, Any] = field(default_factory=dict)
    listen: dict[str, Any] = field(default_factory=dict)
    reach: list[dict[str, Any]] = field(default_factory=list)
    reach_error: str | None = None
    malformed: list[str] = field(default_factory=list)
    """Parts of the probe's answer that were not of the shape the probe writes (dropped): a
    mismatched or tampered probe; the `ssh` check fails on it."""
    fabric: FabricFacts | None = None
    """What the fabric job measured (`preflight/fabric/job.py`), the same object on every node; None
    where the fabric check was not selected."""
    controller_clock: ControllerClock | None = None
    """The controller's own offset to `checks.clock.ntp_server` (`controller_clock.measure`), the
    same object on every node; None where the clock check was not selected."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.raw.get("env") or {})

    @property
    def gpus(self) -> GpuFacts:
        return parse_gpus(self.raw.get("gpus") or {})

    @property
    def ib(self) -> dict[str, IbDevice]:
        return parse_ib(self.raw.get("ib") or {})

    def image(self, rt: Runtime) -> HeldImage | None:
        """What the node holds under `job.container.image` (the probe's `container_image`, `rt`'s
        `inspect`, read by `runtimes.held`); None when the probe did not ask."""
        res = self.raw.get("container_image")
        return held(rt, res.get("rc"), res.get("out") or "", res.get("err") or "") if res else None

    @property
    def chrony(self) -> ChronyTracking | None:
        res = self.raw.get("chrony") or {}
        return parse_chrony_tracking(res.get("out", "")) if res.get("rc") == 0 else None


_RANK = {"skip": 0, "ok": 1, "warn": 2, "fail": 3}
Facts = Mapping[str, NodeFacts]


@dataclass(frozen=True)
class CheckResult:
    """One row of the report: a check's verdict on one node."""

    check: str
    node: str
    status: str
    value: str = ""
    detail: str = ""
    hint: str = ""

    def to_json(self) -> dict[str, str]:
        return {
            "check": self.check,
            "node": self.node,
            "status": self.status,
            "value": self.value,
            "detail": self.detail,
            "hint": self.hint,
        }


class Findings:
    """Collects findings for one (check, node); the worst status wins, details accumulate."""

    def __init__(self, check: str, node: str) -> None:
        self.check, self.node = check, node
        self.items: list[tuple[str, str, str]] = []
        self.value = ""

    def add(self, status: str, detail: str, hint: str = "") -> None:
        self.items.append((status, detail, hint))

    def result(self, default_detail: str = "") -> CheckResult:
        if not self.items:
            return CheckResult(self.check, self.node, "ok", self.value, default_detail)
        worst = max(_RANK[s] for s, _, _ in self.items)
        status = next(s for s in CHECK_STATUSES if _RANK[s] == worst)
        ordered = sorted(self.items, key=lambda i: -_RANK[i[0]])
        detail = "; ".join(d for _, d, _ in ordered if d)
        hints = list(dict.fromkeys(h for s, _, h in ordered if h and _RANK[s] == worst))
        return CheckResult(self.check, self.node, status, self.value, detail, "; ".join(hints))


def majority(values: Mapping[str, Hashable]) -> tuple[Hashable, int, bool]:
    """(most common value, how many nodes have it, whether it is the only most common value).

    Nodes are judged against it only when it is unique: with 2 against 2 nobody is "the odd one"."""
    counts = Counter(values.values())
    ranked = counts.most_common()
    unique = len(ranked) == 1 or ranked[0][1] > ranked[1][1]
    return ranked[0][0], ranked[0][1], unique


def odd_one_out(values: Mapping[str, Hashable], mine: Hashable) -> tuple[Hashable, int] | None:
    """(majority value, its count) when `mine` differs from a unique majority of two or more nodes."""
    if len(values) < 2:
        return None
    common, count, unique = majority(values)
    return (common, count) if mine != common and unique else None


def probed(inv: Inventory, facts: Facts) -> list[tuple[Node, NodeFacts]]:
    return [(n, facts[n.name]) for n in inv.nodes if n.name in facts and facts[n.name].ok]
