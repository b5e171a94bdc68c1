"""Scale simulation: how planning and log merging grow with cluster size (pure code, no SSH).

For N in {4, 64, 512} nodes: time to parse+validate an inventory and build every node's torchrun
command, time to k-way merge a fixed number of parsed log lines per node (the heap merge of the
live follow, `--json` and filters), and time to merge as many raw node.log lines into plain text
(the block merge of `orch logs` and merged.log, in Python and in C). Reports the cost per node (plan) and per line
(merges); goal: linear or better in N.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import write
from orchestrator.config import inventory
from orchestrator.config.plan import make_plan

SIZES = (4, 64, 512)


def inventory_text(n: int) -> str:
    return (
        f"name: sim{n}\nnodes:\n  - host: gpu[{1:04d}-{n:04d}]\n    gpus: 8\n"
        "env: {NCCL_SOCKET_IFNAME: ens2f1, NCCL_IB_HCA: mlx5_0}\n"
        "job: {workdir: /w, args: {model: yolo12m.yaml, data: /d/coco.yaml, batch: 4096}}\n"
    )


def plan_seconds(n: int, reps: int) -> float:
    text = inventory_text(n)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        make_plan(inventory.parse(text, f"sim{n}.yaml"), "bench")
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def merge_seconds(n: int, lines_per_node: int, reps: int) -> float | None:
    try:
        from orchestrator.logs.lines import LogLine
        from orchestrator.logs.merge import merge
    except ImportError:
        return None

    def stream(node: int) -> Iterator[Any]:
        for i in range(lines_per_node):
            yield LogLine(
                ts=1_764_495_125.0 + i * 0.01 + node * 1e-6,
                node=f"gpu{node:04d}",
                node_rank=node,
                rank=node * 8,
                local_rank=0,
                stream="out",
                text="step",
            )

    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _line in merge([stream(k) for k in range(n)]):
            pass
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def node_lines(node: int, count: int) -> list[str]:
    """One node's node.log lines for the plain merges: 8 workers, 10 ms apart, nodes 1 µs apart."""
    from orchestrator.logs.lines import format_ts

    return [
        f"{format_ts(1_764_495_125.0 + i * 0.01 + node * 1e-6)} out [default{i % 8}]:[rank {node * 8 + i % 8}] "
        f"step {i}\n"
        for i in range(count)
    ]


