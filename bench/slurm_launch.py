"""Slurm launch latency: `orch up --skip-checks` with `transport: slurm` against the recipes' way,
a hand-written `srun` line starting the same torchrun on every node.

On the 4-node loopback Slurm bed (tests/slurm_bed.py: Debian's slurmctld and four slurmd), a
torchrun job that starts, rendezvouses (gloo), all-reduces once and exits (tests/ddp_job.py
--steps 1), one rank per node. orch asks for the allocation (sbatch), waits for it, launches its
agents in one step, supervises, and gives the allocation back (scancel, waited until it has left
the queue); the peer is the line accelerate, nanotron and stas00's recipes write, which makes its
own allocation: `srun -N4 --ntasks-per-node=1 --exclusive --kill-on-bad-exit=1 sh -c 'torchrun
--node-rank=$SLURM_NODEID ...'`. Both alternate in one invocation, after a warm-up. Measured: the
launch latency, until every rank has printed its first line (its process group up), goal orch <=
1.2 x srun; and the time to the end, reported (orch's includes the allocation's cleanup, waited
until it has left the queue). Where orch's time goes (medians): `allocated_s` (sbatch to running:
Slurm schedules a batch job within `batch_sched_delay`, 3 s by default, where srun's allocation is
immediate) and `startup_s` (orch up's own count, allocation to every agent running).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, write

sys.path.insert(0, str(REPO))

JOB = str(REPO / "tests" / "ddp_job.py")
SRUN = ["srun", "--ntasks-per-node=1", "--exclusive", "--kill-on-bad-exit=1"]
"""The recipes' srun line (stas00's SRUN_ARGS, nanotron's one task per node), making its own allocation."""
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 nodes, one repetition")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.reps = 2, 1
    from tests.ports import job_port
    from tests.slurm_bed import SlurmBed, why_no_slurm

    why = why_no_slurm()
    if why:
        raise SystemExit(f"slurm_launch: {why}")
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp, SlurmBed(n=args.nodes) as bed:
        port = job_port()
        inv = Path(tmp) / "bed.yaml"
        inv.write_text(
            yaml.safe_dump(
                {
                    "name": "bed",
                    "transport": "slurm",
                    "slurm": {"nodes": args.nodes},
                    "master": {"port": port},
                    "env": ENV,
                    "job": {
                        "python": sys.executable,
                        "workdir": "/tmp",
                        "nproc_per_node": 1,
                        "script": JOB,
                        "args": {"steps": 1, "sleep": 0},
                        "run_root": str(Path(tmp) / "nodes"),
                    },
                }
            )
        )
        exports = " ".join(f"{k}={v}" for k, v in ENV.items())
        line = (
            f"cd /tmp && exec env {exports} {sys.executable} -m torch.distributed.run --nnodes={args.nodes} "
            f"--nproc-per-node=1 --node-rank=$SLURM_NODEID --master-addr=127.0.0.1 --master-port={port} "
            f"--max-restarts=0 {JOB} --steps 1 --sleep 0"
        )
        home = Path(tmp) / "orch-home"
        sides = {
            "orch_up": [sys.executable, "-m", "orchestrator", "up", str(inv), "--skip-checks"],
            "srun_torchrun": [*SRUN, f"--nodes={args.nodes}", "sh", "-c", line],
        }
        env = bed.client_env({"ORCH_HOME": str(home), "NO_COLOR": "1"})
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        phases: list[dict[str, float]] = []
        for i in range(1 + args.reps):  # a warm-up round, then alternating rounds
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                up_s, total_s, said = launched(sides[name], env, args.nodes, cwd=bed.workdir)
                if i:
                    samples[name].append((up_s, total_s))
                    if name == "orch_up":
                        phases.append(orch_phases(home, said))
    up = {name: statistics.median(u for u, _t in s) for name, s in samples.items()}
    total = {name: statistics.median(t for _u, t in s) for name, s in samples.items()}
    o, s_ = up["orch_up"], up["srun_torchrun"]
    breakdown = {k: statistics.median(ph[k] for ph in phases) for k in phases[0]}
    print(
        f"slurm_launch: {args.nodes} nodes: every rank up after {o:.2f}s (orch up) vs {s_:.2f}s (srun), ratio "
        f"{o / s_:.2f}; to the end {total['orch_up']:.2f}s vs {total['srun_torchrun']:.2f}s; orch phases (median s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in breakdown.items())
    )
    result = {
        "nodes": args.nodes,
        "samples_s": {name: [{"up_s": u, "total_s": t} for u, t in s] for name, s in samples.items()},
        "up_median_s": up,
        "total_median_s": total,
        "orch_phases_s": breakdown,
        "orch_phases_samples": phases,
        "summary": [
            {
                "what": f"every rank up: orch up --skip-checks (slurm) vs a hand-written srun, {args.nodes} nodes",
                "orch": o,
                "peer": s_,
                "ratio": o / s_,
                "goal": "<= 1.2",
                "met": o / s_ <= 1.2,
            },
            {
                "what": f"to the end (allocation given back): orch up vs srun, {args.nodes} nodes",
                "orch": total["orch_up"],
                "peer": total["srun_torchrun"],
                "ratio": total["orch_up"] / total["srun_torchrun"],
                "goal": "report",
                "met": None,
            },
        ],
    }
    write("slurm_launch", result)
    return result


UP = re.compile(r"\bup world=\d+")
"""tests/ddp_job.py's first line on every rank, once its process group is up."""


def launched(argv: list[str], env: dict[str, str], ranks: int, cwd: Path) -> tuple[float, float, str]:
    """Run a launch to its end: (seconds until every rank said it is up, seconds to the end, stderr).
    SystemExit with its output when it fails or a rank never said it."""
    start = time.perf_counter()
    up_at = None
    seen = 0
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        out = []
        for line in proc.stdout:
            out.append(line)
            seen += bool(UP.search(line))
            if up_at is None and seen == ranks:
                up_at = time.perf_counter() - start
        code = proc.wait(600)
        total = time.perf_counter() - start
        err.seek(0)
        said = err.read()
    if code or up_at is None:
        raise SystemExit(
            f"slurm_launch: {argv[0]} exited {code}, {seen} of {ranks} ranks up:\n{''.join(out[-20:])}{said[-3000:]}"
        )
    return up_at, total, said


def orch_phases(home: Path, said: str) -> dict[str, float]:
    """The latest `orch up`'s wait for its allocation (what it said) and its own start-up count (run.json)."""
    run_id = (home / "latest").read_text().strip()
    data = json.loads((home / "runs" / run_id / "run.json").read_text())
    waited = re.search(r"is running \(after ([\d.]+) s\)", said)
    return {"allocated_s": float(waited.group(1)) if waited else 0.0, "startup_s": float(data["startup_s"])}


if __name__ == "__main__":
    main()
