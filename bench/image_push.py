"""Image push: `orch image push` to N nodes against the serial loop people write without a registry,
`for node in ...; do podman save IMAGE | ssh node podman load; done`, on N real sshd nodes
(loopback), each with a podman image store of its own (tests/containers.py: the test image, a
Debian base system of about 340 MB built offline once and cached).

Before every sample each node's store is emptied (not timed), so both sides send the whole image
to every node. Sides run alternately, a warm-up first. orch exports the image once and streams it
to the nodes `--parallel` at once, and checks each node's image ID before and after; the loop
exports once per node and checks nothing. Goal: orch no slower than the loop at N = 4 (on this
2-core machine the nodes' `podman load` share the cores, so the gain is the single export and the
overlap of transfer and unpacking, not N-fold).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, timed, write

sys.path.insert(0, str(REPO))

SIDES = ("orch_image_push", "serial_save_ssh_load")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--parallel", type=int, default=4, help="orch image push --parallel")
    ap.add_argument("--quick", action="store_true", help="2 nodes, one repetition, no warm-up (a dry run)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.reps = 2, 1
    from bench.check_fanout import ssh_config
    from tests.cluster import KeyStore, TestCluster
    from tests.containers import IMAGE, PODMAN, PodmanStore, seed_store, short_dir, why_no_podman

    why = why_no_podman()
    if why:
        raise SystemExit(f"image_push: {why}")
    seed, image_id = seed_store(log=lambda line: print(f"image_push: {line}", flush=True))
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    base = short_dir("b")
    try:
        with (
            tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp,
            TestCluster(KeyStore(Path(tmp) / "keys"), n=args.nodes, mode="loopback", root=Path(tmp) / "c") as cluster,
        ):
            stores = {}
            for node in cluster.nodes:
                stores[node.name] = PodmanStore(base / node.name)
                cluster.set_env(node.name, **stores[node.name].env)
            inv = cluster.write_inventory()
            cfg = ssh_config(cluster, Path(tmp) / "ssh_config")
            env = {**os.environ, **seed.env, "ORCH_HOME": str(Path(tmp) / "orch-home"), "NO_COLOR": "1"}

            def empty_stores() -> None:
                for node in cluster.nodes:
                    enter = cluster._enter(node)
                    stores[node.name].podman("rmi", "-a", "-f", enter=enter)
                    assert stores[node.name].image_id(IMAGE, enter=enter) is None

            def held_everywhere() -> None:
                wrong = {n.name: stores[n.name].image_id(IMAGE, enter=cluster._enter(n)) for n in cluster.nodes}
                wrong = {k: v for k, v in wrong.items() if v != image_id}
                if wrong:
                    raise SystemExit(f"image_push: nodes without the image after a side: {wrong}")

            def orch() -> None:
                p = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "orchestrator",
                        "image",
                        "push",
                        IMAGE,
                        str(inv),
                        "--runtime",
                        "podman",
                        "--parallel",
                        str(args.parallel),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                if p.returncode != 0:
                    raise SystemExit(f"image_push: orch image push exited {p.returncode}: {p.stdout}{p.stderr}")

            def loop() -> None:
                for node in cluster.nodes:
                    line = (
                        f"{PODMAN} save {shlex.quote(IMAGE)} | ssh -F {shlex.quote(str(cfg))} {node.name} {PODMAN} load"
                    )
                    p = subprocess.run(["/bin/sh", "-c", line], env=env, capture_output=True, text=True, timeout=1800)
                    if p.returncode != 0:
                        raise SystemExit(f"image_push: {line} exited {p.returncode}: {p.stderr[-2000:]}")

            sides = {"orch_image_push": orch, "serial_save_ssh_load": loop}
            for i in range(args.reps + (0 if args.quick else 1)):
                order = list(SIDES) if i % 2 == 0 else list(reversed(SIDES))
                for side in order:
                    empty_stores()
                    took = timed(sides[side])
                    held_everywhere()
                    if i > 0 or args.quick:  # round 0 is the warm-up
                        samples[side].append(took)
                    print(f"image_push: {side} {args.nodes} nodes: {took:.2f} s", flush=True)
            empty_stores()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    times = {
        s: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "samples_s": v}
        for s, v in samples.items()
    }
    o, p = times["orch_image_push"]["median_s"], times["serial_save_ssh_load"]["median_s"]
    size = int(
        subprocess.run(
            [PODMAN, "image", "inspect", "--format", "{{.Size}}", IMAGE],
            env={**os.environ, **seed.env},
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        or 0
    )
    print(
        f"image_push: {args.nodes} nodes, image {size / 1e6:.0f} MB: orch {o:.2f} s, serial loop {p:.2f} s, "
        f"ratio {o / p:.2f}",
        flush=True,
    )
    result = {
        "nodes": args.nodes,
        "parallel": args.parallel,
        "image_bytes": size,
        "times": times,
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "summary": [
            {
                "what": f"orch image push vs serial podman save | ssh load, {args.nodes} nodes",
                "orch": o,
                "peer": p,
                "ratio": o / p,
                "goal": "<= 1.0",
                "met": o <= p,
            }
        ],
    }
    write("image_push.quick" if args.quick else "image_push", result)
    return result


if __name__ == "__main__":
    main()
