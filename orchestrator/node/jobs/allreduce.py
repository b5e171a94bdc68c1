"""The `fabric` check's job: measure the collective path between nodes; torchrun runs it on every node.

    torchrun --nnodes N --nproc-per-node P ... fabric.py --backend gloo --max-bytes 256M

orch ships this file by source into each node's run directory and launches it like any job (node
agent, process group, teardown). It imports only torch and the standard library (torch inside
`Job`, so the controller imports this module for its constants and helpers without torch).
Backend: as given (orch passes the one the training will use: nccl on GPU nodes, gloo on CPU), or
auto: nccl when CUDA is available. Phases:

1. all_reduce sweep (1 MiB to --max-bytes, x4 steps): one validated op (every rank adds rank+1;
   wrong elements are counted, like nccl-tests' #wrong), warmup, then timed ops between a barrier
   and a device sync; a size's time is the max over ranks. algbw = size/time, busbw = algbw*2(n-1)/n.
   The iteration count adapts to --seconds-per-size and sizes that would overrun --budget-s are
   skipped (and reported as skipped), so a slow link cannot stretch the job without bound.
2. links: nodes are paired in round-robin rounds of disjoint pairs (every pair once per pass, two
   passes by default); in each pair data goes one way, then the other, timed by the receiver;
   local rank i of one node talks to local rank i of the other ("rails", all at once). Then,
   with --recheck-share, every pair of a node that looks slow (and the pair of a link that
   does), by the verdict's own rule (`link_verdict`), is measured again, one pair at a time, up to
   --recheck-passes times or until nothing looks slow: a host busy for a moment does not make a
   healthy node look slow. Every transfer is reported; the controller turns them into per-node
   rates (each direction's best) and names the slow node or link (orchestrator/preflight/fabric/busbw.py,
   with `link_verdict`), with the thresholds of the inventory. --link-trials N repeats this whole
   phase N times, each trial reported on its own (how the tests hold the verdict to being stable).
3. output: rank 0 prints one line ``ORCH_FABRIC_RESULT {json}`` on stdout (and, as it goes,
   ``ORCH_FABRIC_PROGRESS {json}`` lines on stderr: phase, size or round). Any failure prints
   ``ORCH_FABRIC_ERROR {json}`` (rank, host, node, phase, error) on stderr and exits 1;
   collectives time out after --timeout seconds, so a dead peer ends the job instead of hanging it.

Environment: torchrun's RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK (the node rank; without it nodes
are told apart by hostname, which two real nodes may share). ORCH_NODE, when set, names the node
in the output (else the hostname). NCCL_* / GLOO_* come from the inventory, as for the training.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

MARKER = "ORCH_FABRIC_RESULT"
ERROR_MARKER = "ORCH_FABRIC_ERROR"
PROGRESS_MARKER = "ORCH_FABRIC_PROGRESS"
SCHEMA = 1
MB = 1 << 20


# ----------------------------------------------------------------------------- pure helpers


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int = 4) -> list[int]:
    """Message sizes min, min*factor, ... up to max_bytes; each a multiple of 4 (float32)."""
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"bad sweep: min {min_bytes} B, max {max_bytes} B, factor {factor}")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size - size % 4)
        size *= factor
    return sizes


def bus_factor(n: int) -> float:
    """all_reduce's busbw/algbw ratio for n ranks (nccl-tests): 2(n-1)/n."""
    return 2.0 * (n - 1) / n


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair of n nodes once (circle method).

    n-1 rounds for even n, n rounds for odd n (one node sits each round out).
    """
    if n < 2:
        return []
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ids[i], ids[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return rounds


def pair_rates(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], float]:
    """GB/s of each direction (src node, dst node): every rail's best transfer over all passes,
    summed over the rails (the rails of a pair run at once)."""
    best: dict[tuple[int, int, int], float] = {}
    for r in records:
        key = (int(r["src_node"]), int(r["dst_node"]), int(r["rail"]))
        best[key] = max(best.get(key, 0.0), float(r["gbps"]))
    pair: dict[tuple[int, int], float] = {}
    for (src, dst, _rail), value in sorted(best.items()):
        pair[(src, dst)] = pair.get((src, dst), 0.0) + value
    return pair


def link_verdict(
    pair: Mapping[tuple[int, int], float], nodes: Sequence[int], share: float
) -> tuple[dict[str, dict[int, float]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(capacities, slow nodes, slow links) of the pairwise rates: the fabric check's verdict,
    which the job also uses to choose what to measure again.

    A node's send (recv) capacity is its best outgoing (incoming) pair: one healthy peer shows what
    the node can do, so a node is slow only when every one of its pairs is. Slow: capacity below
    share x the median capacity over nodes (3 nodes or more). A link (one direction) is slow when it
    is below share x what both its ends reach elsewhere; links from a node slow at sending, or to
    one slow at receiving, are that node's finding. With 2 nodes only a direction can be named.
    """
    outgoing = {n: [v for (s, _), v in pair.items() if s == n] for n in nodes}
    incoming = {n: [v for (_, d), v in pair.items() if d == n] for n in nodes}
    caps = {
        "send": {n: max(v) for n, v in outgoing.items() if v},
        "recv": {n: max(v) for n, v in incoming.items() if v},
    }
    slow_nodes: list[dict[str, Any]] = []
    slow_links: list[dict[str, Any]] = []
    if len(nodes) >= 3:
        for direction, by_node in caps.items():
            if not by_node:
                continue
            ordered = sorted(by_node.values())
            mid = len(ordered) // 2
            median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            for n, value in by_node.items():
                if value < share * median:
                    slow_nodes.append({"node": n, "direction": direction, "gbps": value, "median_gbps": median})
        slow_send = {x["node"] for x in slow_nodes if x["direction"] == "send"}
        slow_recv = {x["node"] for x in slow_nodes if x["direction"] == "recv"}
        for (s, d), v in sorted(pair.items()):
            if s in slow_send or d in slow_recv:
                continue  # explained by a slow end: its pairs vary with the bucket, not the link
            bound = min(caps["send"][s], caps["recv"][d])
            if v < share * bound:
                slow_links.append({"src_node": s, "dst_node": d, "gbps": v, "expected_gbps": bound})
    elif len(nodes) == 2:
        a, b = nodes
        ab, ba = pair.get((a, b)), pair.get((b, a))
        if ab is not None and ba is not None:
            for (s, d), v, other in (((a, b), ab, ba), ((b, a), ba, ab)):
                if v < share * other:
                    slow_links.append({"src_node": s, "dst_node": d, "gbps": v, "expected_gbps": other})
    return caps, slow_nodes, slow_links


