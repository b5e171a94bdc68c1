"""Facts orch computes or declares in one place only (docs/ARCHITECTURE.md, habit 8), held by
reading the source like tests/unit/test_layers.py: the world size (config/plan.py), run.json's node
records (run/records.py `NodeRecord`), the progress callback's type (contract.py `Progress`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "node")
"""orch's modules on the controller (the node programs import nothing of orch)."""


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


# ----------------------------------------------------------------------------- world size


def _mentions_procs(node: ast.AST) -> bool:
    """An expression that reads a node's process count: `.nproc_per_node`, `.nproc`, `["nproc"]`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("nproc_per_node", "nproc"):
            return True
        if isinstance(sub, ast.Constant) and sub.value == "nproc":
            return True
    return False


def counted_ranks(tree: ast.AST) -> list[int]:
    """Lines that add up (or multiply) nodes' process counts: a world size computed by hand, also
    through a name (`per_node = [n["nproc"] ...]; sum(per_node)`)."""
    counts = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _mentions_procs(node.value)
              for t in node.targets if isinstance(t, ast.Name)}

    def procs(node: ast.AST) -> bool:
        return _mentions_procs(node) or (isinstance(node, ast.Name) and node.id in counts)

    found = []
    for node in ast.walk(tree):
        summed = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sum"
                  and any(procs(a) for a in node.args))
        multiplied = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and (
            _mentions_procs(node.left) or _mentions_procs(node.right))
        added = isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and _mentions_procs(node.value)
        if summed or multiplied or added:
            found.append(node.lineno)
    return sorted(found)


@pytest.mark.parametrize("path", [p for p in SOURCES if _rel(p) != "config/plan.py"], ids=_rel)
def test_only_the_plan_counts_the_ranks(path: Path) -> None:
    """`config.plan.world_size` (and `plan.first_ranks`) count a job's ranks; everyone asks them."""
    assert counted_ranks(ast.parse(path.read_text())) == [], f"{_rel(path)} counts ranks itself"


def test_the_guard_sees_ranks_counted_elsewhere() -> None:
    code = '''
world = sum(n.nproc_per_node for n in inv.nodes)
total = sum(int(r.get("nproc") or 0) for r in records)
first = 0
for node in nodes:
    first += node.nproc_per_node
ranks = len(inv.nodes) * inv.nodes[0].nproc_per_node
fine = sum(sizes) + len(nodes) * 2
per_node = [int(n.get("nproc") or 0) for n in nodes]
procs = sum(per_node)
'''
    assert counted_ranks(ast.parse(code)) == [2, 3, 6, 7, 10]


def test_the_plan_counts_them() -> None:
    from orchestrator.config.inventory import parse
    from orchestrator.config.plan import first_ranks, make_plan, world_size

    inv = parse("name: t\ntransport: local\njob: {rdzv: c10d}\nnodes:\n  - {host: localhost, name: a, nproc_per_node: 2}\n"
                "  - {host: localhost, name: b, nproc_per_node: 3}\n  - {host: localhost, name: c}\n")
    assert world_size(inv.nodes) == 6 == make_plan(inv).world_size
    assert first_ranks(inv.nodes) == {"a": 0, "b": 2, "c": 5}
    assert [p.global_ranks for p in make_plan(inv).nodes] == [range(0, 2), range(2, 5), range(5, 6)]
