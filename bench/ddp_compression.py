"""DDP's gradient all-reduce in fp16 (``--ddp-grad-dtype fp16``, DDP's compression hook) against
fp32, side by side: the same 2-rank run of ``python -m trainer`` under torchrun (gloo on CPU; on a
GPU, ``--device 0 --dist-backend gloo``: two ranks on one GPU), seeds alternating the sides.

Each run counts, in its all-reduce hook, the bytes each rank sends per optimizer step (``--debug-dir``
records them; fp32 goes through the same hook to be counted), and ends with the trainer's final
validation of best.pt over every rank's shard (its ``final val`` line, the figure ``orch report``
shows). Validation runs after the last epoch only, so best.pt is the last epoch's weights.

Goals: fp16's bytes per step are half of fp32's; its final mAP50-95 (mean over the seeds) is
within the run-to-run noise of fp32's: ``NOISE``, what ``bench/trainer_accuracy.py`` measured
between two seeds of one trainer, or the spread between this run's own seeds where that is larger.

Usage: ``python -m bench.ddp_compression [--dtypes fp32,fp16] [--seeds 0,1] [--epochs 20] [--device cuda]``;
writes ``bench/results/ddp_compression.json`` (``--quick``: ``ddp_compression.quick.json``).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NOISE = 0.03
"""mAP50-95 two seeds of one trainer differ by on the accuracy benchmark's set (bench/README.md,
trainer_accuracy: "single seeds differ by up to 0.03 on either side")."""
RANKS = 2


def trainer_argv(
    data: Path,
    out: Path,
    dtype: str,
    seed: int,
    *,
    model: str = "yolo12n.yaml",
    imgsz: int = 128,
    epochs: int = 20,
    batch: int = 16,
    workers: int = 1,
    device: str = "cpu",
    port: int = 29500,
    amp: str | None = None,
) -> list[str]:
    """The command (after the interpreter) of one side: torchrun, ``RANKS`` ranks on this machine,
    gradients all-reduced in ``dtype`` and counted in the hook (``--debug-dir OUT/debug``); on a GPU
    the ranks share it over gloo (NCCL refuses two ranks on one device)."""
    gpu = device != "cpu"
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(RANKS),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "trainer",
        *("--model", model, "--data", str(data), "--imgsz", str(imgsz), "--epochs", str(epochs)),
        *("--batch", str(batch), "--workers", str(workers), "--seed", str(seed), "--val-period", str(epochs)),
        *("--device", "cuda" if gpu else "cpu", *(["--dist-backend", "gloo"] if gpu else [])),
        *(["--amp", amp] if amp else []),
        *("--ddp-grad-dtype", dtype, "--debug-dir", str(out / "debug"), "--out", str(out)),
        *("--log-every", "1000", "--plots", "false"),
    ]


def read_side(out: Path, stdout: str) -> dict[str, Any]:
    """What one run left: its final validation (rank 0's ``final val`` line) and every rank's
    all-reduce record (``--debug-dir``)."""
    from trainer.logs import parse_final

    final = parse_final(stdout.splitlines())
    if final is None:
        raise SystemExit(f"{out}: no final val line in the output\n{stdout[-3000:]}")
    comm = [json.loads((out / "debug" / f"rank{r}.json").read_text())["grad_comm"] for r in range(RANKS)]
    metrics = final[2]
    return {
        "map50_95": metrics["metrics/mAP50-95(B)"],
        "map50": metrics["metrics/mAP50(B)"],
        "bytes_per_step": [c["bytes_per_step"] for c in comm],
        "steps": comm[0]["steps"],
        "dtype": comm[0]["dtype"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train each dtype once per seed, alternating which goes first; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dtypes", default="fp32,fp16", help="comma-separated --ddp-grad-dtype values; the first is the reference"
    )
    ap.add_argument("--model", default="yolo12n.yaml")
    ap.add_argument("--images", type=int, default=400, help="synthetic images in total (75%% train)")
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16, help="global batch over the 2 ranks")
    ap.add_argument("--workers", type=int, default=1, help="loader workers per rank")
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds; each dtype trains once per seed")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: both ranks on GPU 0, over gloo")
    ap.add_argument("--amp", default=None, help="--amp of the runs (default: the trainer's: fp16 on a GPU)")
    ap.add_argument("--out", type=Path, help="where the JSON goes (default bench/results/)")
    ap.add_argument("--quick", action="store_true", help="2 epochs on 32 images, one seed (smoke run)")
    a = ap.parse_args(argv)
    if a.quick:
        a.epochs, a.images, a.seeds = 2, 32, "0"

    from tests.ports import job_port
    from trainer.offline import OFFLINE_ENV
    from trainer.synth import write_dataset

    dtypes = a.dtypes.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    runs: dict[str, list[dict[str, Any]]] = {d: [] for d in dtypes}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = write_dataset(root / "data", images=a.images, classes=3, imgsz=a.imgsz)
        for i, seed in enumerate(seeds):
            for dtype in dtypes if i % 2 == 0 else list(reversed(dtypes)):
                out = root / f"{dtype}-{seed}"
                argv_ = trainer_argv(
                    data,
                    out,
                    dtype,
                    seed,
                    model=a.model,
                    imgsz=a.imgsz,
                    epochs=a.epochs,
                    batch=a.batch,
                    workers=a.workers,
                    device=a.device,
                    port=job_port(),
                    amp=a.amp,
                )
                t0 = time.perf_counter()
                p = subprocess.run([sys.executable, *argv_], capture_output=True, text=True, env=env, cwd=REPO)
                seconds = time.perf_counter() - t0
                if p.returncode:
                    raise SystemExit(f"failed: {' '.join(argv_)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
                side = {"seed": seed, "seconds": round(seconds, 1), **read_side(out, p.stdout)}
                runs[dtype].append(side)
                print(
                    f"seed {seed} {dtype}: mAP50-95 {side['map50_95']:.4f}, {side['bytes_per_step'][0] / 1e6:.3f} MB "
                    f"per step per rank, {seconds:.0f} s",
                    flush=True,
                )
    ref = dtypes[0]
    summary: dict[str, Any] = {
        "what": "2 ranks of python -m trainer (torchrun, gloo), the gradient all-reduce in each dtype, same data "
        "and seeds: final mAP50-95 of best.pt (the trainer's final validation) and bytes per optimizer step per "
        "rank (counted in the all-reduce hook)",
        "device": a.device,
        "model": a.model,
        "images": a.images,
        "imgsz": a.imgsz,
        "epochs": a.epochs,
        "batch": a.batch,
        "seeds": seeds,
        "noise": NOISE,
        "runs": runs,
        "summary": [],
    }
    spread = max((max(r["map50_95"] for r in rs) - min(r["map50_95"] for r in rs)) for rs in runs.values())
    allowed = max(NOISE, spread)
    for dtype in dtypes[1:]:
        ours, theirs = runs[dtype], runs[ref]
        bytes_ratio = ours[0]["bytes_per_step"][0] / theirs[0]["bytes_per_step"][0]
        summary["summary"].append(
            {
                "what": f"bytes per optimizer step per rank, {a.model} DDP all-reduce in {dtype} vs {ref}, 2 ranks "
                f"on {a.device}",
                "orch": ours[0]["bytes_per_step"][0],
                "peer": theirs[0]["bytes_per_step"][0],
                "ratio": bytes_ratio,
                "goal": "= 0.5" if dtype in ("fp16", "bf16") else "report",
                "met": bytes_ratio == 0.5 if dtype in ("fp16", "bf16") else None,
            }
        )
        mine, peer = statistics.mean(r["map50_95"] for r in ours), statistics.mean(r["map50_95"] for r in theirs)
        summary["summary"].append(
            {
                "what": f"final mAP50-95, {a.model} {a.imgsz}px {a.epochs} epochs, mean of {len(seeds)} seed(s), "
                f"DDP all-reduce in {dtype} vs {ref}, 2 ranks on {a.device}",
                "orch": mine,
                "peer": peer,
                "ratio": mine / peer if peer else None,
                "goal": f"difference within ±{allowed:.3g} (run-to-run noise)",
                "met": abs(mine - peer) <= allowed,
            }
        )
    summary["spread"] = spread
    from bench.common import write

    name = "ddp_compression.quick" if a.quick else "ddp_compression"
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        path = a.out / f"{name}.json"
        path.write_text(json.dumps(summary, indent=2) + "\n")
    else:
        path = write(name, summary)
    for row in summary["summary"]:
        ratio = f"{row['ratio']:.4g}" if row["ratio"] is not None else "n/a"
        print(f"{row['what']}: {row['orch']:.6g} vs {row['peer']:.6g} = {ratio}, met {row['met']} -> {path}")
    return summary


if __name__ == "__main__":
    main()