def recheck_pairs(records: Sequence[Mapping[str, Any]], nodes: Sequence[int], share: float) -> list[tuple[int, int]]:
    """The node pairs to measure again before a verdict: every pair of a node the rates so far
    call slow, and the pair of every slow link. A node or link that is slow only for a moment (a
    busy host) gets better numbers; one that is slow stays slow."""
    _caps, slow_nodes, slow_links = link_verdict(pair_rates(records), nodes, share)
    pairs = {(min(x["src_node"], x["dst_node"]), max(x["src_node"], x["dst_node"])) for x in slow_links}
    for x in slow_nodes:
        pairs |= {(min(x["node"], n), max(x["node"], n)) for n in nodes if n != x["node"]}
    return sorted(pairs)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The job's options (defaults keep 4 CPU nodes well under 20 s at --max-bytes 64 MB)."""
    p = argparse.ArgumentParser(
        prog="fabric.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr 10.0.0.1 "
        "--master-port 29500 fabric.py --max-bytes 268435456",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="auto: nccl when CUDA is available, else gloo (default: auto)",
    )
    p.add_argument("--min-bytes", type=parse_size, default=MB, help="smallest all_reduce size (default 1M)")
    p.add_argument(
        "--max-bytes",
        type=parse_size,
        default=256 * MB,
        help="largest all_reduce size, e.g. 64M or 268435456 (default 256M = 256 MiB)",
    )
    p.add_argument("--factor", type=int, default=4, help="size step (default x4)")
    p.add_argument("--warmup", type=int, default=1, help="untimed ops per size after the validated one")
    p.add_argument("--iters", type=int, default=20, help="most timed ops per size (default 20)")
    p.add_argument(
        "--seconds-per-size",
        type=float,
        default=0.5,
        help="aim for this much timed work per size (fewer iterations for slow sizes)",
    )
    p.add_argument(
        "--budget-s", type=float, default=30.0, help="skip sweep sizes that would end the sweep after this many seconds"
    )
    p.add_argument(
        "--link-bytes",
        type=parse_size,
        default=64 * MB,
        help="largest transfer per link test (default 64M): transfers grow to about --link-seconds or this",
    )
    p.add_argument("--link-seconds", type=float, default=0.15, help="aim for this long per link transfer")
    p.add_argument("--link-reps", type=int, default=2, help="timed transfers per direction and pass")
    p.add_argument(
        "--link-passes",
        type=int,
        default=2,
        help="times the whole pair schedule runs; each direction keeps its best (default 2)",
    )
    p.add_argument(
        "--recheck-share",
        type=float,
        default=0.0,
        help="before reporting, measure again every pair of a node (and every link) below this share "
        "of the median, as the controller will judge it (0: never; orch passes checks.fabric.share)",
    )
    p.add_argument(
        "--recheck-passes",
        type=int,
        default=2,
        help="at most this many re-measurements of the suspects, each until none is left (default 2)",
    )
    p.add_argument(
        "--link-trials",
        type=int,
        default=1,
        help="run the whole pairwise phase (passes and rechecks) this many times, each reported on its "
        "own in link_trials (a test of the verdict's stability; default 1)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a collective gives up")
    p.add_argument(
        "--pairs",
        choices=("auto", "concurrent", "serial"),
        default="auto",
        help="link pairs of a round at once or one by one (auto: one by one only when nodes share a machine)",
    )
    p.add_argument("--skip-links", action="store_true", help="only the all_reduce sweep")
    args = p.parse_args(argv)
    if args.max_bytes < args.min_bytes:
        p.error(f"--max-bytes {args.max_bytes} is below --min-bytes {args.min_bytes}")
    if args.link_passes < 1 or args.link_reps < 1 or args.link_trials < 1 or args.recheck_passes < 0:
        p.error("--link-passes, --link-reps and --link-trials must be at least 1, --recheck-passes at least 0")
    return args


