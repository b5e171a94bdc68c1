"""Broadcast: `orch sync` of a tree and `orch image push` of an image to N nodes against the same
to one node, on the broadcast bed (issue 51): network-namespace nodes behind a bridge where every
port runs at `--rate` both ways, the controller's uplink one port like the others, and each node's
target paths and podman store on a private tmpfs (tests/cluster.py `rate`, `tmpfs`;
tests/containers.py `on_node`), so N nodes receive and hold N copies.

- sync: a tree of `--files` files of random bytes, `--sync-mb` in all, in the controller's
  `NODE_LOCAL` (a path every node sees empty), as `job.sync`; `orch sync INVENTORY`.
- image: an image of one layer of random bytes (`--image-mb`), imported offline into a podman store
  of the controller's (`podman import` of a tarball, no base image, no registry); `orch image push
  IMAGE INVENTORY --runtime podman` into each node's empty store.

Before every sample each node's target is emptied (the tree removed, `podman rmi -a`), not timed;
after it each node's copy is checked (every file's sha256; the image ID and the bytes on the node's
tmpfs), not timed. Node counts alternate (1, 8, 16, then 16, 8, 1, ...), after a warm-up at one
node. Reported per command and method: the median seconds at each N, and N nodes / 1 node; with the
floor of a star, N x bytes / rate (one uplink carries every copy) beside it.

`--methods` chooses how the payload travels (`METHODS`): `star`, orch's direct copy
(`--method direct`: the controller sends every node its own copy), and `chain` (`--method chain`:
one copy from the controller, relayed node to node). A method is a function from the command, the
inventory and the bed to orch's command line; each has its column in the same run, the methods
alternating within each round. Every N-node median is reported against the same method's one-node
median and against the star's one-node median (one node by a direct copy: what `--method auto`
does for one node), which is the issue's "N nodes / 1 node".
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import REPO, write

sys.path.insert(0, str(REPO))

MB = 1_000_000
COMMANDS = ("sync", "image")
IMAGE_REF = "localhost/orch-bcast:payload"
ORCH = [sys.executable, "-m", "orchestrator"]


@dataclass
class Bed:
    """What every sample shares: the cluster, the payloads, an inventory per node count."""

    cluster: Any
    podman: Any
    tree: Path
    files: dict[str, str]
    """Every file of the tree (relative path) and its sha256."""
    image_id: str
    image_bytes: int
    env: dict[str, str]
    parallel: int | None
    inventories: dict[int, Path] = field(default_factory=dict)

    def names(self, n: int) -> list[str]:
        return [node.name for node in self.cluster.nodes[:n]]


Method = Callable[[str, Path, Bed], list[str]]


def star(command: str, inventory: Path, bed: Bed) -> list[str]:
    """The direct copy: the controller sends each node its own copy (rsync per node; the image
    streamed into `podman load` per node, `--parallel` at once)."""
    if command == "sync":
        return [*ORCH, "sync", str(inventory), "--method", "direct"]
    parallel = ["--parallel", str(bed.parallel)] if bed.parallel is not None else []
    return [*ORCH, "image", "push", IMAGE_REF, str(inventory), "--runtime", "podman", "--method", "direct", *parallel]


def chain(command: str, inventory: Path, bed: Bed) -> list[str]:
    """The copy chain: one copy from the controller into the first node, each node writing what it
    receives (the files, or its `podman load`) and forwarding it to the next."""
    if command == "sync":
        return [*ORCH, "sync", str(inventory), "--method", "chain"]
    return [*ORCH, "image", "push", IMAGE_REF, str(inventory), "--runtime", "podman", "--method", "chain"]


METHODS: dict[str, Method] = {"star": star, "chain": chain}
GOALS = {("chain", 8): "<= 1.3 (issue 51)", ("chain", 16): "<= 1.5 (issue 51)"}
"""The issue's goals for the chain: N nodes against one node."""


def make_tree(root: Path, total: int, files: int, seed: int = 0) -> dict[str, str]:
    """`files` files of random bytes (incompressible, as images and datasets mostly are), `total`
    bytes in all, in two folders; their relative paths and sha256."""
    rng = random.Random(seed)
    out = {}
    for i in range(files):
        rel = f"part{i % 2}/shard-{i:02d}.bin"
        size = total // files + (total % files if i == files - 1 else 0)
        data = rng.randbytes(size)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        out[rel] = hashlib.sha256(data).hexdigest()
    return out


