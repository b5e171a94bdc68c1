"""Node sets on the command line (`--nodes`) and in output: ClusterShell's syntax, folded back."""

from __future__ import annotations

import pytest

from orchestrator.config import inventory, nodes, nodeset
from orchestrator.errors import UsageError

INV = inventory.parse("nodes:\n  - host: 10.0.0.[1-5]\n    name: gpu[01-05]\n  - host: spare\n", "t.yaml")


def names(found: list[nodes.Node]) -> list[str]:
    return [n.name for n in found]


def test_no_set_selects_every_node_in_inventory_order() -> None:
    assert names(nodeset.select(None, INV.nodes)) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "spare"]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("gpu02", ["gpu02"]),
        ("gpu[01-02],gpu05", ["gpu01", "gpu02", "gpu05"]),
        ("gpu05,gpu01", ["gpu01", "gpu05"]),  # inventory order, whatever order was typed
        ("spare,gpu[03-04]", ["gpu03", "gpu04", "spare"]),
        ("10.0.0.3", ["gpu03"]),  # a host names its node too
        ("gpu01,gpu01", ["gpu01"]),
    ],
)
def test_select_by_names_and_ranges(spec: str, want: list[str]) -> None:
    assert names(nodeset.select(spec, INV.nodes)) == want


def test_an_unknown_node_is_a_usage_error_that_lists_the_nodes() -> None:
    with pytest.raises(UsageError) as info:
        nodeset.select("gpu[05-07]", INV.nodes)
    assert info.value.exit_code == 2
    assert "no node named gpu06, gpu07" in info.value.message
    assert info.value.hint == "the nodes are gpu[01-05],spare"


def test_a_bad_range_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"bad --nodes 'gpu\[3-1\]'"):
        nodeset.select("gpu[3-1]", INV.nodes)


@pytest.mark.parametrize(
    ("given", "folded"),
    [
        (["node1"], "node1"),
        (["node1", "node2", "node3", "node5"], "node[1-3,5]"),
        (["gpu01", "gpu02", "spare"], "gpu[01-02],spare"),
    ],
)
def test_fold(given: list[str], folded: str) -> None:
    assert nodeset.fold(given) == folded
