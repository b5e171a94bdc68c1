"""Fabric check: its all_reduce busbw against a plain torchrun all_reduce loop on the same nodes.

On N real sshd nodes (loopback, gloo on CPU), the same message sizes on both sides:

- orch: `run_preflight(only=["fabric"])`, the whole check (probe, ship and start the job through
  the node agents, the sweep, the pairwise phase, teardown, read back); the busbw of its sweep.
- peer: torchrun on every node running the plainest loop that measures the same thing (below,
  `PLAIN`): per size a warm-up op, then timed ops between a barrier and the end, the slowest
  rank's time per op, busbw = size / time x 2(n-1)/n, as nccl-tests does.

Both sides alternate, after a warm-up round; medians per size. Goal: orch's busbw >= 0.9 x the
plain loop's at the largest size (the measurement itself costs little). Also reported: the check's
wall time, and its busbw at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, write

sys.path.insert(0, str(REPO))

MB = 1 << 20
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
PLAIN = """
import json, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out = []
for size in [int(s) for s in sys.argv[1].split(",")]:
    buf = torch.zeros(size // 4, dtype=torch.float32)
    dist.all_reduce(buf)
    first = time.perf_counter()
    dist.all_reduce(buf)
    t = torch.tensor([time.perf_counter() - first], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    iters = max(1, min(20, int(0.5 / max(float(t), 1e-9))))
    dist.barrier()
    begin = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    t = torch.tensor([(time.perf_counter() - begin) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out.append({"size_bytes": size, "iters": iters, "busbw_gbps": size / float(t) / 1e9 * 2 * (world - 1) / world})
if rank == 0:
    print("PLAIN " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--max-bytes", default="64M", help="the sweep's largest size (checks.fabric.max_bytes)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 nodes, 4M, one repetition")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.max_bytes, args.reps = 2, "4M", 1
    from orchestrator.config.inventory import load
    from orchestrator.preflight.runner import run_preflight
    from tests.cluster import KeyStore, TestCluster
    from tests.ports import job_port

    with (
        tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp,
        TestCluster(KeyStore(Path(tmp) / "keys"), n=args.nodes, mode="loopback", root=Path(tmp) / "c") as cluster,
    ):
        port = job_port()
        inv = load(
            cluster.write_inventory(
                env=ENV, master={"port": port}, checks={"fabric": {"max_bytes": args.max_bytes, "budget_s": 120}}
            )
        )
        script = Path(tmp) / "plain_allreduce.py"
        script.write_text(PLAIN)
        sizes: list[int] = []
        samples: dict[str, list[dict[int, float]]] = {"orch_fabric": [], "plain_torchrun": []}
        walls: list[float] = []

        def orch() -> None:
            t = time.monotonic()
            report = run_preflight(inv, only=["fabric"], save=False)
            walls.append(time.monotonic() - t)
            fab = report.fabric or {}
            if not report.ok or not fab.get("sweep"):
                raise SystemExit(
                    f"fabric: the check failed: {[r.to_json() for r in report.failed()]} {fab.get('errors')}"
                )
            if not sizes:
                sizes.extend(row["size_bytes"] for row in fab["sweep"])
            samples["orch_fabric"].append({row["size_bytes"]: row["busbw_gbps"] for row in fab["sweep"]})

        def plain() -> None:
            procs = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "torch.distributed.run",
                        f"--nnodes={args.nodes}",
                        "--nproc-per-node=1",
                        f"--node-rank={i}",
                        f"--master-addr={cluster.nodes[0].addr}",
                        f"--master-port={port}",
                        str(script),
                        ",".join(map(str, sizes)),
                    ],
                    env={**os.environ, **ENV},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i in range(args.nodes)
            ]
            outs = [p.communicate(timeout=600) for p in procs]
            if any(p.returncode for p in procs):
                raise SystemExit("fabric: the plain loop failed:\n" + "\n".join(e[-2000:] for _, e in outs))
            line = next(x for x in outs[0][0].splitlines() if x.startswith("PLAIN "))
            samples["plain_torchrun"].append({r["size_bytes"]: r["busbw_gbps"] for r in json.loads(line[6:])})

        sides = {"orch_fabric": orch, "plain_torchrun": plain}
        orch()  # warm-up (and the sizes the plain loop then uses)
        plain()
        for side in samples.values():
            side.clear()
        walls.clear()
        for i in range(args.reps):
            for name in list(sides) if i % 2 == 0 else list(reversed(sides)):
                sides[name]()
    medians = {
        name: {size: statistics.median(s[size] for s in runs) for size in sizes} for name, runs in samples.items()
    }
    largest = sizes[-1]
    o, p = medians["orch_fabric"][largest], medians["plain_torchrun"][largest]
    per_size = {size: medians["orch_fabric"][size] / medians["plain_torchrun"][size] for size in sizes}
    wall = statistics.median(walls)
    print(
        f"fabric: {args.nodes} nodes, busbw at {largest // MB} MiB: orch {o:.3f} GB/s, plain loop {p:.3f} GB/s, "
        f"ratio {o / p:.2f}; per size "
        + ", ".join(f"{s // MB} MiB {r:.2f}" for s, r in per_size.items())
        + f"; fabric check wall time {wall:.1f} s (median)"
    )
    result = {
        "nodes": args.nodes,
        "sizes": sizes,
        "samples": samples,
        "medians_gbps": {k: {str(s): v for s, v in m.items()} for k, m in medians.items()},
        "ratio_per_size": {str(s): r for s, r in per_size.items()},
        "check_wall_s": walls,
        "summary": [
            {
                "what": f"fabric check busbw vs plain torchrun all_reduce loop, {args.nodes} nodes, "
                f"{largest // MB} MiB (higher is better)",
                "orch": o,
                "peer": p,
                "ratio": o / p,
                "goal": ">= 0.9",
                "met": o / p >= 0.9,
            },
            {
                "what": f"fabric check wall time, {args.nodes} nodes x 1 (loopback, gloo), s",
                "orch": wall,
                "peer": None,
                "ratio": None,
                "goal": "report",
            },
        ],
    }
    write("fabric" if not args.quick else "fabric.quick", result)
    return result


if __name__ == "__main__":
    main()
