"""Benchmark: what telemetry and the straggler detector cost, side by side with the same work without.

1. Training throughput with and without the node agent's sampler: one ``python -m trainer``
   process on CPU (yolo12n, synthetic data), alternating A B B A in fresh processes; in B a
   sampler (`orchestrator/node/telemetry.py`, the agent's own code, in a process of its own as in
   the agent) samples that trainer every `--every` seconds (1: ten times the default rate) with
   the recorded 8xH100 `nvidia-smi` stand-in on PATH (a Python process per sample, dearer than
   the real tool). Images/s from each run's results.csv, first and last epoch left out. Goal:
   ratio >= 0.99 (at most 1 % slower) at the default 10 s. Single runs here vary by 10-20 %, so
   a 1 % effect cannot be seen at 10 s directly: each sample costs the same, so the slowdown grows
   with the rate, and the run at a higher rate (`--every 0.5`: 20 times the default) is scaled
   back to 10 s (slowdown x every / 10) to judge the goal; the direct ratio is reported beside it.
2. The per-rank timing itself (`trainer/pace.py`, always on): the cost of its calls per step and
   of one line per window, timed over many steps, as a share of a training step measured in (1).
3. Controller memory following 32 nodes with telemetry on: a Follower over 32 local nodes whose
   logs get, besides one trainer line per rank per second, an 8-GPU telemetry line per node every
   second and every rank's timing line every second (8 ranks a node), each parsed and fed to the
   straggler detector as `orch up` does. Peer: the same follow without telemetry and detector.
   Peak RSS of each, each in a fresh process. Goal: <= 50 MB.

Usage: ``python -m bench.telemetry [--quick]``; writes ``bench/results/telemetry.json``.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FAKE_SMI = ROOT / "tests" / "fixtures" / "telemetry" / "h100x8" / "bin"

SAMPLER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from orchestrator.node import telemetry
pid, every = int(sys.argv[2]), float(sys.argv[3])
s = telemetry.Sampler(lambda: [pid])
n = 0
while True:
    try:
        open(f"/proc/{pid}/stat").close()
    except OSError:
        break
    telemetry.line(s.sample())
    n += 1
    time.sleep(every)
print(n)
"""


