"""`make bench`: run every benchmark, then write bench/results/summary.md and summary.png.

Each benchmark module has `main(argv) -> dict` and writes bench/results/<name>.json. Each runs
in a process of its own, so what one leaves behind (imports such as torch, freed heap, threads)
does not show in another's memory or time figures. A benchmark that cannot run here (a missing
peer tool, say) is reported as skipped with the reason; the others still run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCHMARKS = (
    "check_fanout",
    "launch_latency",
    "log_merge",
    "trainer_throughput",
    "trainer_accuracy",
    "ddp_compression",
    "scale",
    "fabric",
    "telemetry",
    "report_top_memory",
    "image_push",
    "launch_latency_container",
    "broadcast",
    "slurm_launch",
)
TOOLS = ("gpu_smoke", "gpu_syncs", "gpu_wheels")
"""Scripts under bench/ that `make bench` does not run: the one-shot GPU validation (`make gpu-smoke`),
its sync counter, and the wheels it needs on the GPU machine (`make gpu-wheels`)."""
LIBRARIES = ("common", "summary", "steps")
"""Modules of bench/ that are no script."""


ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="*", default=list(BENCHMARKS), help=f"subset of {', '.join(BENCHMARKS)}")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (smoke run)")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}")
    failed = []
    for name in args.names:
        print(f"== bench {name}", flush=True)
        argv = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else [])]
        if subprocess.run(argv, cwd=ROOT).returncode != 0:
            failed.append(name)
    from bench.summary import write_summary

    path = write_summary()
    print(f"summary: {path}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