def make_image(store: Any, work: Path, total: int, seed: int = 1) -> tuple[str, int]:
    """IMAGE_REF in `store`: one layer holding `total` random bytes (`podman import` of a tarball:
    offline, as tests/containers.py builds its image); its ID and size as podman counts it."""
    rootfs = work / "rootfs"
    (rootfs / "payload").mkdir(parents=True)
    (rootfs / "payload" / "blob.bin").write_bytes(random.Random(seed).randbytes(total))
    tarball = work / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True, timeout=120)
    image_id = store.import_rootfs(tarball, IMAGE_REF)
    size = int(store.podman("image", "inspect", "--format", "{{.Size}}", IMAGE_REF).stdout.strip())
    shutil.rmtree(rootfs)
    tarball.unlink()
    return image_id, size


def used_bytes(cluster: Any, node: str) -> int:
    fs = os.statvfs(cluster.node_path(node, cluster.NODE_LOCAL))
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def empty(command: str, bed: Bed, n: int) -> None:
    """Each of the first n nodes without the payload (not timed)."""
    for node in bed.names(n):
        if command == "sync":
            shutil.rmtree(bed.cluster.node_path(node, bed.tree), ignore_errors=True)
            if bed.cluster.node_path(node, bed.tree).exists():
                raise SystemExit(f"broadcast: {node} still holds {bed.tree}")
        else:
            bed.podman.podman(node, "rmi", "-a", "-f")
            if used_bytes(bed.cluster, node) > bed.image_bytes // 2:
                raise SystemExit(f"broadcast: {node}'s tmpfs holds {used_bytes(bed.cluster, node)} bytes after rmi -a")


def verify(command: str, bed: Bed, n: int) -> None:
    """Each of the first n nodes holds the whole payload (not timed): a wrong copy fails the run."""
    for node in bed.names(n):
        if command == "sync":
            for rel, digest in bed.files.items():
                path = bed.cluster.node_path(node, bed.tree / rel)
                got = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "missing"
                if got != digest:
                    raise SystemExit(f"broadcast: {node}:{bed.tree / rel} is {got}, not {digest}")
        else:
            held = bed.podman.image_id(node, IMAGE_REF)
            if held != bed.image_id:
                raise SystemExit(f"broadcast: {node} holds {held} as {IMAGE_REF}, not {bed.image_id}")
            if used_bytes(bed.cluster, node) < bed.image_bytes:
                raise SystemExit(f"broadcast: {node}'s tmpfs holds less than the image's {bed.image_bytes} bytes")


def run_orch(argv: Sequence[str], env: dict[str, str]) -> dict[str, Any]:
    """orch's command with `--json` (both methods alike); what it says of the copy: the relays'
    start, the slowest node's seconds, the chain's notes (drops, moves, resent chunks)."""
    proc = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"broadcast: `{' '.join(argv)}` exited {proc.returncode}: {proc.stdout[-3000:]}{proc.stderr}")
    doc = json.loads(proc.stdout)
    chain = doc.get("chain") or {}
    return {
        "method": doc.get("method"),
        "start_s": chain.get("start_s"),
        "slowest_node_s": max((n["elapsed_s"] for n in doc["nodes"]), default=None),
        "notes": chain.get("notes", []),
    }


Samples = dict[str, dict[str, dict[int, list[Any]]]]


