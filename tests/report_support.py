"""A run directory as `orch up` leaves it (run.json, check.json, node logs, results.csv), for the
report tests (tests/unit/test_report.py, tests/local/test_report_chromium.py), and the reading of a
report's summary card (`card`, for those and the integration tests that run `orch report`)."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

from orchestrator.store import RunDir

RESULTS = """                  epoch,         train/box_loss,         train/cls_loss,         train/dfl_loss,   metrics/precision(B),      metrics/recall(B),       metrics/mAP50(B),    metrics/mAP50-95(B),           val/box_loss,           val/cls_loss,           val/dfl_loss,                 lr/pg0
                      1,                 3.1,                 4.2,                 2.9,                 0.01,                 0.02,                 0.003,                 0.001,                 3.0,                 4.0,                 2.8,                 0.0001
                      2,                 2.7,                 3.5,                 2.5,                 0.05,                 0.09,                 0.02,                 0.008,                 2.8,                 3.6,                 2.6,                 0.0002
                      3,                 2.2,                 2.9,                 2.1,                 0.12,                 0.20,                 0.09,                 0.03,                 2.4,                 3.1,                 2.3,                 0.0003
"""


def node_log(node_rank: int) -> str:
    ts = "2026-11-30T09:32:0{}.000000Z"
    lines = [f"{ts.format(node_rank)} orch agent started torchrun pid 123"]
    for epoch in (1, 2):
        lines.append(
            f"{ts.format(node_rank)} out [default0]:[rank {node_rank}] throughput epoch {epoch}: rank  images/s  data-wait"
        )
        lines.append(
            f"{ts.format(node_rank)} out [default0]:[rank {node_rank}] throughput epoch {epoch}: "
            f"{node_rank:>4}  {10.0 * epoch + node_rank:8.1f}  {12.5:8.1f}%"
        )
    lines.append(
        f"{ts.format(node_rank)} out [default0]:[rank 0] throughput epoch 2: total 41.0 images/s over 2 ranks, "
        "scaling efficiency 91.1% of 2 x 22.5 images/s"
    )
    if node_rank == 0:  # rank 0's epoch, validation, final and done lines, as the trainer writes them
        from trainer.logs import done_line, epoch_line, final_line, val_line

        t = "2026-11-30T09:33:{:02d}.000000Z out [default0]:[rank 0] "
        for epoch in (1, 2, 3):
            lines.append(t.format(10 * epoch) + epoch_line(epoch, 3, {"box_loss": 3.0 - epoch / 2}, {"lr/pg0": 0.001}))
            lines.append(
                t.format(10 * epoch + 4)
                + val_line(epoch, 3, {"metrics/mAP50(B)": 0.1 * epoch, "metrics/mAP50-95(B)": 0.01 * epoch})
            )
        lines.append(
            t.format(45) + final_line("best.pt", 3, {"metrics/mAP50(B)": 0.0905, "metrics/mAP50-95(B)": 0.0301})
        )
        lines.append(
            t.format(46) + done_line(3, 46.0, "/srv/runs/train/exp/weights", "/srv/runs/train/exp/results.csv")
        )
    return "\n".join(lines) + "\n"


def make_run(tmp_path: Path, failed: bool = False) -> RunDir:
    run = RunDir(tmp_path / "20261130-093200-demo")
    run.path.mkdir(parents=True)
    now = time.time()
    nodes = [
        {
            "node": f"node{i}",
            "node_rank": i,
            "host": "localhost",
            "state": "failed" if failed and i else "succeeded",
            "exit_code": 1 if failed and i else 0,
            "pid": 100 + i,
            "started_at": now - 60,
            "finished_at": now - 5,
            "base_rank": i,
            "nproc": 1,
        }
        for i in range(2)
    ]
    info = {
        "run": run.run_id,
        "inventory": "inventory/local.yaml",
        "created": now - 62,
        "finished_at": now - 4,
        "state": "failed" if failed else "succeeded",
        "nodes": nodes,
        "wall_s": 57.3,
        "attempt": 2,
        "max_attempts": 3,
        "attempts": [
            {
                "attempt": 1,
                "result": "failed",
                "ended": now - 40,
                "first_failure": {"node": "node1", "rank": 1, "exit_code": 3, "reason": "exit code 3"},
            }
        ],
    }
    if failed:
        info["first_failure"] = {
            "node": "node1",
            "rank": 1,
            "exit_code": 1,
            "reason": "exited with code 1",
            "cause": "killed by SIGKILL",
            "signal": "SIGKILL",
            "hint": "the OOM killer <usually>",
            "excerpt": ["Traceback (most recent call last):", "RuntimeError: boom <&>"],
        }
    run.write(info)
    run.write(
        {
            "run": run.run_id,
            "world_size": 2,
            "nodes": [
                {
                    "node": f"node{i}",
                    "argv": [
                        "python",
                        "-m",
                        "torch.distributed.run",
                        "--nnodes=2",
                        "-m",
                        "trainer",
                        "--epochs",
                        "3",
                        "--batch",
                        "16",
                    ],
                }
                for i in range(2)
            ],
        },
        "plan.json",
    )
    (run.path / "inventory.yaml").write_text(
        "name: demo\ntransport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n"
        "env:\n  SECRET_TOKEN: hunter2\njob:\n  module: trainer\n  args: {epochs: 3, batch: 16}\n"
    )
    run.write(
        {
            "results": [
                {"check": "ssh", "node": "node0", "status": "ok", "value": "3 ms", "detail": "", "hint": ""},
                {
                    "check": "gpus",
                    "node": "node0",
                    "status": "skip",
                    "value": None,
                    "detail": "no gpus declared",
                    "hint": "",
                },
            ]
        },
        "check.json",
    )
    (run.path / "nodes").mkdir()
    for i in range(2):
        (run.path / "nodes" / f"node{i}.log").write_text(node_log(i))
    (run.path / "results.csv").write_text(RESULTS)
    return run


def png_size(data: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def card(text: str) -> dict[str, str]:
    """The summary card's fields of a report page: data-key -> data-value (the raw number or text)."""
    section = text[text.index("<section id='summary'") :]
    section = section[: section.index("</section>")]
    return dict(re.findall(r"data-key='([a-z_0-9]+)' data-value='([^']*)'", section))
