"""Benchmark: `orch report` and `orch top --once` on big node logs, peak memory and time, beside
`orch logs` on the same run.

A stored run of `--nodes` nodes (4) with `--ranks` ranks each (8), each node's log `--mb` MB (250)
as a week of training writes it: every rank's timing line per window of steps, the node agent's
8-GPU telemetry line every other window, rank 0's progress line, a few other lines of the job per
window, and per epoch rank 0's throughput table, epoch and validation lines. Each command runs as
a user runs it (`python -m orchestrator ...`, its own ORCH_HOME), in a fresh process whose peak
RSS is its own high-water mark (VmHWM, read as it exits); the nodes are unreachable (`transport:
local`, no run directory on them), so every command shows the stored copies. Each size is
measured at a quarter of `--mb` too: memory that is flat in the log size is the same at both.

Goals: the peak RSS of report and top at `--mb` at most 1.25 x theirs at `--mb` / 4 (memory
independent of the log size); time: reported beside `orch logs` (the C merge), linear in the size.

Usage: ``python -m bench.report_top_memory [--quick] [--nodes 4] [--mb 250]``; writes
``bench/results/report_top_memory.json`` (``.quick.json`` with --quick: 4 x 16 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PEAK = (
    "import atexit, sys\n"
    "def peak():\n"
    "    for ln in open('/proc/self/status'):\n"
    "        if ln.startswith('VmHWM:'):\n"
    "            sys.stderr.write('\\nPEAK_KB ' + ln.split()[1] + '\\n')\n"
    "atexit.register(peak)\n"
    "from orchestrator.cli import main\n"
    "main(sys.argv[1:])\n"
)
"""`python -c PEAK ARGS...` is `orch ARGS...` that writes its own peak RSS on stderr as it exits."""

TS0 = 1_796_000_000.0
WINDOW_S = 2.0
WINDOWS_PER_EPOCH = 500
INVENTORY = """name: big
transport: local
nodes:
{nodes}
job:
  python: python3
  nproc_per_node: {ranks}
  telemetry_s: 4
  straggler: {{share: 0.8, windows: 3}}
"""


def _stamp(ts: float) -> str:
    sec = int(ts)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)) + f".{int(round((ts - sec) * 1e6)) % 1_000_000:06d}Z"


def _telemetry(ranks: list[int]) -> str:
    gpus: list[dict[str, Any]] = [
        {
            "index": i,
            "uuid": f"GPU-{i:08x}",
            "name": "NVIDIA H100 80GB HBM3",
            "util_pct": 97.0,
            "mem_used_mb": 61234,
            "mem_total_mb": 81559,
            "temp_c": 61.0,
            "power_w": 512.3,
            "sm_mhz": 1980,
            "throttle": [],
            "fan_pct": None,
            "error": None,
        }
        for i in range(len(ranks))
    ]
    sample = {
        "v": 1,
        "gpus": gpus,
        "gpu_error": None,
        "cpu_pct": 41.5,
        "load1": 9.8,
        "ncpu": 64,
        "mem_used_mb": 210455,
        "mem_total_mb": 515000,
        "ranks": [
            {"rank": r, "local_rank": i, "pid": 4000 + r, "cpu_pct": 101.2, "rss_mb": 6120.4}
            for i, r in enumerate(ranks)
        ],
    }
    return "telemetry " + json.dumps(sample, separators=(",", ":"))


def node_log(path: Path, node_rank: int, ranks: int, world: int, megabytes: float) -> int:
    """Write one node's log of about `megabytes` MB; returns its size in bytes."""
    from trainer.logs import epoch_line, step_line, throughput_table, timing_line, val_line

    mine = list(range(node_rank * ranks, (node_rank + 1) * ranks))
    telemetry = _telemetry(mine)
    target, size, window = int(megabytes * 1e6), 0, 0
    with open(path, "w", encoding="utf-8") as fh:
        while size < target:
            window += 1
            epoch, batch = 1 + (window - 1) // WINDOWS_PER_EPOCH, 10 * (1 + (window - 1) % WINDOWS_PER_EPOCH)
            ts = TS0 + WINDOW_S * window
            out = []
            for i, r in enumerate(mine):
                compute = 1.0 + 0.01 * ((window * 7 + r) % 5)
                out.append(
                    f"{_stamp(ts + 0.0001 * r)} out [default{i}]:[rank {r}] "
                    + timing_line(epoch, batch, 10, 80, 0.012, compute, 2.05)
                )
                if r % 4 == 0:
                    out.append(
                        f"{_stamp(ts + 0.0002 * r)} err [default{i}]:[rank {r}] UserWarning: "
                        f"this DataLoader will create 8 worker processes in total (window {window})"
                    )
            if window % 2 == 0:
                out.append(f"{_stamp(ts + 0.5)} orch {telemetry}")
            if node_rank == 0:
                out.append(
                    f"{_stamp(ts + 0.001)} out [default0]:[rank 0] "
                    + step_line(
                        epoch,
                        99,
                        batch,
                        10 * WINDOWS_PER_EPOCH,
                        {"box_loss": 1.2345, "cls_loss": 2.1, "dfl_loss": 1.05},
                        0.00123,
                        512.3,
                        0.04,
                    )
                )
                if window % WINDOWS_PER_EPOCH == 0:
                    table = throughput_table(epoch, [[80.0, 0.012, 2.05]] * world, None).splitlines()
                    out += [f"{_stamp(ts + 0.6)} out [default0]:[rank 0] {t}" for t in table]
                    out.append(
                        f"{_stamp(ts + 0.7)} out [default0]:[rank 0] "
                        + epoch_line(epoch, 99, {"box_loss": 1.2, "cls_loss": 2.0, "dfl_loss": 1.0}, {"lr/pg0": 0.001})
                    )
                    out.append(
                        f"{_stamp(ts + 1.5)} out [default0]:[rank 0] "
                        + val_line(epoch, 99, {"metrics/mAP50(B)": 0.5, "metrics/mAP50-95(B)": 0.3})
                    )
            text = "\n".join(out) + "\n"
            fh.write(text)
            size += len(text.encode())
    return size


