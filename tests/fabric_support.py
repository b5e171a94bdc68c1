"""Helpers for the tests of the fabric check's output: a job result as orch's job prints it, and
what a person sees of a fabric run that printed a given result."""

from __future__ import annotations

import io
import json
from typing import Any

from orchestrator.cli import render


def fabric_result(names: list[str], backend: str = "gloo", device: str = "cpu", reason: str = "budget") -> dict:
    """A fabric job result as orch's job prints it (node/jobs/allreduce.py), names and words given."""
    mb = 1 << 20
    return {
        "schema": 1,
        "backend": backend,
        "device": device,
        "torch": "2.14.1",
        "nccl": None,
        "world_size": len(names),
        "nnodes": len(names),
        "nodes": [{"node": i, "host": n, "hostname": n, "ranks": [i], "boot_id": "b"} for i, n in enumerate(names)],
        "ranks": [],
        "op": "all_reduce",
        "dtype": "float32",
        "bus_factor": 1.0,
        "sweep": [
            {
                "size_bytes": mb,
                "count": mb // 4,
                "type": "float",
                "redop": "sum",
                "root": -1,
                "iters": 5,
                "time_us": 2000.0,
                "algbw_gbps": 0.5,
                "busbw_gbps": 0.5,
                "wrong": 0,
            }
        ],
        "skipped": [{"size_bytes": 4 * mb, "reason": reason}],
        "links": {
            "method": "pairwise",
            "rounds": 1,
            "passes": 1,
            "rails": 1,
            "pairs_at_once": "one",
            "pairs_why": "x",
            "transfers": [
                {
                    "pass": 0,
                    "round": 0,
                    "src_node": s,
                    "dst_node": d,
                    "rail": 0,
                    "bytes": mb,
                    "seconds": 0.001,
                    "gbps": 1.0 if s else 0.01,
                }
                for s in range(len(names))
                for d in range(len(names))
                if s != d
            ],
        },
        "elapsed_s": 1.0,
        "phase_s": {"sweep": 1.0},
    }


def fabric_outputs(inv_names: list[str], result: object, log: str = "") -> tuple[dict[str, Any], str]:
    """What a person sees of a fabric run whose rank 0 printed `result`: the check table (on a
    colour terminal) and the measurements, as `orch check --only fabric` shows them."""
    from rich.console import Console

    from orchestrator.config.inventory import parse
    from orchestrator.node.jobs.allreduce import MARKER
    from orchestrator.preflight import checks
    from orchestrator.preflight.fabric import judge as fabric_judge
    from orchestrator.preflight.fabric.job import FabricFacts, FabricNode, take_result
    from orchestrator.preflight.facts import NodeFacts
    from orchestrator.preflight.runner import CheckReport

    inv = parse(
        "nodes:\n"
        + "".join(f"  - {{host: 10.0.0.{i + 1}, name: {n}}}\n" for i, n in enumerate(inv_names))
        + "checks: {fabric: true}\n",
        "t.yaml",
    )
    first = f"2026-11-30T09:32:05.123456Z out [default0]:{MARKER} {json.dumps(result)}\n"
    nodes = {n.name: FabricNode(n.name, log=(first if i == 0 else "") + log) for i, n in enumerate(inv.nodes)}
    ff = FabricFacts("gloo", "fab", nodes, wall_s=1.0)
    take_result(ff, inv.nodes[0].name)
    facts = {}
    for n in inv.nodes:
        nf = NodeFacts(n, connect_ms=1, rtt_ms=1)
        nf.fabric = ff
        facts[n.name] = nf
    report = CheckReport(checks.run_checks(inv, facts, ["fabric"]), fabric=fabric_judge.fabric_summary(inv, ff))
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=300)
    render.check_table(report, console)
    render.fabric_report(report.fabric or {}, console)
    return {r.node: r for r in report.results}, buf.getvalue()
