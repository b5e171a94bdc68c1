"""`make bench`: run every benchmark, then write bench/results/summary.md and summary.png.

Each benchmark module has `main(argv) -> dict` and writes bench/results/<name>.json. A
benchmark that cannot run here (a missing peer tool, say) is reported as skipped with the reason;
the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import traceback

BENCHMARKS = ("check_fanout", "launch_latency", "log_merge", "trainer_throughput", "scale", "fabric")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("names", nargs="*", default=list(BENCHMARKS), help=f"subset of {', '.join(BENCHMARKS)}")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (smoke run)")
    args = ap.parse_args()
    failed = []
    for name in args.names:
        print(f"== bench {name}", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            module.main(["--quick"] if args.quick else [])
        except SystemExit as exc:
            if exc.code not in (0, None):
                failed.append(name)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    from bench.summary import write_summary

    path = write_summary()
    print(f"summary: {path}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
