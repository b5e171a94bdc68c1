"""Launch latency in containers: `orch up` of a job inside podman containers against the same job
bare on the same nodes, in one invocation.

On N real sshd nodes (loopback), each with a podman store of its own holding the test image
(tests/containers.py: a Debian base system built offline once and cached; the job's Python
environment bind-mounted, as users mount their code), a torchrun job that starts, rendezvouses
(gloo), all-reduces once and exits (tests/ddp_job.py --steps 1). The two inventories differ only
in `job.container`. Sides run alternately after a warm-up, each `orch up --skip-checks` (the
launch itself), and with `--checks` also a pair with the preflight (the container check starts
throw-away containers of its own). Goal: container <= 1.2 x bare. The containers get a CPU
cgroup each (`CGROUP_PARENT`); a third side keeps podman's one shared group. Where the time goes (medians
over the measured runs, from run.json): `startup_s` (inventory to every node running), `job_s`
(the agents' first start to their last exit: in a container, podman's create and start and its
removal by the stop hook), `tail_s` (the last node's exit to `orch up` returning).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO, side_by_side, write
from bench.launch_latency import ENV, JOB, orch_phases

sys.path.insert(0, str(REPO))

GOAL = 1.2
CGROUP_PARENT = "/"
"""Where the measured containers' CPU cgroups go: each its own group at the top (cgroup v1 cpu, what
podman's cgroupfs manager makes of `--cgroup-parent=/`), as each bare process competes at the top.
podman's default puts every container of the machine in one group, libpod_parent, of the weight of
one process: beside other work on the machine (this one is shared; its processes are in the root
group) four nodes' containers then share one process's CPU, and the launch measured that, not
orch. The side `container_shared_group` keeps the default, to show it."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--checks", action="store_true", help="also a pair with the preflight (orch up without --skip-checks)"
    )
    ap.add_argument("--quick", action="store_true", help="2 nodes x 1 process, one repetition")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.nproc, args.reps = 2, 1, 1
    from tests.cluster import KeyStore, TestCluster
    from tests.containers import (
        IMAGE,
        PodmanBed,
        TestImage,
        python_mounts,
        sandbox_options,
        seed_store,
        short_dir,
        start_podman_bed,
        why_no_podman,
    )
    from tests.ports import job_port

    why = why_no_podman()
    if why:
        raise SystemExit(f"launch_latency_container: {why}")
    seed, image_id = seed_store(log=lambda line: print(f"launch_latency_container: {line}", flush=True))
    image = TestImage(tarball=Path(), store=seed, id=image_id)
    base = short_dir("l")
    bed: PodmanBed | None = None
    try:
        with (
            tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp,
            TestCluster(KeyStore(Path(tmp) / "keys"), n=args.nodes, mode="loopback", root=Path(tmp) / "c") as cluster,
        ):
            bed = start_podman_bed(cluster, image, base)
            job = {
                "workdir": "/tmp",
                "nproc_per_node": args.nproc,
                "module": None,
                "script": JOB,
                "args": {"steps": 1, "sleep": 0},
            }
            container = {
                "runtime": "podman",
                "image": IMAGE,
                "python": sys.executable,
                "user": "root",
                "mounts": [m for m in python_mounts(sys.executable) if m != "/tmp"],
                "options": sandbox_options(),
            }
            port = job_port()
            own = {**container, "options": [*container["options"], f"--cgroup-parent={CGROUP_PARENT}"]}
            invs = {
                "bare": cluster.write_inventory(Path(tmp) / "bare.yaml", env=ENV, master={"port": port}, job=job),
                "container": cluster.write_inventory(
                    Path(tmp) / "container.yaml", env=ENV, master={"port": port}, job={**job, "container": own}
                ),
                "container_shared_group": cluster.write_inventory(
                    Path(tmp) / "shared.yaml", env=ENV, master={"port": port}, job={**job, "container": container}
                ),
            }
            homes = {side: Path(tmp) / f"home-{side}" for side in invs}
            phases: dict[str, list[dict[str, float]]] = {side: [] for side in invs}
            failures: list[str] = []

            def up(side: str, *flags: str) -> Callable[[], None]:
                def run() -> None:
                    env = {**os.environ, "ORCH_HOME": str(homes[side]), "NO_COLOR": "1"}
                    p = subprocess.run(
                        [sys.executable, "-m", "orchestrator", "up", str(invs[side]), *flags],
                        env=env,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                        timeout=600,
                    )
                    ended = time.time()
                    if p.returncode:
                        failures.append(
                            f"{side} {' '.join(flags)}: orch up exited {p.returncode}:\n"
                            + "\n".join(p.stderr.splitlines()[-30:])
                        )
                    elif flags:
                        phases[side].append(orch_phases(homes[side], ended))

                return run

            times = side_by_side({side: up(side, "--skip-checks") for side in invs}, reps=args.reps, warmup=1)
            checked = (
                side_by_side({"container": up("container"), "bare": up("bare")}, reps=args.reps, warmup=0)
                if args.checks
                else None
            )
            left = bed.all_containers("orch.run")
    finally:
        if bed is not None:
            bed.remove_all()
        shutil.rmtree(base, ignore_errors=True)
    if failures:
        raise SystemExit("launch_latency_container: a launch failed\n" + "\n\n".join(failures))
    c, b = times["container"]["median_s"], times["bare"]["median_s"]
    breakdown = {
        side: {k: statistics.median(ph[k] for ph in samples[-args.reps :]) for k in samples[0]}
        for side, samples in phases.items()
    }
    what = f"orch up --skip-checks in podman containers vs bare, {args.nodes} nodes x {args.nproc}"
    summary = [{"what": what, "orch": c, "peer": b, "ratio": c / b, "goal": f"<= {GOAL}", "met": c / b <= GOAL}]
    cs = times["container_shared_group"]["median_s"]
    summary.append(
        {
            "what": f"the same, the containers in podman's one default CPU cgroup (libpod_parent), {args.nodes} "
            f"nodes x {args.nproc}",
            "orch": cs,
            "peer": b,
            "ratio": cs / b,
            "goal": "report",
            "met": None,
        }
    )
    if checked:
        cc, cb = checked["container"]["median_s"], checked["bare"]["median_s"]
        summary.append(
            {
                "what": f"orch up (preflight included) in podman containers vs bare, {args.nodes} nodes x {args.nproc}",
                "orch": cc,
                "peer": cb,
                "ratio": cc / cb,
                "goal": "report",
                "met": None,
            }
        )
    print(
        f"launch_latency_container: {args.nodes} nodes x {args.nproc}: container {c:.2f}s, bare {b:.2f}s, ratio "
        f"{c / b:.2f}; phases (median s): "
        + "; ".join(f"{side} " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items()) for side, ph in breakdown.items())
    )
    result = {
        "nodes": args.nodes,
        "nproc_per_node": args.nproc,
        "reps": args.reps,
        "times": times,
        "times_with_checks": checked,
        "phases_s": breakdown,
        "phases_samples": phases,
        "containers_left": left,
        "summary": summary,
    }
    write("launch_latency_container", result)
    return result


if __name__ == "__main__":
    main()