def write_run(home: Path, nodes: int, ranks: int, megabytes: float) -> str:
    """A stored run of `nodes` nodes in `home` (an ORCH_HOME); returns its id."""
    run_id = "20261206-000000-big"
    run = home / "runs" / run_id
    (run / "nodes").mkdir(parents=True, mode=0o700)
    for d in (home, home / "runs", run):
        d.chmod(0o700)
    names = [f"n{i + 1}" for i in range(nodes)]
    (run / "inventory.yaml").write_text(
        INVENTORY.format(nodes="\n".join(f"  - {{host: localhost, name: {n}}}" for n in names), ranks=ranks)
    )
    records = [
        {
            "node": n,
            "node_rank": i,
            "base_rank": i * ranks,
            "nproc": ranks,
            "host": "localhost",
            "state": "succeeded",
            "exit_code": 0,
            "started_at": TS0,
            "finished_at": TS0 + 3600,
            "remote_dir": str(home / "gone" / n),
            "python": "python3",
        }
        for i, n in enumerate(names)
    ]
    (run / "run.json").write_text(
        json.dumps(
            {
                "run": run_id,
                "inventory": str(run / "inventory.yaml"),
                "state": "succeeded",
                "created": TS0,
                "wall_s": 3600.0,
                "nodes": records,
            }
        )
    )
    for i, n in enumerate(names):
        node_log(run / "nodes" / f"{n}.log", i, ranks, nodes * ranks, megabytes)
    return run_id


def measured(home: Path, *args: str) -> dict[str, Any]:
    """`orch ARGS` in a fresh process (stdout discarded): seconds, its own peak RSS (MB), exit code."""
    env = {**os.environ, "ORCH_HOME": str(home), "NO_COLOR": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seconds = time.perf_counter() - start
    kb = int(proc.stderr.rsplit("PEAK_KB ", 1)[1].split()[0]) if "PEAK_KB " in proc.stderr else 0
    return {
        "seconds": round(seconds, 2),
        "peak_rss_mb": round(kb / 1024, 1),
        "exit_code": proc.returncode,
        **({"stderr_tail": proc.stderr[-500:]} if proc.returncode not in (0, 1) else {}),
    }


COMMANDS = {"report": ("report",), "top": ("top", "--once", "--json"), "logs": ("logs",)}


def one_size(base: Path, nodes: int, ranks: int, megabytes: float) -> dict[str, Any]:
    home = base / f"home-{megabytes:g}"
    start = time.perf_counter()
    run_id = write_run(home, nodes, ranks, megabytes)
    written = sum(p.stat().st_size for p in (home / "runs" / run_id / "nodes").glob("*.log"))
    out: dict[str, Any] = {"mb_per_node": megabytes, "bytes": written, "write_s": round(time.perf_counter() - start, 1)}
    for name, args in COMMANDS.items():
        out[name] = measured(home, args[0], run_id, *args[1:])
        print(f"  {nodes} x {megabytes:g} MB: orch {' '.join(args)}: {out[name]}", flush=True)
    return out


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    small, big = results["sizes"]
    rows = []
    for name in ("report", "top"):
        ratio = big[name]["peak_rss_mb"] / max(1e-9, small[name]["peak_rss_mb"])
        rows.append(
            {
                "what": f"orch {name} peak RSS MB, {results['nodes']} x {big['mb_per_node']:g} MB node logs "
                f"(peer: the same at {small['mb_per_node']:g} MB)",
                "orch": big[name]["peak_rss_mb"],
                "peer": small[name]["peak_rss_mb"],
                "ratio": round(ratio, 3),
                "goal": "<= 1.25 (memory flat in log size)",
                "met": ratio <= 1.25,
            }
        )
        rows.append(
            {
                "what": f"orch {name} seconds vs orch logs, {results['nodes']} x {big['mb_per_node']:g} MB",
                "orch": big[name]["seconds"],
                "peer": big["logs"]["seconds"],
                "ratio": round(big[name]["seconds"] / max(1e-9, big["logs"]["seconds"]), 2),
                "goal": "report",
                "met": None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 x 16 MB node logs (smoke run)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mb", type=float, default=250.0, help="MB per node log (and a quarter of it)")
    args = ap.parse_args(argv)
    mb = 16.0 if args.quick else args.mb
    from bench.common import write

    with tempfile.TemporaryDirectory(prefix="orch-bench-report-") as tmp:
        sizes = [one_size(Path(tmp), args.nodes, args.ranks, m) for m in (mb / 4, mb)]
    results: dict[str, Any] = {"nodes": args.nodes, "ranks": args.ranks, "sizes": sizes}
    results["summary"] = summary_rows(results)
    path = write("report_top_memory.quick" if args.quick else "report_top_memory", results)
    print(f"wrote {path}")
    return results


if __name__ == "__main__":
    main()