def parse_size(text: str) -> int:
    """Bytes from ``1048576``, ``1M``, ``256M``, ``1G`` (K/M/G are powers of 1024, as in nccl-tests)."""
    text = text.strip()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 1048576, 64M, 1G)") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"size must be at least 4 bytes, not {text!r}")
    return value


def gloo_interface_problem(hostname: str, env: Mapping[str, str]) -> str | None:
    """Why gloo would bind an address other nodes cannot reach, or None.

    Without GLOO_SOCKET_IFNAME gloo binds the address the hostname resolves to and falls back to
    loopback when it resolves to nothing usable; peers on other machines then time out after about
    100 s (gloo's own connect timeout, not the process group's). Loopback is fine when every node
    is on this machine (MASTER_ADDR is a loopback address) or there is one node.
    """
    if env.get("GLOO_SOCKET_IFNAME") or int(env.get("GROUP_WORLD_SIZE", "1")) <= 1:
        return None
    if _is_loopback(env.get("MASTER_ADDR", "")):
        return None
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except OSError:
        addrs = set()
    if any(not _is_loopback(str(a)) for a in addrs):
        return None
    found = ", ".join(sorted(str(a) for a in addrs)) or "nothing"
    return (
        f"hostname {hostname!r} resolves to {found}: gloo would listen on loopback and the other "
        f"nodes could not connect; set GLOO_SOCKET_IFNAME to the interface that reaches "
        f"MASTER_ADDR {env.get('MASTER_ADDR')!r} (e.g. GLOO_SOCKET_IFNAME=eth0)"
    )


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return addr == "localhost"


