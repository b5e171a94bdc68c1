"""ultralytics' plots and per-class table at the end of training: drawn by ultralytics' own code
from the whole validation set (every rank's shard), offline (a fresh font directory, the network
blocked), and none of the files with plots off. Two small runs at once (64 px, 1 epoch)."""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import make_dataset, run_trainer  # noqa: E402

pytestmark = pytest.mark.timeout(600)

PLOTS = {
    "results.png",
    "confusion_matrix.png",
    "confusion_matrix_normalized.png",
    *(f"{kind}{curve}_curve.png" for kind in ("Box", "Mask") for curve in ("PR", "F1", "P", "R")),
}
"""What ultralytics 8.4's trainer writes for a segmentation run with plots=True (its matplotlib plots)."""
PIL_PLOTS = {"val_batch0_labels.jpg", "val_batch0_pred.jpg"}
"""Its validation images, drawn with a PIL font."""
HEADER = ("%22s" + "%11s" * 6) % ("Class", "Images", "Instances", "Box(P", "R", "mAP50", "mAP50-95)")


def val_labels(data: Path) -> tuple[int, dict[int, int]]:
    """The validation set's image count and instances per class, from its label files."""
    files = sorted((data.parent / "labels" / "val").glob("*.txt"))
    per_class: dict[int, int] = {}
    for f in files:
        for line in f.read_text().split("\n"):
            if line.strip():
                per_class[int(line.split()[0])] = per_class.get(int(line.split()[0]), 0) + 1
    return len(files), per_class


def table(lines: list[str]) -> list[list[str]]:
    """The per-class table's rows after its header line, split into cells (prefix dropped)."""
    text = [ln.removeprefix("[rank 0] ") for ln in lines]
    start = next(i for i, ln in enumerate(text) if ln.startswith(HEADER[:40]) and "Instances" in ln)
    rows = []
    for ln in text[start + 1 :]:
        cells = ln.split()
        if len(cells) < 7 or not (cells[1].isdigit() and cells[2].isdigit()):
            break
        rows.append(cells)
    return rows


def test_plots_and_class_table_from_every_shard_offline_and_none_with_plots_off(tmp_path: Path) -> None:
    """2 ranks, plots on (ultralytics' default), the network blocked, beside a run with plots=False:
    every plot drawn from every rank's shard by rank 0, which alone creates the run directory."""
    data = make_dataset(tmp_path / "ds", images=12, classes=2, imgsz=64, segments=True)  # 3 val images
    images, per_class = val_labels(data)
    common = [
        "--data",
        str(data),
        "--epochs",
        "1",
        "--batch",
        "4",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--seed",
        "1",
        "--warmup-epochs",
        "0",
    ]
    on, off = tmp_path / "on", tmp_path / "off"
    net, confusion, fonts = tmp_path / "net.log", tmp_path / "confusion.jsonl", tmp_path / "yolo-config"
    made = tmp_path / "mkdir.log"
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(
            run_trainer,
            [*common, "--model", "yolo12n-seg.yaml", "--out", str(on)],
            nproc=2,
            blocked_net_log=net,
            confusion_log=confusion,
            extra_env={"YOLO_CONFIG_DIR": str(fonts)},
            default_plots=True,
            mkdir_log=made,
        )  # no plots flag: ultralytics' default, plots on
        b = pool.submit(run_trainer, [*common, "--model", "yolo12n.yaml", "--out", str(off), "plots=False"])
        first, second = a.result(), b.result()
    assert first.returncode == 0, first.explain()
    assert second.returncode == 0, second.explain()

    # Every plot ultralytics writes, by its own code, with a font directory that started empty
    # and the network blocked: nothing tried to download (check_font found the seeded font).
    assert not net.exists(), f"network attempts: {net.read_text()}"
    written = {p.name for p in on.iterdir() if p.suffix in (".png", ".jpg")}
    assert written >= PLOTS | PIL_PLOTS, sorted(written)

    # The confusion matrix is the whole validation set's (the ranks' matrices summed), never rank 0's
    # shard: each ground-truth instance lies in exactly one cell of its class's column.
    drawn = [json.loads(ln) for ln in confusion.read_text().splitlines()]
    assert {d["rank"] for d in drawn} == {0} and len(drawn) == 2, drawn
    matrix = drawn[0]["matrix"]
    nc = len(per_class)
    assert [sum(row[c] for row in matrix) for c in range(nc)] == [per_class[c] for c in range(nc)]

    # ultralytics' per-class table: header, `all` over every shard, then one row per class.
    rows = table(first.rank_lines())
    assert rows[0][:3] == ["all", str(images), str(sum(per_class.values()))], rows
    assert [(r[0], int(r[2])) for r in rows[1:]] == [("square", per_class[0]), ("disc", per_class[1])], rows
    assert len(rows[0]) == 3 + 8  # Box(P R mAP50 mAP50-95) and Mask(...) for segmentation
    assert all(float(x) >= 0 for r in rows for x in r[3:])

    # Only rank 0 writes the run directory, and only rank 0 creates it: rank 1's validator, which
    # ultralytics builds by creating its save_dir, is built without (a node where --out cannot be
    # created, storage only rank 0's node has, starts as well as any).
    dirs = [line.split(" ", 1) for line in made.read_text().splitlines()]
    in_run = [(rank, path) for rank, path in dirs if path == str(on) or path.startswith(f"{on}/")]
    assert ("0", str(on)) in in_run and ("0", str(on / "weights")) in in_run, dirs
    assert [(rank, path) for rank, path in in_run if rank != "0"] == [], dirs

    # plots off: none of the files; the table is printed all the same.
    assert not [p.name for p in off.iterdir() if p.suffix in (".png", ".jpg")]
    assert (off / "results.csv").is_file() and table(second.rank_lines())[0][0] == "all"


def test_a_plot_that_cannot_be_drawn_is_a_warning_not_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ultralytics' plot_results imports polars, which an install may lack (the GPU machine's
    does): the finished run failed on it at its very end. The reason comes back for a warning."""
    from trainer.plots import results_png

    assert results_png(tmp_path) == (None, None)  # no epoch finished: nothing to draw, nothing to say
    (tmp_path / "results.csv").write_text("epoch,train/box_loss,metrics/mAP50(B)\n1,1.5,0.1\n2,1.2,0.2\n")
    monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` raises ImportError
    png, why = results_png(tmp_path)
    assert png is None and why is not None and why.startswith("results.png not drawn: ") and "polars" in why, why