def trainer_ips(data: Path, out: Path, epochs: int, batch: int, imgsz: int, every: float | None) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{FAKE_SMI}{os.pathsep}{os.environ['PATH']}")
    cmd = [
        sys.executable,
        "-m",
        "trainer",
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        str(epochs),
        "--batch",
        str(batch),
        "--imgsz",
        str(imgsz),
        "--workers",
        "0",
        "--val-period",
        "0",
        "--device",
        "cpu",
        "--project",
        str(out.parent),
        "--name",
        out.name,
        "--close-mosaic",
        "0",
        "--seed",
        "0",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sampler = None
    if every is not None:
        sampler = subprocess.Popen(
            [sys.executable, "-c", SAMPLER, str(ROOT), str(proc.pid), str(every)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
    _out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"trainer failed: {err[-3000:]}")
    if sampler is not None:
        samples = int((sampler.communicate()[0] or "0").split()[-1])
        if samples < 2:
            raise SystemExit("the sampler took fewer than 2 samples: the run is too short to measure it")
    from bench.trainer_throughput import middle_ips

    images = len(list((data.parent / "images" / "train").iterdir()))
    return middle_ips(out / "results.csv", images)


def sampler_cpu(samples: int) -> dict[str, float]:
    """CPU seconds one sample costs (the sampler and its nvidia-smi child: the fake, a Python
    process, dearer than the real tool), sampling this process with the 8xH100 stand-in on PATH."""
    os.environ["PATH"] = f"{FAKE_SMI}{os.pathsep}{os.environ['PATH']}"
    from orchestrator.node import telemetry

    s = telemetry.Sampler(lambda: [os.getpid()])
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(samples):
        telemetry.line(s.sample())
    t1, c1 = time.perf_counter(), os.times()
    cpu = (
        (c1.user - c0.user)
        + (c1.system - c0.system)
        + (c1.children_user - c0.children_user)
        + (c1.children_system - c0.children_system)
    )
    return {
        "cpu_s_per_sample": cpu / samples,
        "wall_s_per_sample": (t1 - t0) / samples,
        "share_of_one_core_at_10s": cpu / samples / 10.0,
    }


def pace_cost(reps: int) -> dict[str, float]:
    """Seconds per step of Pace's calls (CPU clock path) and per window of its line."""
    import torch

    from trainer.pace import Pace

    pace = Pace(torch.device("cpu"))
    t0 = time.perf_counter()
    for _ in range(reps):
        pace.data(0.001)
        pace.forward_begins()
        pace.forward_ends(8)
    per_step = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps // 10):
        pace.line(1, 10)
    per_line = (time.perf_counter() - t0) / (reps // 10)
    return {"per_step_s": per_step, "per_line_s": per_line}


APPENDER = r"""
import datetime, json, os, sys, time
sys.path.insert(0, sys.argv[4])
from orchestrator.node import telemetry
from trainer.logs import timing_line
dirs, seconds, with_tel = sys.argv[1].split(","), float(sys.argv[2]), sys.argv[3] == "1"
gpus = telemetry.parse_gpu_csv(open(sys.argv[5]).read())
fds = [os.open(os.path.join(d, "node.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for d in dirs]
end, i = time.time() + seconds, 0
def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
while time.time() < end:
    for k, fd in enumerate(fds):
        lines = ["%s out [default%d]:[rank %d] epoch 1/100 batch %d/999 box_loss 1.234 lr 0.01 images/s 400 data 2%%"
                 % (now(), r, k * 8 + r, i) for r in range(8)]
        if with_tel:
            sample = {"v": 1, "gpus": gpus, "gpu_error": None, "cpu_pct": 40.0, "load1": 9.0, "ncpu": 128,
                      "mem_used_mb": 200000, "mem_total_mb": 2000000,
                      "ranks": [{"rank": k * 8 + r, "local_rank": r, "pid": 1000 + r, "cpu_pct": 99.0, "rss_mb": 6000.0}
                                for r in range(8)]}
            lines.append("%s orch %s" % (now(), telemetry.line(sample)))
            timing = timing_line(1, i + 1, 10, 80, 0.01, 1.5, 3.0)
            lines += ["%s out [default%d]:[rank %d] %s" % (now(), r, k * 8 + r, timing) for r in range(8)]
        os.write(fd, ("\n".join(lines) + "\n").encode())
    i += 1
    time.sleep(1.0)
for d in dirs:
    with open(os.path.join(d, "state.json"), "w") as f:
        f.write('{"state": "succeeded"}')
"""


def follow_rss(base: Path, nodes: int, seconds: float, with_telemetry: bool) -> dict[str, Any]:
    """In this (fresh) process: follow `nodes` local nodes for `seconds`; peak RSS."""
    os.environ["ORCH_HOME"] = str(base / "home")
    import threading

    from bench.log_merge import rss_mb
    from orchestrator.config.inventory import parse
    from orchestrator.logs.follow import Follower
    from orchestrator.logs.telemetry import parse_sample, timing_window
    from orchestrator.node import telemetry
    from orchestrator.run.straggler import Detector
    from orchestrator.store import RunStore, remote_dir
    from orchestrator.transport import Cluster

    text = json.dumps(
        {
            "name": "bench-tel",
            "transport": "local",
            "nodes": [{"host": f"n{i:02d}", "gpus": 8} for i in range(nodes)],
            "job": {"python": sys.executable, "run_root": str(base / "noderuns")},
        }
    )
    inv = parse(text, "bench.yaml")
    run = RunStore().create(inv, f"tel-{int(time.time() * 1000)}")
    dirs = [os.path.expanduser(remote_dir(inv, n, run.run_id)) for n in inv.nodes]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    import csv

    with open(FAKE_SMI.parent / "gpus.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    smi = base / "smi.csv"
    smi.write_text("\n".join(", ".join(r[f] for f in telemetry.GPU_FIELDS) for r in rows) + "\n")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            APPENDER,
            ",".join(dirs),
            str(seconds),
            "1" if with_telemetry else "0",
            str(ROOT),
            str(smi),
        ]
    )
    det = Detector(0.8, 3, nodes * 8)
    peak, stop = [rss_mb()], threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak.append(rss_mb())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    n = samples = windows = 0
    with Cluster(inv) as cluster:
        for line in Follower(run, inv, cluster, watermark=1.0).lines():
            n += 1
            if with_telemetry:
                s = parse_sample(line)
                if s is not None:
                    det.load(s.load())
                    samples += 1
                    continue
                w = timing_window(line)
                if w is not None:
                    det.window(w[0])
                    windows += 1
    stop.set()
    t.join()
    writer.wait()
    return {
        "lines": n,
        "samples": samples,
        "windows": windows,
        "judged": len(det.speeds),
        "peak_rss_mb": round(max(peak), 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--follow-nodes", type=int, default=32)
    ap.add_argument("--follow-seconds", type=float, default=60.0)
    ap.add_argument("--child", choices=["with", "without"], help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(follow_rss(Path(args.base), args.follow_nodes, args.follow_seconds, args.child == "with")))
        return {}
    if args.quick:
        args.reps, args.epochs, args.images, args.follow_seconds = 1, 3, 32, 15.0
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="orch-bench-tel-") as tmp:
        base = Path(tmp)
        from trainer.synth import write_dataset

        data = write_dataset(base / "data", images=args.images, classes=3, imgsz=64)
        ips: dict[str, list[float]] = {"without": [], "with": []}
        order = ["without", "with", "with", "without"] * args.reps
        trainer_ips(data, base / "warmup", 3, 8, 64, None)  # caches, page cache: not measured
        for i, which in enumerate(order):
            v = trainer_ips(data, base / f"r{i}", args.epochs, 8, 64, args.every if which == "with" else None)
            ips[which].append(v)
            print(f"  trainer {which} sampling every {args.every:g} s: {v:.2f} images/s", flush=True)
        med = {k: statistics.median(v) for k, v in ips.items()}
        results["throughput"] = {
            "images_per_s": ips,
            "median": med,
            "ratio": med["with"] / med["without"],
            "every_s": args.every,
        }
        results["sampler"] = sampler_cpu(5 if args.quick else 20)
        print(f"  sampler: {results['sampler']}", flush=True)
        pace = pace_cost(20000)
        step_s = 8 / med["without"]
        results["pace"] = {
            **pace,
            "step_s": step_s,
            "share_per_step": (pace["per_step_s"] + pace["per_line_s"]) / step_s,
        }
        print(
            f"  pace: {pace['per_step_s'] * 1e6:.1f} µs per step, {pace['per_line_s'] * 1e6:.1f} µs per line; "
            f"a step takes {step_s * 1e3:.0f} ms",
            flush=True,
        )
        follow: dict[str, Any] = {}
        for which in ("without", "with"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.telemetry",
                    "--child",
                    which,
                    "--base",
                    str(base / f"follow-{which}"),
                    "--follow-nodes",
                    str(args.follow_nodes),
                    "--follow-seconds",
                    str(args.follow_seconds),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            follow[which] = json.loads(out.strip().splitlines()[-1])
            print(f"  follow {args.follow_nodes} nodes {which} telemetry: {follow[which]}", flush=True)
        results["follow"] = {"nodes": args.follow_nodes, **follow}
    results["load_after"] = os.getloadavg()
    results["summary"] = summary_rows(results)
    from bench.common import write

    name = "telemetry" if args.every == 1.0 else f"telemetry-every{args.every:g}s"
    dest = write(f"{name}.quick" if args.quick else name, results)
    print(f"wrote {dest}")
    return results


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    tp, pace, follow = results["throughput"], results["pace"], results["follow"]
    at_default = 1 - (1 - tp["ratio"]) * tp["every_s"] / 10.0  # each sample costs the same: slowdown x rate
    return [
        {
            "what": f"trainer images/s with the telemetry sampler every {tp['every_s']:g} s vs without",
            "orch": tp["median"]["with"],
            "peer": tp["median"]["without"],
            "ratio": tp["ratio"],
            "goal": ">= 0.99" if tp["every_s"] >= 10 else "report",
            **({"met": tp["ratio"] >= 0.99} if tp["every_s"] >= 10 else {}),
        },
        *(
            [
                {
                    "what": f"the same scaled to the default telemetry_s 10 (slowdown x {tp['every_s']:g} / 10)",
                    "orch": at_default,
                    "goal": ">= 0.99",
                    "met": at_default >= 0.99,
                }
            ]
            if tp["every_s"] < 10
            else []
        ),
        {
            "what": "per-rank timing (trainer/pace.py) cost per step, share of a step",
            "orch": pace["share_per_step"],
            "goal": "report",
        },
        {
            "what": "one telemetry sample's CPU (sampler + fake nvidia-smi), share of one core at telemetry_s 10",
            "orch": results["sampler"]["share_of_one_core_at_10s"],
            "goal": "report",
        },
        {
            "what": f"controller RSS MB following {follow['nodes']} nodes with telemetry + detector vs without",
            "orch": follow["with"]["peak_rss_mb"],
            "peer": follow["without"]["peak_rss_mb"],
            "ratio": follow["with"]["peak_rss_mb"] / follow["without"]["peak_rss_mb"],
            "goal": "<= 50 MB",
            "met": follow["with"]["peak_rss_mb"] <= 50,
        },
    ]


if __name__ == "__main__":
    main()