def measure(
    bed: Bed, commands: Sequence[str], methods: Sequence[str], counts: Sequence[int], reps: int, warmup: bool
) -> tuple[Samples, Samples]:
    """samples[command][method][n] = seconds, alternating the node counts (and the methods) each
    round; and beside each, what orch said of it (`run_orch`)."""
    samples: Samples = {c: {m: {n: [] for n in counts} for m in methods} for c in commands}
    details: Samples = {c: {m: {n: [] for n in counts} for m in methods} for c in commands}
    for command in commands:
        rounds = [(counts[:1], False)] if warmup else []
        for i in range(reps):
            rounds.append((list(counts) if i % 2 == 0 else list(reversed(counts)), True))
        for i, (order, kept) in enumerate(rounds):
            for n in order:
                for method in methods if i % 2 == 0 else list(reversed(methods)):
                    argv = METHODS[method](command, bed.inventories[n], bed)
                    empty(command, bed, n)
                    start = time.perf_counter()
                    said = run_orch(argv, bed.env)
                    took = time.perf_counter() - start
                    verify(command, bed, n)
                    if kept:
                        samples[command][method][n].append(took)
                        details[command][method][n].append(said)
                    tag = "" if kept else " (warm-up)"
                    parts = [f"relays {said['start_s']:.2f} s"] if said["start_s"] is not None else []
                    parts += [f"slowest node {said['slowest_node_s']:.2f} s"] if said["slowest_node_s"] else []
                    parts += said["notes"]
                    extra = f" ({'; '.join(parts)})" if parts else ""
                    print(f"broadcast: {command} {method} {n} node(s): {took:.2f} s{tag}{extra}", flush=True)
            empty(command, bed, max(counts))
    return samples, details


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,8,16", help="node counts, the first 1 (the ratios' base)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"of {', '.join(COMMANDS)}")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"of {', '.join(METHODS)}")
    ap.add_argument("--sync-mb", type=float, default=40, help="the tree's size (MB)")
    ap.add_argument("--files", type=int, default=4, help="the tree's files")
    ap.add_argument("--image-mb", type=float, default=30, help="the image's layer (MB)")
    ap.add_argument("--rate", default="100mbit", help="every port's rate, both ways (tc tbf)")
    ap.add_argument("--parallel", type=int, help="orch image push --parallel (default: orch's own)")
    ap.add_argument("--reps", type=int, default=3, help="rounds over every node count, after a warm-up")
    ap.add_argument("--quick", action="store_true", help="1 and 2 nodes, 4 MB and 3 MB, one round, no warm-up")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.sync_mb, args.image_mb, args.reps = "1,2", 4, 3, 1
    counts = [int(x) for x in args.nodes.split(",")]
    commands = args.commands.split(",")
    methods = args.methods.split(",")
    for given, known, what in ((commands, COMMANDS, "command"), (methods, tuple(METHODS), "method")):
        unknown = [x for x in given if x not in known]
        if unknown:
            ap.error(f"unknown {what}(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    if counts[0] != 1 or any(n < 1 for n in counts) or len(set(counts)) != len(counts):
        ap.error(f"--nodes {args.nodes}: distinct counts, the first 1 (N nodes / 1 node is the ratio)")

    from tests.cluster import KeyStore, TestCluster, leftovers, netns_supported
    from tests.containers import PodmanStore, short_dir, start_podman_bed

    why = netns_supported()
    if why is None and "image" in commands and shutil.which("podman", path="/usr/bin:/usr/sbin:/bin") is None:
        why = "the image side needs podman (.ci/packages)"
    if why:
        raise SystemExit(f"broadcast: {why}")
    sync_bytes, image_bytes = int(args.sync_mb * MB), int(args.image_mb * MB)
    # each node's tmpfs: the tree, the image, podman load's staged copy of it, and room
    tmpfs = f"{(sync_bytes + 3 * image_bytes) // (1 << 20) + 64}m"
    conf = short_dir("bc")
    started = time.monotonic()
    load = [os.getloadavg()[0]]
    try:
        with (
            tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp,
            TestCluster(
                KeyStore(Path(tmp) / "keys"),
                n=max(counts),
                mode="netns",
                root=Path(tmp) / "c",
                rate=args.rate,
                tmpfs=tmpfs,
            ) as cluster,
        ):
            print(f"broadcast: {max(counts)} nodes up in {time.monotonic() - started:.1f} s", flush=True)
            tree = cluster.controller_dir("tree")
            files = make_tree(tree, sync_bytes, args.files)
            controller = PodmanStore(conf / "controller")
            image_id, size = make_image(controller, Path(tmp), image_bytes) if "image" in commands else ("", 0)
            podman = start_podman_bed(cluster, None, conf / "nodes", on_node=True) if "image" in commands else None
            env = {**os.environ, **controller.env, "ORCH_HOME": str(Path(tmp) / "orch-home"), "NO_COLOR": "1"}
            bed = Bed(cluster, podman, tree, files, image_id, size, env, args.parallel)
            for n in counts:
                bed.inventories[n] = cluster.write_inventory(
                    Path(tmp) / f"inventory-{n}.yaml", only=bed.names(n), job={"sync": [str(tree)]}
                )
            samples, details = measure(bed, commands, methods, counts, args.reps, warmup=not args.quick)
            if podman is not None:
                podman.remove_all()
    finally:
        shutil.rmtree(conf, ignore_errors=True)
    wall = time.monotonic() - started
    load.append(os.getloadavg()[0])
    left = leftovers()
    if left:
        raise SystemExit(f"broadcast: left behind: {left}")
    payload = {"sync": sync_bytes, "image": size}
    return report(args, counts, commands, methods, samples, details, payload, wall, load)


def report(
    args: argparse.Namespace,
    counts: Sequence[int],
    commands: Sequence[str],
    methods: Sequence[str],
    samples: Samples,
    details: Samples,
    payload: dict[str, int],
    wall: float,
    load: list[float],
) -> dict[str, Any]:
    bits_per_s = rate_bits(args.rate)
    times: dict[str, Any] = {}
    summary = []
    label = {"sync": f"orch sync of {args.sync_mb:g} MB ({args.files} files)", "image": "orch image push of a "}
    label["image"] += f"{payload['image'] / MB:.0f} MB image (podman)"
    for command in commands:
        times[command] = {}
        medians = {m: {n: statistics.median(samples[command][m][n]) for n in counts} for m in methods}
        base = medians["star"][1] if "star" in methods else None
        for method in methods:
            med = medians[method]
            times[command][method] = {
                str(n): {
                    "median_s": med[n],
                    "min_s": min(samples[command][method][n]),
                    "max_s": max(samples[command][method][n]),
                    "samples_s": samples[command][method][n],
                    "samples_said": details[command][method][n],
                    "star_floor_s": n * payload[command] * 8 / bits_per_s,
                    "one_copy_s": payload[command] * 8 / bits_per_s,
                    "ratio_to_1": med[n] / med[1],
                    "ratio_to_star_1": med[n] / base if base else None,
                }
                for n in counts
            }
            line = ", ".join(f"{n}: {med[n]:.2f} s ({med[n] / med[1]:.2f}x)" for n in counts)
            against = ""
            if base:
                against = f"; against one node by the star: {', '.join(f'{med[n] / base:.2f}x' for n in counts)}"
            print(f"broadcast: {command} {method}, {args.rate} ports: {line}{against}", flush=True)
            for n in counts[1:]:
                goal = GOALS.get((method, n), "report")
                summary.append(
                    {
                        "what": f"{label[command]}, {method}, {n} nodes / 1 node (the same method), {args.rate} ports",
                        "orch": med[n],
                        "peer": med[1],
                        "ratio": med[n] / med[1],
                        "goal": goal,
                    }
                )
                if base and method != "star":
                    summary.append(
                        {
                            "what": f"{label[command]}, {method}, {n} nodes / 1 node by the star, {args.rate} ports",
                            "orch": med[n],
                            "peer": base,
                            "ratio": med[n] / base,
                            "goal": goal,
                        }
                    )
    print(
        f"broadcast: the whole run took {wall:.0f} s; load average {load[0]:.1f} at its start, {load[1]:.1f} at its end"
    )
    result = {
        "nodes": list(counts),
        "rate": args.rate,
        "payload_bytes": payload,
        "files": args.files,
        "parallel": args.parallel,
        "reps": args.reps,
        "times": times,
        "wall_s": wall,
        "load_average": {"start": load[0], "end": load[1]},
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "summary": summary,
    }
    write("broadcast.quick" if args.quick else "broadcast", result)
    return result


def rate_bits(rate: str) -> float:
    """A tc rate (100mbit, 1gbit, 12.5mbps) in bits per second."""
    text = rate.lower()
    unit = 8 if text.endswith("bps") else 1
    number = text.removesuffix("bps").removesuffix("bit")
    scale = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.get(number[-1:], 1)
    return float(number.rstrip("kmgt")) * scale * unit


if __name__ == "__main__":
    main()
