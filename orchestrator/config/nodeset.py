"""Node sets as people type them on the command line (`--nodes gpu[01-04],gpu07`) and as orch
prints them (`node[1-3,5]`): ClusterShell's NodeSet syntax, the one pdsh, clush and Slurm use.

Pure. ClusterShell (~8 ms to import) is loaded only for a set that has a range, or to fold more
than one name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from ..errors import UsageError
from .nodes import Node

_PLAIN_LIST = re.compile(r"^[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$")


def expand(spec: str, option: str = "--nodes") -> list[str]:
    """`node[1-3],gpu7` → `['node1', 'node2', 'node3', 'gpu7']`; a bad set is a UsageError."""
    spec = spec.strip()
    if _PLAIN_LIST.match(spec):
        return list(dict.fromkeys(spec.split(",")))
    from ClusterShell.NodeSet import NodeSet, NodeSetException

    try:
        return list(NodeSet(spec))
    except NodeSetException as exc:
        raise UsageError(f"bad {option} '{spec}': {exc}", "use names or ranges, e.g. gpu[01-04],gpu07") from None


def select(spec: str | None, nodes: Sequence[Node], option: str = "--nodes") -> list[Node]:
    """The nodes a set names (by name or host), in inventory order; every node when spec is None.
    A name that is no node is a UsageError listing the nodes there are."""
    if spec is None:
        return list(nodes)
    wanted = expand(spec, option)
    if not wanted:
        raise UsageError(f"{option} '{spec}' names no node", "use names or ranges, e.g. gpu[01-04]")
    known = {n.name: n for n in nodes}
    known.update({n.host: n for n in nodes if n.host not in known})
    unknown = [w for w in wanted if w not in known]
    if unknown:
        names = [n.name for n in nodes]
        raise UsageError(
            f"{option}: no node named {', '.join(unknown)}",
            "the nodes are " + fold(names) if len(names) > 1 else "the node is " + names[0],
        )
    chosen = {known[w].name for w in wanted}
    return [n for n in nodes if n.name in chosen]


def fold(names: Iterable[str]) -> str:
    """`['node1', 'node2', 'node3', 'node5']` → `node[1-3,5]` (dshbak -c, clush -b)."""
    names = list(names)
    if len(names) == 1:
        return names[0]
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(names))
