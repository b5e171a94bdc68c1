"""The fabric check's verdict: a pure function of what the fabric job measured (`FabricFacts`,
gathered by `fabric/job.py`) and `checks.fabric`: the all_reduce sweep's busbw, each node's
pairwise send and receive rates against the median node, wrong results, and with NCCL the
transport it picked between nodes (its NCCL_DEBUG=INFO lines, `nccl_log.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...config.inventory import Inventory
from ..results import CheckResult, Facts, Findings, probed
from . import busbw, nccl_log

if TYPE_CHECKING:
    from .job import FabricFacts


MiB = 1 << 20


def _size(n: int) -> str:
    """1048576 → `1 MiB`, 268435456 → `256 MiB` (sizes of the sweep)."""
    if n >= 1 << 30 and n % (1 << 30) == 0:
        return f"{n >> 30} GiB"
    if n >= MiB and n % MiB == 0:
        return f"{n >> 20} MiB"
    return f"{n} B"


def fabric_summary(inv: Inventory, ff: FabricFacts) -> dict[str, Any]:
    """What the fabric job measured, judged with `checks.fabric`: check.json's `fabric` and the
    facts `check_fabric` words. Node ids of the job become node names."""
    f = inv.checks.fabric
    out: dict[str, Any] = {
        "run": ff.run_id,
        "backend": ff.backend,
        "wall_s": round(ff.wall_s, 2),
        "steps_s": {k: round(v, 2) for k, v in ff.steps_s.items()},
        "timed_out": ff.timed_out,
        "settings": {
            "max_bytes": f.max_bytes,
            "min_busbw_gbps": f.min_busbw_gbps,
            "share": f.share,
            "timeout_s": f.timeout_s,
            "budget_s": f.budget_s,
        },
        "errors": {name: fn.error for name, fn in ff.nodes.items() if fn.error},
        "job_errors": ff.job_errors(),
        "not_stopped": dict(ff.not_stopped),
    }
    if ff.backend == "nccl":
        out["nccl"] = {name: nccl_log.summary(nccl_log.parse(fn.text(), host=name)) for name, fn in ff.nodes.items()}
    r = ff.result
    if r is None:
        return out
    names = {int(n["node"]): str(n["host"]) for n in r.get("nodes", [])}
    out.update({k: r.get(k) for k in ("device", "world_size", "nnodes", "torch", "op", "dtype", "sweep", "skipped")})
    out["nccl_version"] = r.get("nccl")
    out["job_s"] = round(float(r.get("elapsed_s") or 0), 2)
    out["phase_s"] = {k: round(float(v), 2) for k, v in (r.get("phase_s") or {}).items()}
    sweep = r.get("sweep") or []
    last = max(sweep, key=lambda row: row["size_bytes"]) if sweep else None
    out["busbw_gbps"] = last["busbw_gbps"] if last else None
    out["busbw_size_bytes"] = last["size_bytes"] if last else None
    links = r.get("links") or {}
    out["links"] = {
        k: links.get(k)
        for k in (
            "method",
            "rounds",
            "passes",
            "rails",
            "pairs_at_once",
            "pairs_why",
            "skipped",
            "rechecks",
            "recheck_share",
        )
        if links.get(k) is not None
    }
    if out["links"].get("rechecks"):  # node ids of the job become node names, in a copy: r is judged again
        out["links"]["rechecks"] = [
            {**rc, "pairs": [[names.get(int(a), str(a)), names.get(int(b), str(b))] for a, b in rc["pairs"]]}
            for rc in out["links"]["rechecks"]
        ]
    ids = sorted(names)
    s = (
        busbw.link_summary(busbw.best_passes(links.get("transfers") or []), ids, f.share)
        if len(ids) > 1
        else {"pairs": [], "per_node": [], "slow_nodes": [], "slow_links": []}
    )
    out["per_node"] = [{"node": names[p["node"]], **{k: v for k, v in p.items() if k != "node"}} for p in s["per_node"]]
    out["pairs"] = [{"src": names[p["src_node"]], "dst": names[p["dst_node"]], "gbps": p["gbps"]} for p in s["pairs"]]
    out["slow_nodes"] = [
        {"node": names[p["node"]], "direction": p["direction"], "gbps": p["gbps"], "median_gbps": p["median_gbps"]}
        for p in s["slow_nodes"]
    ]
    out["slow_links"] = [
        {
            "src": names[p["src_node"]],
            "dst": names[p["dst_node"]],
            "gbps": p["gbps"],
            "expected_gbps": p["expected_gbps"],
        }
        for p in s["slow_links"]
    ]
    out["share"] = f.share
    return out


def check_fabric(inv: Inventory, facts: Facts) -> list[CheckResult]:
    """The collective path: the job's all_reduce sweep and pairwise rates (fabric/job.py).

    fail: the job could not run or failed on a node (its error named); busbw at the largest size
    below `min_busbw_gbps` (on the slow nodes when some are named, else cluster-wide); an
    all_reduce that returned wrong values; with NCCL and `checks.rdma.devices`, a node whose NCCL
    used TCP sockets between nodes (its NCCL lines quoted). warn: a node whose best pair sends or
    receives below `share` × the median node; a link below `share` × what both its ends reach."""
    nodes = probed(inv, facts)
    ff = next((nf.fabric for _, nf in nodes if nf.fabric is not None), None)
    if ff is None or ff.not_run:
        reason = ff.not_run if ff is not None and ff.not_run else "not run"
        return [CheckResult("fabric", n.name, "skip", "", reason) for n, _ in nodes]
    s = fabric_summary(inv, ff)
    out = []
    for node, _ in nodes:
        f = Findings("fabric", node.name)
        if ff.result is None or node.name in s["errors"] or node.name in ff.not_stopped:
            _fabric_failed(inv, ff, s, node.name, f)
        else:
            _fabric_rates(inv, s, node.name, f)
        if ff.backend == "nccl":
            _fabric_transport(inv, ff, node.name, f)
        out.append(f.result())
    return out


def _fabric_failed(inv: Inventory, ff: FabricFacts, s: Mapping[str, Any], name: str, f: Findings) -> None:
    """The job gave no result: what this node saw, and which node failed first."""
    said = s["job_errors"].get(name)
    own = s["errors"].get(name)
    culprits = [n for n in s["errors"] if n != name]
    if ff.timed_out:
        f.add(
            "fail",
            f"no result within timeout_s {inv.checks.fabric.timeout_s:g} s" + (f": {own}" if own else ""),
            "a node that hangs in a collective: look at its network (pulled cable, firewall between the "
            "nodes' addr) or raise checks.fabric.timeout_s for large max_bytes on slow links",
        )
    log = f"the whole log: {ff.nodes[name].remote_dir}/node.log on {name}"
    if said:
        f.add(
            "fail",
            f"the fabric job failed here in its {said.get('phase')} phase: {said.get('error')}",
            f"{_fabric_error_hint(str(said.get('error')))}; {log}",
        )
    elif own:
        f.add("fail", own, log)
    else:
        first = ", ".join(culprits) or "another node"
        f.add("fail", f"no result: stopped after the job failed on {first}", f"{first}: see its row; {log}")
    if name in ff.not_stopped:
        f.add(
            "fail",
            f"could not confirm the fabric job stopped here: {ff.not_stopped[name]}",
            "ssh to the node and stop what runs under the check's run directory",
        )
    tail = [ln for ln in ff.nodes[name].text().splitlines() if ln.strip()][-3:] if not said else []
    if tail and not ff.timed_out and own:
        f.add("fail", "last lines: " + " | ".join(tail))


def _fabric_error_hint(error: str) -> str:
    if "GLOO_SOCKET_IFNAME" in error or "NCCL_SOCKET_IFNAME" in error:
        return "set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in the inventory env to the interface of the data plane"
    if "CUDA" in error or "cuda" in error:
        return "the job uses NCCL because the nodes declare gpus: check the driver (the gpus check) on this node"
    return (
        "a peer that died or cannot be reached: look at the other nodes' rows, at the network between "
        "the nodes' addr, and at the firewall"
    )


def _fabric_rates(inv: Inventory, s: Mapping[str, Any], name: str, f: Findings) -> None:
    """The job measured: this node's rates against the others, the cluster's busbw."""
    cfg = inv.checks.fabric
    mine = next((p for p in s["per_node"] if p["node"] == name), None)
    busbw_value = s.get("busbw_gbps")
    size = int(s.get("busbw_size_bytes") or 0)
    where = (
        f"all_reduce busbw {busbw_value:.3g} GB/s at {_size(size)} ({s['backend']}, {s['world_size']} ranks "
        f"on {s['nnodes']} nodes)"
        if busbw_value is not None
        else "no all_reduce size measured"
    )
    if mine is not None and mine.get("send_gbps") is not None:
        f.value = f"send {mine['send_gbps']:.3g} / recv {mine['recv_gbps']:.3g} GB/s"
        f.add(
            "ok",
            f"{where}; best pair: send {mine['send_gbps']:.3g} GB/s, recv {mine['recv_gbps']:.3g} GB/s "
            f"(medians over its pairs {mine['send_median_gbps']:.3g} / {mine['recv_median_gbps']:.3g})",
        )
    else:
        f.value = f"busbw {busbw_value:.3g} GB/s" if busbw_value is not None else ""
        f.add("ok", where + ("" if s["nnodes"] and s["nnodes"] > 1 else "; one node: no links between nodes"))
    if name == inv.master.name and s.get("skipped"):
        f.add(
            "ok", "sizes left out to stay within budget_s: " + ", ".join(_size(x["size_bytes"]) for x in s["skipped"])
        )
    slow = [p for p in s["slow_nodes"] if p["node"] == name]
    hint = _slow_hint(name, s)
    for p in slow:
        f.add(
            "warn",
            f"slow node: {p['direction']} {p['gbps']:.3g} GB/s is {p['gbps'] / p['median_gbps']:.2f}× "
            f"the median node ({p['median_gbps']:.3g} GB/s; warn below {s['share']:g}×)",
            hint,
        )
    for p in s["slow_links"]:
        if name in (p["src"], p["dst"]):
            f.add(
                "warn",
                f"slow link {p['src']}→{p['dst']}: {p['gbps']:.3g} GB/s, below {s['share']:g}× what both "
                f"its ends reach ({p['expected_gbps']:.3g} GB/s)",
                hint,
            )
    wrong = sum(int(row.get("wrong") or 0) for row in s.get("sweep") or [])
    if wrong and name == inv.master.name:
        f.add(
            "fail",
            f"cluster-wide: all_reduce returned {wrong} wrong element(s) (#wrong, as nccl-tests counts)",
            "corrupted data on the path: a faulty NIC, cable or GPU; rerun with fewer nodes to find it",
        )
    if cfg.min_busbw_gbps is not None and busbw_value is not None and busbw_value < cfg.min_busbw_gbps:
        blamed = {p["node"] for p in s["slow_nodes"]}
        text = (
            f"busbw {busbw_value:.3g} GB/s at {_size(size)} is below checks.fabric.min_busbw_gbps "
            f"{cfg.min_busbw_gbps:g}"
        )
        if name in blamed:
            f.add("fail", text + " (this node is the slow one)", hint)
        elif not blamed and name == inv.master.name:
            f.add(
                "fail",
                "cluster-wide: " + text,
                "no single node is slower than the others: the fabric itself (link speed, NCCL_SOCKET_IFNAME / "
                "GLOO_SOCKET_IFNAME on a slow interface, NCCL using sockets instead of RDMA)",
            )


def _slow_hint(name: str, s: Mapping[str, Any]) -> str:
    peers = [f"{p['src']}→{p['dst']} {p['gbps']:.3g}" for p in s["pairs"] if name in (p["src"], p["dst"])]
    return (
        "look at this node's link: the cable and switch port, `ethtool IFACE` (speed, errors), `ibstat` on "
        "RDMA, and that NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name its fast interface; its pairs (GB/s): "
        + ", ".join(peers)
    )


def _fabric_transport(inv: Inventory, ff: FabricFacts, name: str, f: Findings) -> None:
    """With NCCL: the transport it picked between nodes, from this node's NCCL_DEBUG=INFO lines."""
    log = nccl_log.parse(ff.nodes[name].text(), host=name)
    if not log.nccl_lines:
        if ff.result is not None:
            f.add(
                "warn",
                "no NCCL INFO lines in this node's log: which transport NCCL used is unknown",
                "the check sets NCCL_DEBUG=INFO; an NCCL_DEBUG_FILE in the env sends them elsewhere",
            )
        return
    found = nccl_log.socket_findings(log)
    counts = log.transports()
    shown = ", ".join(f"{k} ×{v}" for k, v in sorted(counts.items())) or "no connection lines"
    wanted = inv.checks.rdma_devices
    if found and wanted:
        for finding in found:
            f.add(
                "fail",
                f"NCCL used TCP sockets between nodes, not RDMA ({', '.join(wanted)}): {finding.reason}; "
                + " | ".join(line.strip() for line in finding.evidence),
                "NCCL found no usable HCA: check NCCL_IB_HCA / NCCL_IB_DISABLE in the env, the HCA and its "
                "port (ibstat, the rdma check), and that the job's python sees libibverbs",
            )
        return
    used = list(dict.fromkeys(f"{d.name}:{d.port}/{d.link_layer}" for h in log.hosts for d in log.ib_devices(h)))
    networks = sorted({net for h in log.hosts for net in log.networks(h)})
    version = f"NCCL {log.version}" if log.version else "NCCL"
    detail = f"{version} network {', '.join(networks) or 'unknown'}; connections: {shown}"
    if found:
        f.add("ok", detail + " (TCP sockets between nodes; no RDMA required: checks.rdma.devices is empty)")
        return
    missing = [d for d in wanted if not any(u.startswith(d + ":") for u in used)]
    if wanted and used and missing:
        f.add(
            "warn",
            f"{detail}; NCCL used {', '.join(used)}, not {', '.join(missing)}",
            "NCCL_IB_HCA selects the HCAs NCCL uses; match it to checks.rdma.devices",
        )
    else:
        f.add("ok", detail + (f" ({', '.join(used)})" if used else ""))
