"""What a check returns, and the helpers every check judges with: one `CheckResult` per (check,
node), `Findings` that collect a node's findings (the worst status wins), the majority rule of
checks that compare nodes, and the nodes that were probed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from ..config.inventory import Inventory
from ..config.nodes import Node
from ..contract import CHECK_STATUSES
from .facts import NodeFacts

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
