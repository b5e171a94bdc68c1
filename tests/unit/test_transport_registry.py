"""Transports are found by name in one registry (`transport.TRANSPORTS`), and only transport/ asks
which one an inventory names: everything else asks the transport what it is (`same_host`,
`target`) or what it does (`run`, `pipe`, `copy_tree`). The inventory schema's names and the
reader's `SAME_HOST` are held to the registry here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from orchestrator.config import inventory
from orchestrator.config.schema import ALLOCATED, SAME_HOST, InventoryModel, fields_of
from orchestrator.transport import (
    TRANSPORTS,
    LocalTransport,
    SlurmTransport,
    SSHTransport,
    Transport,
    open_transport,
    transport_of,
)

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


def test_the_schema_names_exactly_the_registered_transports() -> None:
    assert set(get_args(fields_of(InventoryModel)["transport"])) == set(TRANSPORTS)
    assert InventoryModel.transport in TRANSPORTS  # the default


def test_the_reader_knows_each_transport_as_its_class_does() -> None:
    assert dict(SAME_HOST) == {name: kind.same_host for name, kind in TRANSPORTS.items()}
    assert dict(ALLOCATED) == {name: kind.allocates for name, kind in TRANSPORTS.items()}


def test_each_registered_class_is_a_transport_under_its_own_name() -> None:
    for name, kind in TRANSPORTS.items():
        assert issubclass(kind, Transport) and kind.name == name
    assert {"ssh": SSHTransport, "local": LocalTransport, "slurm": SlurmTransport} == TRANSPORTS


def test_an_inventory_opens_the_transport_it_names() -> None:
    for name, kind in TRANSPORTS.items():
        if kind.allocates:  # its nodes are an allocation's
            inv = inventory.parse(f"transport: {name}\nslurm: {{nodes: 1}}\n", "t.yaml")
            inv = inventory.with_allocation(inv, inventory.Allocation("7", ("n1",)))
        else:
            inv = inventory.parse(f"transport: {name}\nnodes:\n  - host: localhost\n", "t.yaml")
        assert transport_of(inv) is kind and type(open_transport(inv, inv.nodes[0])) is kind


def test_what_a_report_line_calls_each_reach() -> None:
    ssh = inventory.parse("ssh: {user: me, port: 2222}\nnodes:\n  - host: gpu1\n", "t.yaml")
    assert transport_of(ssh).target(ssh.nodes[0]) == "me@gpu1:2222"
    local = inventory.parse("transport: local\nnodes:\n  - host: localhost\n", "t.yaml")
    assert transport_of(local).target(local.nodes[0]) == "local process (transport: local)"
    slurm = inventory.parse("transport: slurm\nslurm: {nodes: 1}\n", "t.yaml")
    slurm = inventory.with_allocation(slurm, inventory.Allocation("7", ("gpu017",)))
    assert transport_of(slurm).target(slurm.nodes[0]) == "Slurm node gpu017 (srun)"


# ----------------------------------------------------------------------------- held for every module


def name_tests(path: Path, names: frozenset[str] = frozenset(TRANSPORTS), root: Path = PACKAGE) -> list[str]:
    """Comparisons of something's `.transport` (or a `transport` variable) with a transport's name,
    as `path:line: code`: `inv.transport == "local"`, `m.transport != "ssh"`, `x.transport in
    ("local",)`. Other things called transport (NCCL's `conn.transport == "NET"`) are not names of
    ours, and a lookup keyed by the name (`SAME_HOST[m.transport]`) is not a branch on it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        about = any(
            (isinstance(o, ast.Attribute) and o.attr == "transport")
            or (isinstance(o, ast.Name) and o.id == "transport")
            for o in operands
        )
        words = set()
        for o in operands:
            for c in ast.walk(o):
                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                    words.add(c.value)
        if about and words & names:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_transport_branches_on_the_transports_name() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "transport"
        for hit in name_tests(path)
    ]
    assert found == [], "ask the transport (transport_of(inv).same_host, .target, its verbs):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("code", "hit"),
    [
        ('if inv.transport == "local": pass', True),
        ('x = "ssh" != self.m.transport', True),
        ('ok = inv.transport in ("local", "ssh")', True),
        ('ok = transport == "local"', True),
        ('net = conn.transport == "NET"', False),
        ("same = SAME_HOST[self.m.transport]", False),
        ('name = inv.transport or "ssh"', False),
    ],
)
def test_the_scan_sees_a_branch_on_the_name(tmp_path: Path, code: str, hit: bool) -> None:
    # in the test's own directory: a sample in the package raced the other cases (xdist workers) and
    # the scan of every module above
    sample = tmp_path / "sample.py"
    sample.write_text(code + "\n")
    assert bool(name_tests(sample, root=tmp_path)) is hit
