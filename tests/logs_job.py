"""A torchrun worker for the `orch logs` end-to-end test: prints `[rank R] seq=I` lines.

Each node prints at its own rate (node rank 0 fastest), for LOGS_JOB_SECONDS, on stdout and every
fifth line on stderr, then exits 0. Needs no torch: only torchrun's environment."""

import os
import sys
import time

rank, node_rank = int(os.environ["RANK"]), int(os.environ.get("ORCH_NODE_RANK", "0"))
seconds = float(os.environ.get("LOGS_JOB_SECONDS", "6"))
interval = 0.05 * (node_rank + 1)
count = int(seconds / interval)
for i in range(count):
    stream = sys.stderr if i % 5 == 4 else sys.stdout
    print(f"[rank {rank}] seq={i} of {count}", file=stream, flush=True)
    time.sleep(interval)
