"""Training images/s of ``python -m trainer`` against ultralytics' own trainer, side by side.

Same model, synthetic data, image size, batch, augmentation and accumulation (ultralytics derives
accumulate = nbs / batch; we pass the same ``--accumulate``), one process on CPU, no validation
until ultralytics' forced final one. The two alternate (A B B A ...), each in a fresh process.
Images/s comes from each run's own results.csv: the cumulative ``time`` column, skipping the
first epoch (worker start-up, caches) and the last (ultralytics always validates after it).

Loader workers: ultralytics' trainer sets ``workers=0`` on the CPU whatever it is asked
(engine/trainer.py: "faster CPU training as time dominated by inference"), so the default here is
0 for both: the same data path on each side. ``--workers N`` gives N to ours and says that the
peer still runs 0 (the JSON records both).

Usage: ``python bench/trainer_throughput.py [--model yolo12n.yaml --imgsz 128 --images 96 --batch 16
--epochs 5 --reps 2 --workers 0]``; writes ``bench/results/trainer_throughput.json``.
Goal: ratio (ours / ultralytics) >= 1.0.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PEER_NOTE = "PEER-NOTE"
"""Marks a line the ultralytics harness prints about what it changed in the peer's environment."""
ULTRALYTICS_RUN = """
import sys
from pathlib import Path
from trainer.offline import seed_font
seed_font()  # ultralytics' trainer calls check_font, which downloads unless the file is there
try:
    import polars  # noqa: F401
except ImportError:  # not on every machine (too big to carry to a GPU lease): read results.csv as polars would
    import csv
    from ultralytics.engine.trainer import BaseTrainer

    def _value(text):
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    def read_results_csv(self):
        try:
            with open(self.csv, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError:
            return {}
        return {k: [_value(r[k]) for r in rows] for k in (rows[0] if rows else {})}

    BaseTrainer.read_results_csv = read_results_csv
    print("PEER-NOTE polars is not installed: BaseTrainer.read_results_csv reads results.csv with the csv module")
from ultralytics import YOLO
model, data, imgsz, epochs, batch, workers, out, seed = sys.argv[1:9]
device, amp = (sys.argv[9], sys.argv[10] == "True") if len(sys.argv) > 10 else ("cpu", False)
YOLO(model).train(data=data, imgsz=int(imgsz), epochs=int(epochs), batch=int(batch), workers=int(workers),
                  device=device if device == "cpu" else int(device), amp=amp, plots=False, val=False,
                  optimizer="SGD", lr0=0.01, close_mosaic=0, warmup_epochs=1, project=str(Path(out).parent),
                  name=Path(out).name, exist_ok=True, seed=int(seed), verbose=False)
"""


def trainer_argv(
    model: str,
    data: Path,
    imgsz: int,
    epochs: int,
    batch: int,
    workers: int,
    accumulate: int,
    out: Path,
    device: str = "cpu",
    amp: str | None = None,
    val_period: int = 0,
) -> list[str]:
    """``python -m trainer`` arguments (after the interpreter) of one throughput run: the settings
    ultralytics' side gets below, validation every ``val_period`` epochs (0: only ultralytics'
    forced final one runs on its side, none on ours)."""
    return [
        "-m",
        "trainer",
        "--model",
        model,
        "--data",
        str(data),
        "--imgsz",
        str(imgsz),
        "--epochs",
        str(epochs),
        "--batch",
        str(batch),
        "--workers",
        str(workers),
        "--accumulate",
        str(accumulate),
        "--optimizer",
        "SGD",
        "--lr",
        "0.01",
        "--val-period",
        str(val_period),
        "--warmup-epochs",
        "1",
        "--cfg",
        "close_mosaic=0",
        "--out",
        str(out),
        "--log-every",
        "1000",
        "--device",
        device,
        "--plots",
        "false",  # as the peer's plots=False
        *(["--amp", amp] if amp else []),
    ]


def ultralytics_argv(
    model: str,
    data: Path,
    imgsz: int,
    epochs: int,
    batch: int,
    workers: int,
    out: Path,
    seed: int,
    device: str = "cpu",
    amp: bool = False,
) -> list[str]:
    """The arguments (after the interpreter) of ultralytics' ``YOLO().train()`` with the same
    settings: ``device`` cpu or a GPU index, ``amp`` its amp= (fp16 autocast on CUDA)."""
    return [
        "-c",
        ULTRALYTICS_RUN,
        model,
        str(data),
        str(imgsz),
        str(epochs),
        str(batch),
        str(workers),
        str(out),
        str(seed),
        device,
        str(amp),
    ]


