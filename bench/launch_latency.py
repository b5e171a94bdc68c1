"""Launch latency: `orch up --skip-checks` against pdsh launching the same torchrun commands.

On 4 real sshd nodes (loopback), a torchrun job that starts, rendezvouses (gloo), all-reduces
once and exits (tests/ddp_job.py --steps 1). The peer is how DeepSpeed's launcher does it:
`pdsh -S -f 1024 -w <hosts> 'export ...; cd ...; python -m torch.distributed.run --node-rank=%n ...'`.
Both sides run alternately in one invocation. Goal: orch <= 1.3 x pdsh; the overhead per node
((orch - pdsh) / N) is reported, and where orch's time goes (medians over the measured runs):
`startup_s` (orch up's own count, inventory to every node running), `job_s` (the agents' first
start to their last exit), `tail_s` (the last node's exit to `orch up` returning: noticing the
end, draining the logs, closing). A failed launch is reported with the tail of its output.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, side_by_side, write

sys.path.insert(0, str(REPO))

JOB = str(REPO / "tests" / "ddp_job.py")
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 nodes x 1 process, one repetition")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.nproc, args.reps = 2, 1, 1
    if shutil.which("pdsh") is None:
        raise SystemExit("launch_latency: pdsh is not installed (apt-get install pdsh)")
    from bench.check_fanout import ssh_config
    from tests.cluster import KeyStore, TestCluster
    from tests.ports import job_port

    with (
        tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp,
        TestCluster(KeyStore(Path(tmp) / "keys"), n=args.nodes, mode="loopback", root=Path(tmp) / "c") as cluster,
    ):
        port = job_port()
        inv = cluster.write_inventory(
            env=ENV,
            master={"port": port},
            job={
                "workdir": "/tmp",
                "nproc_per_node": args.nproc,
                "module": None,
                "script": JOB,
                "args": {"steps": 1, "sleep": 0},
            },
        )
        cfg = ssh_config(cluster, Path(tmp) / "ssh_config")
        hosts = ",".join(n.name for n in cluster.nodes)
        exports = "; ".join(f"export {k}={shlex.quote(v)}" for k, v in ENV.items())
        remote = (
            f"{exports}; cd /tmp; {shlex.quote(sys.executable)} -m torch.distributed.run --nnodes={args.nodes} "
            f"--nproc-per-node={args.nproc} --node-rank=%n --master-addr={cluster.nodes[0].addr} "
            f"--master-port={port} --max-restarts=0 {JOB} --steps 1 --sleep 0"
        )
        env = {
            **os.environ,
            "PDSH_RCMD_TYPE": "ssh",
            "PDSH_SSH_ARGS": f"-F {cfg} %h",
            "ORCH_HOME": str(Path(tmp) / "orch-home"),
        }
        codes: dict[str, list[int]] = {"orch_up": [], "pdsh_torchrun": []}
        phases: list[dict[str, float]] = []
        failures: list[str] = []

        def orch() -> None:
            p = subprocess.run(
                [sys.executable, "-m", "orchestrator", "up", str(inv), "--skip-checks"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=600,
            )
            ended = time.time()
            codes["orch_up"].append(p.returncode)
            if p.returncode:
                failures.append(f"orch up exited {p.returncode}:\n" + "\n".join(p.stderr.splitlines()[-30:]))
            else:
                phases.append(orch_phases(Path(env["ORCH_HOME"]), ended))

        def pdsh() -> None:
            p = subprocess.run(
                ["pdsh", "-S", "-f", "1024", "-w", hosts, remote],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                timeout=600,
            )
            codes["pdsh_torchrun"].append(p.returncode)
            if p.returncode:
                failures.append(f"pdsh exited {p.returncode}:\n" + "\n".join(p.stderr.splitlines()[-30:]))

        times = side_by_side({"orch_up": orch, "pdsh_torchrun": pdsh}, reps=args.reps, warmup=1)
    if any(codes["orch_up"]) or any(codes["pdsh_torchrun"]):
        raise SystemExit(f"launch_latency: a launch failed: exit codes {codes}\n" + "\n\n".join(failures))
    o, p = times["orch_up"]["median_s"], times["pdsh_torchrun"]["median_s"]
    measured = phases[-args.reps :]  # the warm-up run is not measured
    breakdown = {k: statistics.median(ph[k] for ph in measured) for k in measured[0]}
    print(
        f"launch_latency: {args.nodes} nodes x {args.nproc}: orch up {o:.2f}s, pdsh {p:.2f}s, ratio {o / p:.2f}, "
        f"overhead {(o - p) / args.nodes * 1000:.0f} ms/node; orch phases (median s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in breakdown.items())
    )
    result = {
        "nodes": args.nodes,
        "nproc_per_node": args.nproc,
        "times": times,
        "exit_codes": codes,
        "orch_phases_s": breakdown,
        "orch_phases_samples": measured,
        "overhead_ms_per_node": (o - p) / args.nodes * 1000,
        "summary": [
            {
                "what": f"orch up --skip-checks vs pdsh torchrun, {args.nodes} nodes x {args.nproc}",
                "orch": o,
                "peer": p,
                "ratio": o / p,
                "goal": "<= 1.3",
                "met": o / p <= 1.3,
            }
        ],
    }
    write("launch_latency", result)
    return result


def orch_phases(home: Path, ended: float) -> dict[str, float]:
    """Where the latest `orch up` spent its time, from its run.json (this machine's clock throughout)."""
    run_id = (home / "latest").read_text().strip()
    data = json.loads((home / "runs" / run_id / "run.json").read_text())
    started = min(n["started_at"] for n in data["nodes"])
    finished = max(n["finished_at"] for n in data["nodes"])
    return {"startup_s": float(data["startup_s"]), "job_s": finished - started, "tail_s": ended - finished}


if __name__ == "__main__":
    main()
