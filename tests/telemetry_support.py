"""Telemetry and timing lines as the node agent and the trainer write them, for the `orch top`,
straggler and report tests: GPUs from the recorded sets in tests/fixtures/telemetry/ (what the
fake nvidia-smi answers), ranks' timing windows with one rank as slow as a test wants."""

from __future__ import annotations

import csv
from pathlib import Path

from orchestrator.logs.lines import format_ts
from orchestrator.node import telemetry
from orchestrator.store import RunDir
from trainer.logs import rank_prefix, timing_line

FIX = Path(__file__).resolve().parent / "fixtures" / "telemetry"


def recorded_gpus(name: str) -> list[dict[str, object]]:
    """The set's GPUs as the sampler parses the fake nvidia-smi's answer (the same columns)."""
    with open(FIX / name / "gpus.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return telemetry.parse_gpu_csv("\n".join(", ".join(r[f] for f in telemetry.GPU_FIELDS) for r in rows))


def telemetry_text(name: str | None, ranks: list[int], cpu: float = 50.0) -> str:
    gpus = recorded_gpus(name) if name else []
    sample = {
        "v": 1,
        "gpus": gpus,
        "gpu_error": None if name else "nvidia-smi: not found in PATH",
        "cpu_pct": cpu,
        "load1": 1.5,
        "ncpu": 16,
        "mem_used_mb": 2048,
        "mem_total_mb": 65536,
        "ranks": [
            {"rank": r, "local_rank": i, "pid": 1000 + r, "cpu_pct": 98.0, "rss_mb": 512.0} for i, r in enumerate(ranks)
        ],
    }
    return telemetry.line(sample)


def node_log(
    ts0: float,
    gpu_set: str | None,
    ranks: list[int],
    slow: dict[int, tuple[float, float]],
    windows: int = 4,
    cpu: float = 50.0,
) -> str:
    """A node log: a telemetry line, then `windows` timing windows of each rank (60 s apart)."""
    out = [
        f"{format_ts(ts0)} orch agent 1 on host starting: python -m torch.distributed.run ...",
        f"{format_ts(ts0 + 1)} orch {telemetry_text(gpu_set, ranks, cpu)}",
    ]
    for k in range(1, windows + 1):
        for i, r in enumerate(ranks):
            compute, data = slow.get(r, (1.0, 0.01))
            text = timing_line(1, 10 * k, 10, 80, data, compute, 5.0)
            out.append(f"{format_ts(ts0 + 60 * k + 0.001 * r)} out [default{i}]:{rank_prefix(r)}{text}")
    return "\n".join(out) + "\n"


INVENTORY = """name: toptest
transport: local
nodes:
{nodes}
job:
  python: python3
  nproc_per_node: {nproc}
  telemetry_s: 10
  straggler: {{share: 0.8, windows: 2}}
"""


def make_top_run(
    tmp_path: Path,
    sets: list[str | None],
    nproc: int = 1,
    slow: dict[int, tuple[float, float]] | None = None,
    ts0: float = 1_796_000_000.0,
) -> RunDir:
    """A stored run of len(sets) nodes `n1`..., node i's GPUs from sets[i]."""
    run = RunDir(tmp_path / "runs" / "20261130-093200-toptest")
    (run.path / "nodes").mkdir(parents=True)
    names = [f"n{i + 1}" for i in range(len(sets))]
    (run.path / "inventory.yaml").write_text(
        INVENTORY.format(nodes="\n".join(f"  - {{host: localhost, name: {n}}}" for n in names), nproc=nproc)
    )
    nodes = [
        {
            "node": n,
            "node_rank": i,
            "base_rank": i * nproc,
            "nproc": nproc,
            "host": "localhost",
            "state": "running",
            "remote_dir": str(tmp_path / "remote" / n),
            "python": "python3",
        }
        for i, n in enumerate(names)
    ]
    run.write({"run": run.run_id, "inventory": str(run.path / "inventory.yaml"), "state": "running", "nodes": nodes})
    for i, (n, gpu_set) in enumerate(zip(names, sets)):
        ranks = list(range(i * nproc, (i + 1) * nproc))
        (run.path / "nodes" / f"{n}.log").write_text(node_log(ts0, gpu_set, ranks, slow or {}))
    return run
