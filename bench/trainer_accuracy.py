"""How well ``python -m trainer`` learns against ultralytics' own trainer, side by side.

The same synthetic data (400 images of 128 px, 3 classes: drawn shapes, polygon labels for the
-seg model), the same model, epochs, image size and batch, and every other hyperparameter left at
each side's default (ours are ultralytics' own): ``python -m trainer`` against ``YOLO().train()``,
one CPU process each, seeds alternating. Each run's ``best.pt`` is then scored by one evaluator
for both sides (``YOLO(best.pt).val()`` in a fresh process), and the per-epoch validation curves
come from each run's results.csv.

Usage: ``python -m bench.trainer_accuracy [--models yolo12n.yaml,yolo12n-seg.yaml --epochs 20 --seeds 0,1]``;
writes ``bench/results/trainer_accuracy.json`` and ``trainer_accuracy.png`` (the curves).
Goal: final mAP50-95 of ours >= 0.97 x ultralytics' (box, and mask for -seg), on the mean over seeds.
"""

from __future__ import annotations

import argparse
import csv
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

ULTRALYTICS_RUN = """
import sys
from pathlib import Path
from ultralytics import YOLO
model, data, imgsz, epochs, batch, workers, out, seed = sys.argv[1:9]
YOLO(model).train(data=data, imgsz=int(imgsz), epochs=int(epochs), batch=int(batch), workers=int(workers),
                  device="cpu", plots=False, project=str(Path(out).parent), name=Path(out).name, exist_ok=True,
                  seed=int(seed), verbose=False)
"""

EVALUATE = """
import json, sys
from ultralytics import YOLO
weights, data, imgsz = sys.argv[1:4]
device = sys.argv[4] if len(sys.argv) > 4 else "cpu"
m = YOLO(weights).val(data=data, imgsz=int(imgsz), batch=32, device=device if device == "cpu" else int(device),
                      plots=False, verbose=False, workers=0)
out = {"box": {"map50": float(m.box.map50), "map": float(m.box.map)}}
if hasattr(m, "seg"):
    out["mask"] = {"map50": float(m.seg.map50), "map": float(m.seg.map)}
print("RESULT " + json.dumps(out))
"""


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Run a command, fail loudly, return its wall seconds and stdout."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if p.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0, p.stdout


def curves(results_csv: Path) -> dict[str, list[float]]:
    """Per-epoch validation mAP columns of a results.csv (both trainers write ultralytics' names)."""
    with open(results_csv) as f:
        rows = [{k.strip(): v for k, v in r.items()} for r in csv.DictReader(f)]
    keys = [
        k
        for k in ("metrics/mAP50(B)", "metrics/mAP50-95(B)", "metrics/mAP50(M)", "metrics/mAP50-95(M)")
        if k in rows[0]
    ]
    return {k: [float(r[k]) for r in rows] for k in keys}


def evaluate_argv(weights: Path, data: Path, imgsz: int, device: str = "cpu") -> list[str]:
    """The arguments (after the interpreter) of the evaluator: ``YOLO(weights).val()`` on ``device``
    (cpu or a GPU index), ultralytics' defaults otherwise (fp32, batch 32)."""
    return ["-c", EVALUATE, str(weights), str(data), str(imgsz), device]


