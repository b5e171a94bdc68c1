"""The trainer under real torchrun (gloo on CPU, master on 127.0.0.1), 2 ranks.

Small on purpose (64 px images, yolo12n, 2-3 epochs): other suites share these 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import (  # noqa: E402
    PYTHON,
    env,
    make_dataset,
    read_debug,
    read_results,
    run_trainer,
    train_loss,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Augmentation that does not depend on the RNG stream, so runs can be compared number for number.
NO_AUG = ["--cfg", "hsv_h=0", "--cfg", "hsv_s=0", "--cfg", "hsv_v=0", "--cfg", "translate=0", "--cfg", "scale=0",
          "--cfg", "fliplr=0", "--cfg", "mosaic=0"]


def common(data: Path, out: Path, epochs: int, batch: int) -> list[str]:
    """Flags every run here shares."""
    return ["--model", "yolo12n.yaml", "--data", str(data), "--epochs", str(epochs), "--batch", str(batch),
            "--imgsz", "64", "--out", str(out), "--log-every", "2", "--seed", "1", "--warmup-epochs", "1"]


def test_two_ranks_train_in_lockstep_offline(tmp_path: Path) -> None:
    """Loss falls, ranks end identical, shards are disjoint, lines are prefixed, no network, last.pt predicts."""
    data = make_dataset(tmp_path / "ds", images=48, classes=2, imgsz=128)  # 36 train images: 18 per rank
    out, debug, net = tmp_path / "run", tmp_path / "debug", tmp_path / "net.log"
    args = ["--model", "yolo12n.yaml", "--data", str(data), "--epochs", "10", "--batch", "8", "--imgsz", "128",
            "--out", str(out), "--log-every", "2", "--seed", "1", "--warmup-epochs", "1", "--lr", "0.04",
            "--workers", "1", "--val-period", "5", "--cfg", "close_mosaic=0", "--debug-dir", str(debug)]
    r = run_trainer(args, nproc=2, blocked_net_log=net)
    assert r.returncode == 0, r.explain()
    assert not net.exists(), f"network attempts: {net.read_text()}"

    # From random init the loss first rises (the assigner finds more positives as boxes improve),
    # then falls; at 128 px with mosaic that turn comes within a few epochs.
    losses = [train_loss(x) for x in read_results(out)]
    assert len(losses) == 10
    assert sum(losses[-3:]) / 3 < 0.85 * max(losses[:5]), losses

    ranks = read_debug(debug, 2)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    train_files = sorted(p.name for p in (tmp_path / "ds" / "images" / "train").iterdir())
    for epoch in map(str, range(1, 11)):
        a, b = set(ranks[0]["seen"][epoch]), set(ranks[1]["seen"][epoch])
        assert not a & b, f"epoch {epoch}: both ranks trained on {sorted(a & b)}"
        assert sorted(a | b) == train_files
    assert ranks[0]["seen"]["1"] != ranks[0]["seen"]["2"], "set_epoch must reshuffle every epoch"

    for line in r.stdout.splitlines():
        assert line.startswith("[rank "), f"unprefixed trainer line: {line!r}"
    assert any("throughput epoch 10: total" in ln for ln in r.rank_lines())
    assert any(ln.startswith("[rank 0] val epoch 10/10 mAP50 ") for ln in r.rank_lines())
    for name in ("last.pt", "best.pt"):
        assert (out / "weights" / name).is_file()
    assert (out / "args.yaml").is_file()

    predict = ("import sys; from ultralytics import YOLO; m = YOLO(sys.argv[1]); "
               "r = m.predict(sys.argv[2], imgsz=128, verbose=False); print(len(r), sorted(m.names.values()))")
    image = next((tmp_path / "ds" / "images" / "val").iterdir())
    p = subprocess.run([PYTHON, "-c", predict, str(out / "weights" / "last.pt"), str(image)], capture_output=True,
                       text=True, env=env({"YOLO_OFFLINE": "1"}), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 ['disc', 'square']" in p.stdout


def test_one_rank_and_two_ranks_agree(tmp_path: Path) -> None:
    """Same seed, global batch 8: 1 x 8 and 2 x 4 train on the same images per step and land close.

    Not bit-equal: BatchNorm statistics and the loss's target normalisation are per local batch.
    """
    data = make_dataset(tmp_path / "ds", images=22, classes=2, imgsz=128)  # 16 train images: 2 steps of 8
    flags = [*common(data, tmp_path / "x", 2, 8), *NO_AUG, "--imgsz", "128", "--workers", "0", "--val-period", "0",
             "--lr", "0.04"]
    one = run_trainer([*flags, "--out", str(tmp_path / "one"), "--debug-dir", str(tmp_path / "d1")], nproc=1)
    two = run_trainer([*flags, "--out", str(tmp_path / "two"), "--debug-dir", str(tmp_path / "d2")], nproc=2)
    assert one.returncode == 0, one.explain()
    assert two.returncode == 0, two.explain()
    r1, r2 = read_results(tmp_path / "one"), read_results(tmp_path / "two")
    for a, b in zip(r1, r2):
        assert train_loss(b) == pytest.approx(train_loss(a), rel=0.05), (r1, r2)
    s1 = read_debug(tmp_path / "d1", 1)[0]["param_sum"]
    s2 = read_debug(tmp_path / "d2", 2)[0]["param_sum"]
    assert s2 == pytest.approx(s1, rel=1e-3)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_after_kill_continues_exactly(tmp_path: Path, workers: int) -> None:
    """A run killed after epoch 2 and resumed ends where an uninterrupted run ends, with the
    augmentation in the main process or in (persistent) loader workers."""
    data = make_dataset(tmp_path / "ds", images=20)
    flags = ["--workers", str(workers), "--val-period", "0", "--lr", "0.05"]
    full = run_trainer([*common(data, tmp_path / "full", 3, 4), *flags, "--debug-dir", str(tmp_path / "df")], nproc=2)
    assert full.returncode == 0, full.explain()

    killed = run_trainer([*common(data, tmp_path / "cut", 3, 4), *flags, "--debug-exit-after", "2"], nproc=2)
    assert killed.returncode != 0
    assert len(read_results(tmp_path / "cut")) == 2
    resumed = run_trainer([*common(data, tmp_path / "cut", 3, 4), *flags, "--resume",
                           "--debug-dir", str(tmp_path / "dc")], nproc=2)
    assert resumed.returncode == 0, resumed.explain()
    assert any("resuming at epoch 3 (checkpoint finished epoch 2, " in ln for ln in resumed.rank_lines())
    assert not any("epoch 1/3" in ln or "epoch 2/3" in ln for ln in resumed.rank_lines())

    a, b = read_results(tmp_path / "full"), read_results(tmp_path / "cut")
    assert len(b) == 3
    assert train_loss(b[2]) == pytest.approx(train_loss(a[2]), rel=1e-4)
    assert b[2]["lr/pg0"] == pytest.approx(a[2]["lr/pg0"])
    df, dc = read_debug(tmp_path / "df", 2), read_debug(tmp_path / "dc", 2)
    assert dc[0]["param_sum"] == pytest.approx(df[0]["param_sum"], rel=1e-6)
    assert dc[0]["checksum"] == dc[1]["checksum"]


def test_yoloe_linear_probe_two_ranks(tmp_path: Path) -> None:
    """YOLOE with a file of fixed text vectors: prompt head trains under DDP, checkpoint keeps the classes."""
    import torch

    data = make_dataset(tmp_path / "ds", images=12)
    pe = tmp_path / "pe.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({n: torch.randn(512, generator=g) for n in ("square", "disc", "triangle")}, pe)
    out = tmp_path / "run"
    r = run_trainer(["--model", "yoloe-11s.yaml", "--data", str(data), "--text-embeddings", str(pe),
                     "--prompt-mode", "linear", "--epochs", "1", "--batch", "4", "--imgsz", "64", "--workers", "0",
                     "--out", str(out), "--debug-dir", str(tmp_path / "d")], nproc=2)
    assert r.returncode == 0, r.explain()
    ranks = read_debug(tmp_path / "d", 2)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert (out / "weights" / "last.pt").is_file()


@pytest.mark.parametrize("case", ["batch", "names", "weights", "relative"])
def test_bad_input_is_one_line_on_every_rank(tmp_path: Path, case: str) -> None:
    """Each input error: one prefixed line per rank, no traceback from the trainer, non-zero exit."""
    data = make_dataset(tmp_path / "ds", images=6)
    args = ["--data", str(data), "--batch", "4", "--imgsz", "64", "--epochs", "1", "--out", str(tmp_path / "o")]
    expect = {"batch": "not divisible by WORLD_SIZE 2", "names": "'names' is missing or empty",
              "weights": "no such file", "relative": "is relative"}[case]
    if case == "batch":
        args[3] = "3"
    elif case == "names":
        bad = tmp_path / "nonames.yaml"
        bad.write_text(f"path: {tmp_path / 'ds'}\ntrain: images/train\nval: images/val\nnames: []\n")
        args[1] = str(bad)
    elif case == "weights":
        args += ["--weights", str(tmp_path / "missing.pt")]
    else:
        args[1] = os.path.relpath(data, tmp_path)
    r = run_trainer(args, nproc=2, cwd=tmp_path)
    assert r.returncode != 0
    errors = [ln for ln in r.rank_lines("stderr") if " error: " in ln]
    assert sorted(ln[:8] for ln in errors) == ["[rank 0]", "[rank 1]"], r.explain()
    assert all(expect in ln for ln in errors), r.explain()
    worker_part = r.stderr.split(" failed (exitcode")[0]
    assert "Traceback" not in worker_part, r.explain()
    if case == "relative":
        assert str(data) in errors[0]  # says what the absolute path would be
