"""Benchmark: merging node logs, side by side with `sort -m`, and controller memory while following.

    .venv/bin/python bench/log_merge.py [--lines 250000] [--nodes 4,32] [--reps 3] [--quick]

Writes bench/results/log_merge.json. Not a test: numbers depend on the machine and its load.

Throughput: N node files of L lines each in node.log format (UTC µs timestamps, torchrun tee and
trainer prefixes, realistic text), each sorted, nodes interleaved in time. `sort -m` (LC_ALL=C)
merges the same pre-sorted files: the floor for merging sorted text. Ours is measured at three
depths, each after a warm-up, median of `--reps`:

- `merge_raw`: lines merged by their timestamp, as text (what `sort -m` does);
- `merge_parsed`: every line parsed into a LogLine (ranks, stream, text) and k-way merged (the
  path of `--json`, filters and the live follow);
- `orch_logs_general`: that, plus formatting the aligned text and writing it (what `orch logs`
  did for every output before the block merge);
- `orch_logs`: what `orch logs RUN > file` runs now: `orchestrator.logs.stored.plain_merged_bytes`,
  the C merge (`orchestrator.logs._fastmerge`: reads each copy in blocks, renders each line's columns
  from its text, heap-merges, writes chunks of bytes);
- `orch_logs_python`: the pure-Python block merge (`plain_merged`) that runs where the C merge
  could not be built: blocks, columns per prefix, one sort per batch.

Memory: peak RSS of this process while a Follower follows 32 nodes (local transport, node dirs
on this machine): once while every node appends lines live, once catching up on existing logs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine, write  # noqa: E402
from orchestrator.logs.lines import LogLine, column_widths, format_line, format_ts, read_node_lines  # noqa: E402
from orchestrator.logs.merge import merge  # noqa: E402

TEXTS = (
    "epoch {e}/100 it {i}/2000 box_loss=1.{i:04d} cls_loss=0.{e:03d} dfl_loss=1.02 lr=0.0{i:03d}",
    "Validating: mAP50=0.{i:04d} mAP50-95=0.{e:03d}",
    "throughput {i} img/s, gpu_mem 21.3G",
)


def generate(path: Path, node: int, lines: int, start: float) -> None:
    """One node's node.log: sorted UTC µs stamps, about 2 ms apart, jittered per node."""
    rnd = random.Random(node)
    t = start + rnd.random() * 0.01
    out = []
    for i in range(lines):
        t += 0.001 + rnd.random() * 0.002
        lr = i % 8
        if i % 50 == 0:
            out.append(f"{format_ts(t)} err [default{lr}]:[W1130 warn] NCCL slow link on rank {node * 8 + lr}\n")
        elif i % 97 == 0:
            out.append(f"{format_ts(t)} orch heartbeat {i}\n")
        else:
            text = TEXTS[i % 3].format(e=i // 2000, i=i % 2000)
            out.append(f"{format_ts(t)} out [default{lr}]:[rank {node * 8 + lr}] {text}\n")
    path.write_text("".join(out))


def dataset(base: Path, nodes: int, lines: int) -> list[Path]:
    """Generate (or reuse) the node files for one size."""
    d = base / f"{nodes}x{lines}"
    files = [d / f"node{i:02d}.log" for i in range(nodes)]
    if not all(f.exists() for f in files):
        d.mkdir(parents=True, exist_ok=True)
        for i, f in enumerate(files):
            generate(f, i, lines, 1_796_031_125.0)
    return files


def timed(fn: Callable[[], int], reps: int, warmup: Callable[[], int] | None = None) -> dict[str, float]:
    """Warm up once (`warmup`, else fn), then `reps` timed runs; median seconds and lines/s."""
    (warmup or fn)()
    times, count = [], 0
    for _ in range(reps):
        start = time.perf_counter()
        count = fn()
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    return {"median_s": round(med, 4), "min_s": round(min(times), 4), "lines": count, "lines_per_s": round(count / med)}


def merge_raw(files: list[Path]) -> int:
    """Merge as text by the 27-character timestamp (ties: file order), like `sort -m`."""
    import heapq

    handles = [open(f, encoding="utf-8", newline="\n") for f in files]  # noqa: SIM115
    n = 0
    with open(os.devnull, "w") as out:
        write = out.write
        for line in heapq.merge(*handles, key=lambda s: s[:27]):
            write(line)
            n += 1
    for h in handles:
        h.close()
    return n


def _streams(files: list[Path]) -> list[Iterator[LogLine]]:
    return [
        read_node_lines(open(f, encoding="utf-8", newline="\n"), f"node{i:02d}", i, i * 8)  # noqa: SIM115
        for i, f in enumerate(files)
    ]


def merge_parsed(files: list[Path]) -> int:
    n = 0
    for _ in merge(_streams(files)):
        n += 1
    return n


def _sources(files: list[Path]) -> tuple[list[Any], tuple[int, int]]:
    from orchestrator.logs.fetch import NodeSource

    sources = [NodeSource(f"node{i:02d}", i, i * 8, "", "", f) for i, f in enumerate(files)]
    return sources, column_widths([s.node for s in sources], 8 * len(files))


def orch_logs(files: list[Path]) -> int:
    """What `orch logs RUN > file` runs: the merged bytes (the C merge where it is built)."""
    from orchestrator.logs.stored import plain_merged_bytes

    sources, widths = _sources(files)
    return _write_all(plain_merged_bytes(sources, {}, widths), "wb", b"\n")


def orch_logs_python(files: list[Path]) -> int:
    """The pure-Python block merge: what runs where the C merge could not be built."""
    from orchestrator.logs.stored import plain_merged

    sources, widths = _sources(files)
    return _write_all(plain_merged(sources, {}, widths), "w", "\n")


def _write_all(chunks: Iterator[Any], mode: str, newline: Any) -> int:
    """Write the chunks to /dev/null; how many lines they held."""
    n = 0
    with open(os.devnull, mode) as out:
        for chunk in chunks:
            out.write(chunk)
            n += chunk.count(newline)
    return n


def orch_logs_general(files: list[Path]) -> int:
    widths = column_widths([f"node{i:02d}" for i in range(len(files))], 8 * len(files))
    n = 0
    with open(os.devnull, "w") as out:
        write = out.write
        for line in merge(_streams(files)):
            write(format_line(line, False, node_width=widths[0], rank_width=widths[1]) + "\n")
            n += 1
    return n


def throughput(base: Path, nodes: int, lines: int, reps: int) -> dict[str, object]:
    files = dataset(base, nodes, lines)
    total = nodes * lines

    def sort_fn() -> int:
        subprocess.run(
            ["sort", "-m", "-o", "/dev/null", *map(str, files)], check=True, env={**os.environ, "LC_ALL": "C"}
        )
        return total

    result: dict[str, object] = {
        "nodes": nodes,
        "lines_per_node": lines,
        "total_lines": total,
        "bytes": sum(f.stat().st_size for f in files),
    }
    result["sort_m"] = timed(sort_fn, reps)
    for name, fn in (
        ("merge_raw", merge_raw),
        ("merge_parsed", merge_parsed),
        ("orch_logs", orch_logs),
        ("orch_logs_python", orch_logs_python),
        ("orch_logs_general", orch_logs_general),
    ):
        # The files are in the page cache already (sort -m's warm-up read them all); warming
        # the Python code up on two files is enough and keeps a 32-node run within minutes.
        r = timed(functools.partial(fn, files), reps, warmup=functools.partial(fn, files[:2]))
        assert r["lines"] == total, f"{name} produced {r['lines']} of {total} lines"
        r["ratio_to_sort_m"] = round(r["median_s"] / result["sort_m"]["median_s"], 2)  # type: ignore[index]
        result[name] = r
        print(
            f"  {nodes:2d} nodes: {name:13s} {r['lines_per_s']:>10,} lines/s  {r['ratio_to_sort_m']}x sort -m",
            flush=True,
        )
    print(f"  {nodes:2d} nodes: sort -m       {result['sort_m']['lines_per_s']:>10,} lines/s", flush=True)  # type: ignore[index]
    return result


# ----------------------------------------------------------------------------- memory


def _status_mb(field: str) -> float:
    """A `/proc/self/status` memory field (kB there), in MB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM), in MB."""
    return _status_mb("VmHWM")


def rss_mb() -> float:
    return _status_mb("VmRSS")


APPENDER = r"""
import datetime, os, sys, time
dirs, rate, seconds = sys.argv[1].split(","), float(sys.argv[2]), float(sys.argv[3])
fds = [os.open(os.path.join(d, "node.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for d in dirs]
end, i = time.time() + seconds, 0
while time.time() < end:
    for k, fd in enumerate(fds):
        ts = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rank = k * 8 + i % 8
        line = "%s out [default%d]:[rank %d] epoch 1/100 it %d box_loss=1.234 cls_loss=0.5\n" % (ts, i % 8, rank, i)
        os.write(fd, line.encode())
    i += 1
    time.sleep(1.0 / rate)
for d in dirs:
    with open(os.path.join(d, "state.json"), "w") as f:
        f.write('{"state": "succeeded"}')
"""


def follow_memory(base: Path, nodes: int, live_s: float, catchup_lines: int) -> dict[str, object]:
    """Peak RSS while following `nodes` local nodes: live appends, then catching up on big logs."""
    os.environ["ORCH_HOME"] = str(base / "home")
    from orchestrator.config.inventory import parse
    from orchestrator.logs.fetch import fetch_all
    from orchestrator.logs.follow import Follower
    from orchestrator.store import RunStore, remote_dir
    from orchestrator.transport import Cluster

    out: dict[str, object] = {"nodes": nodes, "rss_before_mb": round(rss_mb(), 1)}
    for scenario in ("live", "catchup"):
        text = json.dumps(
            {
                "name": f"bench-{scenario}",
                "transport": "local",
                "nodes": [{"host": f"n{i:02d}", "gpus": 8} for i in range(nodes)],
                "job": {"python": sys.executable, "run_root": str(base / f"noderuns-{scenario}")},
            }
        )
        inv = parse(text, "bench.yaml")
        run = RunStore().create(inv, f"{scenario}-{int(time.time())}")
        dirs = [os.path.expanduser(remote_dir(inv, n, run.run_id)) for n in inv.nodes]
        for i, d in enumerate(dirs):
            os.makedirs(d, exist_ok=True)
            if scenario == "catchup":
                generate(Path(d) / "node.log", i, catchup_lines, time.time() - 3600)
                Path(d, "state.json").write_text('{"state": "succeeded"}')
        writer = None
        if scenario == "live":
            writer = subprocess.Popen([sys.executable, "-c", APPENDER, ",".join(dirs), "20", str(live_s)])
        peak, stop = [rss_mb()], threading.Event()

        def sample(peak: list[float] = peak, stop: threading.Event = stop) -> None:
            while not stop.wait(0.2):
                peak.append(rss_mb())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start, n, lag = time.monotonic(), 0, []
        with Cluster(inv) as cluster:
            if scenario == "catchup":  # as `orch logs -f` does: bring the copies up to date, then follow
                fetch_all(run, inv, cluster)
            for line in Follower(run, inv, cluster, watermark=1.0).lines():
                n += 1
                if scenario == "live" and n % 50 == 0:
                    lag.append(time.time() - line.ts)
        stop.set()
        sampler.join()
        if writer is not None:
            writer.wait()
        out[scenario] = {
            "lines": n,
            "seconds": round(time.monotonic() - start, 1),
            "peak_rss_mb": round(max(peak), 1),
            **({"median_lag_s": round(statistics.median(lag), 3)} if lag else {}),
            **({"lines_per_node_existing": catchup_lines} if scenario == "catchup" else {}),
        }
        print(f"  follow {nodes} nodes, {scenario}: {out[scenario]}", flush=True)
    out["ru_maxrss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def merge_rss(base: Path, nodes: int, lines: int) -> float:
    """Peak RSS (MB) of a fresh process running the `orch logs` path once over these files."""
    # VmHWM, not ru_maxrss: Linux carries the parent's high-water mark over a vfork and exec into
    # the child's ru_maxrss, so a fresh process started from this one would report our own peak.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from bench.log_merge import dataset, orch_logs, peak_rss_mb; "
        "from pathlib import Path; orch_logs(dataset(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))); "
        "print(peak_rss_mb())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), str(base), str(nodes), str(lines)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rss = round(float(out.split()[-1]), 1)
    print(f"  {nodes:2d} nodes: orch_logs peak RSS {rss} MB (a fresh process, {nodes * lines:,} lines)", flush=True)
    return rss


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows bench/summary.md shows: merge ratios against `sort -m`, and follow memory."""
    rows: list[dict[str, Any]] = []
    for t in results["throughput"]:
        for key, what in (
            ("orch_logs", "orch logs (read, render columns, merge, write)"),
            ("orch_logs_python", "orch logs without the C merge (pure-Python block merge)"),
            ("orch_logs_general", "general path: LogLine per line, heap merge, format (reference)"),
            ("merge_raw", "text merge on the timestamp (reference)"),
        ):
            r = t[key]
            rows.append(
                {
                    "what": f"{what} vs sort -m, {t['nodes']} nodes x {t['lines_per_node']} lines",
                    "orch": r["median_s"],
                    "peer": t["sort_m"]["median_s"],
                    "ratio": r["ratio_to_sort_m"],
                    "goal": "<= 2" if key == "orch_logs" else "report",
                    "met": r["ratio_to_sort_m"] <= 2 if key == "orch_logs" else None,
                }
            )
        rows.append(
            {
                "what": f"orch logs peak RSS MB, {t['nodes']} nodes x {t['lines_per_node']} lines",
                "orch": t["orch_logs_peak_rss_mb"],
                "peer": None,
                "ratio": None,
                "goal": "report (constant in the number of lines)",
                "met": None,
            }
        )
    mem = results["follow_memory"]
    peak = max(mem["live"]["peak_rss_mb"], mem["catchup"]["peak_rss_mb"])
    rows.append(
        {
            "what": f"controller RSS MB following {mem['nodes']} nodes (live / catching up)",
            "orch": peak,
            "peer": 150.0,
            "ratio": peak / 150.0,
            "goal": "< 150 MB",
            "met": peak < 150,
        }
    )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=250_000)
    ap.add_argument("--nodes", default="4,32")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-reps", type=int, default=2, help="reps for 16 nodes or more")
    ap.add_argument("--follow-nodes", type=int, default=32)
    ap.add_argument("--live-seconds", type=float, default=15.0)
    ap.add_argument("--catchup-lines", type=int, default=25_000)
    ap.add_argument("--quick", action="store_true", help="small sizes, to check the script works")
    args = ap.parse_args(argv)
    if args.quick:
        args.lines, args.reps, args.big_reps, args.live_seconds, args.catchup_lines = 5_000, 1, 1, 3.0, 1_000
    base = Path(tempfile.gettempdir()) / "orch-bench-log-merge"
    base.mkdir(exist_ok=True)
    results: dict[str, object] = {
        "machine": {**machine(), "loadavg_at_start": os.getloadavg()},
        "params": vars(args),
        "throughput": [],
    }
    # Memory first, in a process that has merged nothing yet: the throughput runs below leave
    # their freed blocks in the allocator, which would count against the follower.
    print("controller memory while following:", flush=True)
    home = base / "home"
    shutil.rmtree(home, ignore_errors=True)
    for d in base.glob("noderuns-*"):
        shutil.rmtree(d, ignore_errors=True)
    results["follow_memory"] = follow_memory(base, args.follow_nodes, args.live_seconds, args.catchup_lines)
    print(f"merge throughput (median of {args.reps} runs, {args.big_reps} for 16+ nodes, after a warm-up):", flush=True)
    for nodes in (int(x) for x in args.nodes.split(",")):
        reps = args.big_reps if nodes >= 16 else args.reps
        results["throughput"].append(throughput(base, nodes, args.lines, reps))  # type: ignore[attr-defined]
        results["throughput"][-1]["orch_logs_peak_rss_mb"] = merge_rss(base, nodes, args.lines)  # type: ignore[index]
    results["machine"]["loadavg_at_end"] = os.getloadavg()  # type: ignore[index]
    results["benchmark"] = "log_merge"
    results["summary"] = summary_rows(results)
    dest = write("log_merge.quick" if args.quick else "log_merge", results)
    print(f"wrote {dest}")
    return results


if __name__ == "__main__":
    main()