def parse_evaluation(stdout: str) -> dict[str, dict[str, float]]:
    """The evaluator's ``RESULT {json}`` line: ``{"box": {"map50", "map"}[, "mask": ...]}``."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise ValueError("the evaluator printed no RESULT line")
    return dict(json.loads(line[len("RESULT ") :]))


def evaluate(weights: Path, data: Path, imgsz: int, env: dict[str, str]) -> dict[str, dict[str, float]]:
    """One evaluator for both sides: ultralytics' validator on the run's best.pt, in a fresh process."""
    _, out = run([sys.executable, *evaluate_argv(weights, data, imgsz)], env)
    return parse_evaluation(out)


def train(who: str, model: str, data: Path, out: Path, a: argparse.Namespace, seed: int, env: dict[str, str]) -> float:
    """One training run of ``who``; returns its wall seconds."""
    if who == "trainer":
        cmd = [
            sys.executable,
            "-m",
            "trainer",
            "--model",
            model,
            "--data",
            str(data),
            "--imgsz",
            str(a.imgsz),
            "--epochs",
            str(a.epochs),
            "--batch",
            str(a.batch),
            "--workers",
            str(a.workers),
            "--device",
            "cpu",
            "--seed",
            str(seed),
            "--out",
            str(out),
            "--log-every",
            "1000",
            "--plots",
            "false",
        ]  # as the peer's
    else:
        cmd = [
            sys.executable,
            "-c",
            ULTRALYTICS_RUN,
            model,
            str(data),
            str(a.imgsz),
            str(a.epochs),
            str(a.batch),
            str(a.workers),
            str(out),
            str(seed),
        ]
    return run(cmd, env)[0]


def plot(summary: dict[str, Any], path: Path) -> None:
    """Per-epoch mAP50-95 of both sides (every seed), one panel per model and box/mask."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (m, k)
        for m, r in summary["models"].items()
        for k in ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)")
        if k in r["runs"]["trainer"][0]["curves"]
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (model, key) in zip(axes[0], panels):
        for who, colour in (("trainer", "#1f77b4"), ("ultralytics", "#ff7f0e")):
            for i, r in enumerate(summary["models"][model]["runs"][who]):
                ys = r["curves"][key]
                ax.plot(
                    range(1, len(ys) + 1),
                    ys,
                    color=colour,
                    alpha=0.85,
                    label=("python -m trainer" if who == "trainer" else "ultralytics YOLO().train()")
                    if i == 0
                    else None,
                )
        ax.set_title(f"{model.removesuffix('.yaml')} {'mask' if key.endswith('(M)') else 'box'} mAP50-95", fontsize=9)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Train both sides for every model and seed, score them, write the JSON and the plot."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="yolo12n.yaml,yolo12n-seg.yaml", help="comma-separated model YAMLs")
    ap.add_argument("--images", type=int, default=400, help="synthetic images in total (75%% train)")
    ap.add_argument("--imgsz", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=20, help="training epochs (>= 15 for the goal)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", default="0,1", help="comma-separated seeds; each side trains once per seed")
    ap.add_argument("--quick", action="store_true", help="3 epochs on 64 images, one seed, detection only (smoke run)")
    a = ap.parse_args(argv)
    if a.quick:
        a.epochs, a.images, a.seeds, a.models = 3, 64, "0", "yolo12n.yaml"

    from trainer.offline import OFFLINE_ENV, set_offline_env

    set_offline_env()
    from trainer.offline import seed_font
    from trainer.synth import write_dataset

    seed_font()  # ultralytics' trainer calls check_font, which downloads unless the file is there
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": str(REPO)}
    seeds = [int(s) for s in a.seeds.split(",")]
    summary: dict[str, Any] = {
        "what": "final mAP50-95 of best.pt (one evaluator for both) and per-epoch curves, python -m trainer vs "
        "ultralytics YOLO().train(), default hyperparameters, one CPU process",
        "images": a.images,
        "imgsz": a.imgsz,
        "classes": 3,
        "epochs": a.epochs,
        "batch": a.batch,
        "workers": a.workers,
        "seeds": seeds,
        "models": {},
        "summary": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in a.models.split(","):
            seg = "-seg" in model
            data = write_dataset(
                root / ("seg" if seg else "det"), images=a.images, classes=3, imgsz=a.imgsz, segments=seg
            )
            runs: dict[str, list[dict[str, Any]]] = {"trainer": [], "ultralytics": []}
            for i, seed in enumerate(seeds):
                for who in ("trainer", "ultralytics") if i % 2 == 0 else ("ultralytics", "trainer"):
                    out = root / f"{Path(model).stem}-{who}-{seed}"
                    seconds = train(who, model, data, out, a, seed, env)
                    scores = evaluate(out / "weights" / "best.pt", data, a.imgsz, env)
                    runs[who].append(
                        {"seed": seed, "seconds": seconds, "final": scores, "curves": curves(out / "results.csv")}
                    )
                    print(
                        f"{model} seed {seed} {who:12s} {seconds:6.0f} s  "
                        + "  ".join(f"{k} mAP50-95 {v['map']:.4f}" for k, v in scores.items()),
                        flush=True,
                    )
            entry: dict[str, Any] = {"runs": runs, "ratio": {}}
            for part in ("box", "mask") if seg else ("box",):
                ours = statistics.mean(r["final"][part]["map"] for r in runs["trainer"])
                theirs = statistics.mean(r["final"][part]["map"] for r in runs["ultralytics"])
                ratio = ours / theirs if theirs > 0 else None
                entry["ratio"][part] = ratio
                summary["summary"].append(
                    {
                        "what": f"final {part} mAP50-95, {Path(model).stem} {a.imgsz}px {a.epochs} epochs, "
                        f"mean of {len(seeds)} seed(s), python -m trainer vs ultralytics YOLO().train()",
                        "orch": ours,
                        "peer": theirs,
                        "ratio": ratio,
                        "goal": ">= 0.97",
                        "met": ratio is not None and ratio >= 0.97,
                    }
                )
            summary["models"][model] = entry
    from bench.common import RESULTS, write

    name = "trainer_accuracy.quick" if a.quick else "trainer_accuracy"
    path = write(name, summary)
    if not a.quick:
        plot(summary, RESULTS / f"{name}.png")
    for row in summary["summary"]:
        print(f"{row['what']}: {row['orch']:.4f} vs {row['peer']:.4f} = {row['ratio']} -> {path}")
    return summary


if __name__ == "__main__":
    main()