def _boot_id() -> str | None:
    """This kernel's boot id: equal on two "nodes" exactly when they are one machine."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise RuntimeError(f"{name} is not set: run this under torchrun")
        return default
    return int(value)


# ----------------------------------------------------------------------------- the job


class Job:
    """One rank's run: process group, topology, phases, result."""

    def __init__(self, args: argparse.Namespace) -> None:
        t0 = time.perf_counter()
        import torch
        import torch.distributed as dist

        self.phase_s: dict[str, float] = {"import": time.perf_counter() - t0}

        self.torch, self.dist, self.args = torch, dist, args
        self.phase = "init"
        self.rank = _env_int("RANK")
        self.world = _env_int("WORLD_SIZE")
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.host = socket.gethostname()
        self.label = os.environ.get("ORCH_NODE") or self.host
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            count = torch.cuda.device_count()
            if self.local_rank >= count:
                raise RuntimeError(f"LOCAL_RANK {self.local_rank} but {count} CUDA device(s) visible")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.backend = backend
        self.t_start = self._lap = time.perf_counter()

    # -- small wrappers

    def sync(self) -> None:
        """Wait for queued device work (CUDA); a no-op on CPU, where ops are synchronous."""
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def reduce_max(self, values: Sequence[float]) -> list[float]:
        """Element-wise max over ranks."""
        t = self.torch.tensor(list(values), dtype=self.torch.float64, device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]

    def lap(self, name: str) -> None:
        """Record how long a phase took on this rank (rank 0's go into the result)."""
        now = time.perf_counter()
        self.phase_s[name] = now - self._lap
        self._lap = now

    def progress(self, **info: Any) -> None:
        """Rank 0 tells the controller what it is doing (one line on stderr)."""
        if self.rank == 0:
            print(f"{PROGRESS_MARKER} {json.dumps({'phase': self.phase, **info})}", file=sys.stderr, flush=True)

    def timed(self, fn: Callable[[], object]) -> float:
        """Seconds one call of fn takes on this rank, device work included."""
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    # -- phases

    def start(self) -> None:
        """Join the group and learn who runs where."""
        if self.backend == "gloo":
            problem = gloo_interface_problem(self.host, os.environ)
            if problem:
                raise RuntimeError(problem)
        self.dist.init_process_group(self.backend, timeout=timedelta(seconds=self.args.timeout))
        self.phase = "topology"
        group_rank = os.environ.get("GROUP_RANK")
        me = {
            "rank": self.rank,
            "host": self.host,
            "label": self.label,
            "local_rank": self.local_rank,
            "group_rank": int(group_rank) if group_rank is not None else None,
            "boot_id": _boot_id(),
        }
        everyone: list[Any] = [None] * self.world
        self.dist.all_gather_object(everyone, me)
        if all(p["group_rank"] is not None for p in everyone):
            key = "group_rank"
        else:  # not torchrun: tell nodes apart by hostname, numbered in order of first rank
            key = "host"
        order: dict[Any, int] = {}
        for p in sorted(everyone, key=lambda q: q["rank"]):
            order.setdefault(p[key], len(order) if key == "host" else p[key])
        self.ranks = [
            {
                "rank": p["rank"],
                "host": p["host"],
                "label": p["label"],
                "node": order[p[key]],
                "local_rank": p["local_rank"],
            }
            for p in sorted(everyone, key=lambda q: q["rank"])
        ]
        self.node = order[me[key]]
        node_ids = sorted(set(order.values()))
        self.nodes = []
        for n in node_ids:
            members = [r for r in self.ranks if r["node"] == n]
            leader = min(members, key=lambda r: r["local_rank"])
            boot = next(p["boot_id"] for p in everyone if p["rank"] == leader["rank"])
            self.nodes.append(
                {
                    "node": n,
                    "host": leader["label"],
                    "hostname": leader["host"],
                    "ranks": [r["rank"] for r in members],
                    "boot_id": boot,
                }
            )
        self.rank_of = {(r["node"], r["local_rank"]): r["rank"] for r in self.ranks}

    def sweep(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Phase 1: the all_reduce size sweep."""
        self.phase = "sweep"
        torch, dist, args = self.torch, self.dist, self.args
        rows: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        expected = self.world * (self.world + 1) / 2
        t0 = time.perf_counter()
        last: tuple[int, float] | None = None  # (size, seconds per op) of the last measured size
        sizes = sweep_sizes(args.min_bytes, args.max_bytes, args.factor)
        for index, size in enumerate(sizes, 1):
            if last is not None:
                per_op = last[1] * size / last[0]
                predicted = per_op * (2 + args.warmup)
                elapsed = self.reduce_max([time.perf_counter() - t0])[0]
                if elapsed + predicted > args.budget_s:
                    skipped.append(
                        {
                            "size_bytes": size,
                            "reason": f"would take ~{predicted:.1f} s more; "
                            f"{elapsed:.1f} s of the {args.budget_s:g} s budget used",
                        }
                    )
                    continue
            self.progress(size_bytes=size, step=index, of=len(sizes))
            count = size // 4
            buf = torch.empty(count, dtype=torch.float32, device=self.device)
            buf.fill_(self.rank + 1)
            first = self.timed(functools.partial(dist.all_reduce, buf))
            wrong = int((buf != expected).sum().item())
            buf.zero_()  # keep the timed ops on zeros: no overflow, no denormals
            for _ in range(args.warmup):
                dist.all_reduce(buf)
            first_max, wrong_total = self.reduce_max([first, 0.0])[0], self._sum_int(wrong)
            iters = max(1, min(args.iters, int(args.seconds_per_size / max(first_max, 1e-9))))
            dist.barrier()
            self.sync()
            begin = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            self.sync()
            per_op = self.reduce_max([(time.perf_counter() - begin) / iters])[0]
            alg = size / per_op / 1e9
            rows.append(
                {
                    "size_bytes": size,
                    "count": count,
                    "type": "float",
                    "redop": "sum",
                    "root": -1,
                    "iters": iters,
                    "time_us": per_op * 1e6,
                    "algbw_gbps": alg,
                    "busbw_gbps": alg * bus_factor(self.world),
                    "wrong": wrong_total,
                }
            )
            last = (size, per_op)
            del buf
        return rows, skipped

    def _sum_int(self, value: int) -> int:
        t = self.torch.tensor([value], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t)
        return int(t.item())

    def links(self) -> dict[str, Any]:
        """Phase 2: one-way transfers between every pair of nodes, rail by rail; then the pairs of
        what looks slow, measured again (`recheck_pairs`), until nothing does or the rechecks are
        used up."""
        self.phase = "links"
        args, torch = self.args, self.torch
        node_ids = [n["node"] for n in self.nodes]
        if len(node_ids) < 2:
            return {"method": "pairwise", "skipped": "one node: no links between nodes", "transfers": []}
        rails = min(len(n["ranks"]) for n in self.nodes)
        buf = torch.zeros(args.link_bytes, dtype=torch.uint8, device=self.device)
        ctrl = torch.zeros(1, dtype=torch.int64, device=self.device)
        serial, why = self._serial_pairs()
        records: list[dict[str, Any]] = []
        rounds = round_robin(len(node_ids))
        # Every pass runs the whole schedule; a direction keeps its best pass. Load on a node
        # changes over seconds, so samples spread in time beat back-to-back repeats.
        schedule = [(p, n, pairs) for p in range(args.link_passes) for n, pairs in enumerate(rounds)]
        for step, (pass_no, number, pairs) in enumerate(schedule, 1):
            self.progress(
                round=number + 1,
                of=len(rounds),
                **{"pass": pass_no + 1},
                step=step,
                steps=len(schedule),
                pairs=[[node_ids[a], node_ids[b]] for a, b in pairs],
            )
            # concurrent: every pair of the round at once; serial: one pair after the other
            batches = [[pair] for pair in pairs] if serial else [pairs]
            for batch in batches:
                records += self._run_pairs(
                    [(node_ids[a], node_ids[b]) for a, b in batch], pass_no, number, rails, buf, ctrl
                )
        every = self._gather(records)
        rechecks: list[dict[str, Any]] = []
        sizes = {(r["src_node"], r["dst_node"], r["rail"]): int(r["bytes"]) for r in every}
        for extra in range(args.recheck_passes if args.recheck_share > 0 else 0):
            again = recheck_pairs(every, node_ids, args.recheck_share)
            if not again:
                break
            pass_no = args.link_passes + extra
            rechecks.append({"pass": pass_no, "pairs": [list(p) for p in again]})
            mine: list[dict[str, Any]] = []
            for i, (a, b) in enumerate(again, 1):  # one pair at a time: the suspect is in all of them
                self.progress(recheck=extra + 1, of=args.recheck_passes, step=i, steps=len(again), pairs=[[a, b]])
                mine += self._run_pairs([(a, b)], pass_no, -1, rails, buf, ctrl, sizes)
            every += self._gather(mine)
        return {
            "method": "pairwise",
            "rounds": len(rounds),
            "passes": args.link_passes,
            "rails": rails,
            "pairs_at_once": "one" if serial else "all of a round",
            "pairs_why": why,
            "rechecks": rechecks,
            "recheck_share": args.recheck_share,
            "transfers": every,
        }

    def _gather(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every rank's records, in rank order (the same list on every rank)."""
        gathered: list[Any] = [None] * self.world
        self.dist.all_gather_object(gathered, records)
        return [r for part in gathered for r in part]

    def _run_pairs(
        self,
        batch: Sequence[tuple[int, int]],
        pass_no: int,
        number: int,
        rails: int,
        buf: Any,
        ctrl: Any,
        sizes: Mapping[tuple[int, int, int], int] | None = None,
    ) -> list[dict[str, Any]]:
        """The pairs of `batch` (disjoint) at once: each direction one after the other, local rank
        i with local rank i; this rank's receiver records. A barrier ends it on every rank."""
        records: list[dict[str, Any]] = []
        partner = None
        for a, b in batch:
            if a == self.node:
                partner = b
            elif b == self.node:
                partner = a
        if partner is not None and self.local_rank < rails:
            peer = self.rank_of[(partner, self.local_rank)]
            for sender in sorted((self.node, partner)):
                if sender == self.node:
                    self._serve(peer, buf, ctrl)
                else:
                    size = (sizes or {}).get((partner, self.node, self.local_rank))
                    rec = self._measure(peer, buf, ctrl, self.args.link_bytes, size)
                    records.append(
                        {
                            "pass": pass_no,
                            "round": number,
                            "src_node": partner,
                            "dst_node": self.node,
                            "rail": self.local_rank,
                            **rec,
                        }
                    )
        self.dist.barrier()  # rounds (and serial pairs) stay disjoint in time
        return records

    def _serial_pairs(self) -> tuple[bool, str]:
        """Whether to run the pairs of a round one at a time, and why.

        Pairs of a round are disjoint, so on a real cluster they can all run at once. Nodes that
        share one machine (same kernel boot_id, as NCCL's own host test) share its CPUs and
        memory bus too: concurrent pairs would then measure the scheduler, not the links.
        """
        if self.args.pairs != "auto":
            return self.args.pairs == "serial", f"--pairs {self.args.pairs}"
        boots = [n["boot_id"] for n in self.nodes]
        shared = len(set(boots)) < len(boots) and None not in boots
        if shared:
            return True, "nodes share a machine (same boot_id): pairs run one at a time"
        return False, "every node is its own machine: all pairs of a round run at once"

    def _serve(self, peer: int, buf: Any, ctrl: Any) -> None:
        """Sender side of one direction: send what the receiver asks for until it asks for 0."""
        dist = self.dist
        while True:
            dist.recv(ctrl, src=peer)
            n = int(ctrl.item())
            if n <= 0:
                return
            dist.send(buf[:n], dst=peer)
            self.sync()

    def _measure(self, peer: int, buf: Any, ctrl: Any, link_max: int, size: int | None = None) -> dict[str, Any]:
        """Receiver side: a probe, then transfers sized to --link-seconds (or `size`, the one an
        earlier pass found, when measuring again); returns the best rate."""
        dist, args = self.dist, self.args
        nbytes = min(size or 256 * 1024, link_max)

        def transfer(n: int) -> float:
            ctrl.fill_(n)
            t0 = time.perf_counter()
            dist.send(ctrl, dst=peer)
            dist.recv(buf[:n], src=peer)
            self.sync()
            return time.perf_counter() - t0

        transfer(4)  # untimed: connects the pair (NCCL creates its 2-rank communicator here)
        probe = seconds = transfer(nbytes)
        # Grow the transfer until it takes about --link-seconds (or hits link_max): small ones
        # measure latency and scheduling, not the link.
        for _ in range(0 if size else 6):
            if seconds >= args.link_seconds / 2 or nbytes >= link_max:
                break
            nbytes = int(min(link_max, max(2 * nbytes, nbytes / seconds * args.link_seconds)))
            seconds = transfer(nbytes)
        times = [transfer(nbytes) for _ in range(max(1, args.link_reps))]
        ctrl.fill_(0)
        dist.send(ctrl, dst=peer)
        best = min(times)
        return {
            "bytes": nbytes,
            "seconds": best,
            "gbps": nbytes / best / 1e9,
            "probe_gbps": nbytes / probe / 1e9 if size else min(256 * 1024, link_max) / probe / 1e9,
            "all_seconds": times,
        }

    def result(
        self, sweep: list[dict[str, Any]], skipped: list[dict[str, Any]], links: dict[str, Any]
    ) -> dict[str, Any]:
        """The JSON rank 0 prints."""
        torch = self.torch
        nccl_version = None
        if self.backend == "nccl":
            nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
        return {
            "schema": SCHEMA,
            "backend": self.backend,
            "device": self.device.type,
            "torch": torch.__version__,
            "nccl": nccl_version,
            "world_size": self.world,
            "nnodes": len(self.nodes),
            "nodes": self.nodes,
            "ranks": self.ranks,
            "op": "all_reduce",
            "dtype": "float32",
            "bus_factor": bus_factor(self.world),
            "sweep": sweep,
            "skipped": skipped,
            "links": links,
            "elapsed_s": time.perf_counter() - self.t_start,
            "phase_s": self.phase_s,
        }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the phases; rank 0 prints the result line. Exit 0, or 1 with ORCH_FABRIC_ERROR."""
    args = parse_args(argv)
    job: Job | None = None
    try:
        job = Job(args)
        job.start()
        job.lap("init")
        sweep, skipped = job.sweep()
        job.lap("sweep")
        trials = [] if args.skip_links else [job.links() for _ in range(args.link_trials)]
        links = trials[0] if trials else {}
        job.lap("links")
        job.phase = "report"
        if job.rank == 0:
            result = job.result(sweep, skipped, links)
            if len(trials) > 1:
                result["link_trials"] = trials
            print(f"{MARKER} {json.dumps(result, separators=(',', ':'))}", flush=True)
        job.dist.barrier()
        job.dist.destroy_process_group()
        return 0
    except Exception as exc:  # noqa: BLE001 - any failure: one line the controller can parse, then out
        info = {
            "rank": os.environ.get("RANK"),
            "host": socket.gethostname(),
            "node": os.environ.get("ORCH_NODE"),
            "phase": job.phase if job else "init",
            "error": f"{type(exc).__name__}: {exc}".strip()[:2000],
        }
        print(f"{ERROR_MARKER} {json.dumps(info)}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # never wait on a process group whose peer is gone


if __name__ == "__main__":
    sys.exit(main())