def plain_merge_seconds(n: int, lines_per_node: int, reps: int, block_lines: int = 500) -> float:
    from orchestrator.logs.lines import column_widths
    from orchestrator.logs.merge import PlainNode, merge_plain

    texts = []
    for node in range(n):
        lines = node_lines(node, lines_per_node)
        texts.append(["".join(lines[k : k + block_lines]) for k in range(0, lines_per_node, block_lines)])
    nodes = [PlainNode(f"gpu{k:04d}", k * 8) for k in range(n)]
    widths = column_widths([p.node for p in nodes], 8 * n)
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        for _chunk in merge_plain(texts, nodes, widths):
            pass
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def c_merge_seconds(n: int, lines_per_node: int, reps: int) -> float | None:
    """The C merge (what `orch logs` runs where it is built) over n node files; None if not built."""
    from orchestrator.logs.fetch import NodeSource
    from orchestrator.logs.lines import column_widths
    from orchestrator.logs.stored import fast_merge_available, plain_merged_bytes

    if not fast_merge_available():
        return None
    with tempfile.TemporaryDirectory() as d:
        sources = []
        for node in range(n):
            path = Path(d, f"gpu{node:04d}.log")
            path.write_text("".join(node_lines(node, lines_per_node)))
            sources.append(NodeSource(f"gpu{node:04d}", node, node * 8, "", "", path))
        widths = column_widths([s.node for s in sources], 8 * n)
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            for _chunk in plain_merged_bytes(sources, {}, widths):
                pass
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--lines-per-node", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="one repetition, fewer lines")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.lines_per_node = 1, 200
    rows = []
    for n in SIZES:
        plan_s = plan_seconds(n, args.reps)
        merge_s = merge_seconds(n, args.lines_per_node, args.reps)
        plain_s = plain_merge_seconds(n, args.lines_per_node, args.reps)
        c_s = c_merge_seconds(n, args.lines_per_node, args.reps)
        total = n * args.lines_per_node
        rows.append(
            {
                "nodes": n,
                "plan_s": plan_s,
                "plan_us_per_node": plan_s / n * 1e6,
                "merge_s": merge_s,
                "merge_ns_per_line": None if merge_s is None else merge_s / total * 1e9,
                "plain_merge_s": plain_s,
                "plain_merge_ns_per_line": plain_s / total * 1e9,
                "c_merge_s": c_s,
                "c_merge_ns_per_line": None if c_s is None else c_s / total * 1e9,
            }
        )
        print(
            f"scale: {n:4d} nodes  plan {plan_s * 1e3:8.2f} ms ({plan_s / n * 1e6:7.1f} us/node)"
            + ("" if merge_s is None else f"  merge {merge_s:6.2f} s ({merge_s / total * 1e9:6.0f} ns/line)")
            + f"  block merge {plain_s:6.2f} s ({plain_s / total * 1e9:6.0f} ns/line)"
            + ("" if c_s is None else f"  C merge {c_s:6.3f} s ({c_s / total * 1e9:6.0f} ns/line)"),
            flush=True,
        )
    small, big = rows[0], rows[-1]
    growth = {"plan_per_node_ratio_512_vs_4": big["plan_us_per_node"] / small["plan_us_per_node"]}
    if big["merge_ns_per_line"] and small["merge_ns_per_line"]:
        growth["merge_per_line_ratio_512_vs_4"] = big["merge_ns_per_line"] / small["merge_ns_per_line"]
    growth["plain_merge_per_line_ratio_512_vs_4"] = big["plain_merge_ns_per_line"] / small["plain_merge_ns_per_line"]
    summary = [
        {
            "what": "plan cost per node, 512 vs 4 nodes",
            "orch": growth["plan_per_node_ratio_512_vs_4"],
            "peer": None,
            "ratio": growth["plan_per_node_ratio_512_vs_4"],
            "goal": "<= 1 (linear or better)",
            "met": growth["plan_per_node_ratio_512_vs_4"] <= 1.0,
        }
    ]
    if "merge_per_line_ratio_512_vs_4" in growth:
        r = growth["merge_per_line_ratio_512_vs_4"]
        summary.append(
            {
                "what": "merge cost per line, 512 vs 4 nodes",
                "orch": r,
                "peer": None,
                "ratio": r,
                "goal": "<= log2(512)/log2(4) = 4.5 (k-way heap)",
                "met": r <= 4.5,
            }
        )
    r = growth["plain_merge_per_line_ratio_512_vs_4"]
    summary.append(
        {
            "what": "block merge (orch logs) cost per line, 512 vs 4 nodes",
            "orch": r,
            "peer": None,
            "ratio": r,
            "goal": "<= log2(512)/log2(4) = 4.5 (sort of sorted runs)",
            "met": r <= 4.5,
        }
    )
    if big["c_merge_ns_per_line"] and small["c_merge_ns_per_line"]:
        r = growth["c_merge_per_line_ratio_512_vs_4"] = big["c_merge_ns_per_line"] / small["c_merge_ns_per_line"]
        summary.append(
            {
                "what": "C merge (orch logs where built) cost per line, 512 vs 4 nodes",
                "orch": r,
                "peer": None,
                "ratio": r,
                "goal": "<= log2(512)/log2(4) = 4.5 (k-way heap)",
                "met": r <= 4.5,
            }
        )
    result = {
        "rows": rows,
        "growth": growth,
        "summary": summary,
        "goal": "per-node plan cost and per-line merge cost stay flat or grow no faster than log(N)",
    }
    write("scale.quick" if args.quick else "scale", result)
    return result


if __name__ == "__main__":
    main()
