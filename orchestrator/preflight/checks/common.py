"""What more than one check judges with: a value shown, node names folded, a node's reach of
its ring successor (`rdma` over verbs, `ports` over TCP)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...config.inventory import Inventory
from ...config.jobenv import job_env
from ...config.nodeset import fold
from ..results import Findings, NodeFacts


def show(v: Any) -> str:
    return "unset" if v is None else str(v)


def fold_names(names: Iterable[str]) -> str:
    return fold(sorted(names))


def ring_reach(nf: NodeFacts, f: Findings, verbs: bool = False) -> None:
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


def no_image(inv: Inventory, nf: NodeFacts) -> str | None:
    """Why nothing answered from the job's container on this node, as the one line of each row that
    needed it (`software`, the job's own check; the `container` row says why and what to do): the
    image is not there and will not be pulled (the probe started no container of it:
    `node/probe.image_gone`), or the container did not start (`container_start`). None: it answered."""
    env = job_env(inv, nf.node)
    if env.runtime is None:
        return None
    held = nf.image(env.runtime)
    if held is not None and held.image_id is None and env.needs_image:
        what = f"{env.runtime.name} does not answer" if held.error else f"{env.image} is not here"
        return f"not checked: {what}, so no container of the job's image ran on this node (the container row says why)"
    if nf.raw.get("container_start"):
        return "not checked: the job's container did not start on this node (the container row says why)"
    return None