def epoch_times(results_csv: Path) -> list[float]:
    """Per-epoch seconds from the cumulative ``time`` column."""
    with open(results_csv) as f:
        t = [float(r["time"]) for r in csv.DictReader(f)]
    return [b - a for a, b in zip([0.0, *t[:-1]], t)]


def middle_ips(results_csv: Path, images: int) -> float:
    """Images/s over all epochs but the first and the last."""
    times = epoch_times(results_csv)[1:-1]
    return images * len(times) / sum(times)


def run(cmd: list[str], env: dict[str, str]) -> float:
    """Run a command, fail loudly, return its wall seconds."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, object]:
    """Alternate both trainers ``--reps`` times and write the JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="yolo12n.yaml")
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--images", type=int, default=96, help="synthetic images in total (75%% train)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=5, help=">= 3: first and last epochs are not measured")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--workers",
        type=int,
        default=0,
        help="loader workers of ours (default 0: ultralytics runs 0 on the CPU whatever it is asked)",
    )
    ap.add_argument("--quick", action="store_true", help="3 epochs on 48 images, one repetition (smoke run)")
    a = ap.parse_args(argv)
    if a.quick:
        a.epochs, a.images, a.reps = 3, 48, 1
    if a.workers:
        print(
            f"{PEER_NOTE} --workers {a.workers}: ours runs {a.workers} loader workers, ultralytics' trainer 0 "
            "(it sets workers=0 on the CPU)",
            flush=True,
        )

    from trainer.offline import OFFLINE_ENV, set_offline_env

    set_offline_env()
    from trainer.synth import write_dataset

    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}  # the harness seeds ultralytics' font itself
    accumulate = max(round(64 / a.batch), 1)  # what ultralytics derives from nbs=64
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = write_dataset(root / "ds", images=a.images, classes=3, imgsz=a.imgsz)
        n_train = len(list((root / "ds" / "images" / "train").iterdir()))
        results: dict[str, list[float]] = {"trainer": [], "ultralytics": []}
        order = ["trainer", "ultralytics"]
        for rep in range(a.reps):
            for who in order if rep % 2 == 0 else order[::-1]:
                out = root / f"{who}{rep}"
                if who == "trainer":
                    run(
                        [
                            sys.executable,
                            *trainer_argv(a.model, data, a.imgsz, a.epochs, a.batch, a.workers, accumulate, out),
                        ],
                        env,
                    )
                else:
                    run(
                        [
                            sys.executable,
                            *ultralytics_argv(a.model, data, a.imgsz, a.epochs, a.batch, a.workers, out, 0),
                        ],
                        env,
                    )
                ips = middle_ips(out / "results.csv", n_train)
                results[who].append(ips)
                print(f"rep {rep} {who:12s} {ips:7.2f} images/s", flush=True)
    ours, theirs = statistics.median(results["trainer"]), statistics.median(results["ultralytics"])
    summary = {
        "what": "training images/s, single CPU process, python -m trainer vs ultralytics YOLO().train()",
        "model": a.model,
        "imgsz": a.imgsz,
        "train_images": n_train,
        "batch": a.batch,
        "accumulate": accumulate,
        "epochs": a.epochs,
        "measured_epochs": a.epochs - 2,
        "reps": a.reps,
        "workers": {"trainer": a.workers, "ultralytics": 0},
        "ips": results,
        "median_ips": {"trainer": ours, "ultralytics": theirs},
        "ratio": ours / theirs,
        "summary": [
            {
                "what": f"training images/s, {a.model} {a.imgsz}px batch {a.batch}, 1 CPU process, "
                "python -m trainer vs ultralytics YOLO().train()",
                "orch": ours,
                "peer": theirs,
                "ratio": ours / theirs,
                "goal": ">= 1.0",
                "met": ours >= theirs,
            }
        ],
    }
    from bench.common import write

    path = write("trainer_throughput", summary)
    print(f"ratio trainer/ultralytics = {ours / theirs:.3f} ({ours:.2f} vs {theirs:.2f} images/s) -> {path}")
    return summary


if __name__ == "__main__":
    main()
