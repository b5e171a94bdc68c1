"""Synthetic datasets, data YAML checks, throughput table, schedule and checkpoint files (no torchrun)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from trainer import checkpoint
from trainer.data import load_data_yaml
from trainer.errors import TrainerError
from trainer.synth import write_dataset


def test_synth_writes_a_real_yolo_dataset(tmp_path: Path) -> None:
    data_yaml = write_dataset(tmp_path / "ds", images=8, classes=3, imgsz=32)
    doc = yaml.safe_load(data_yaml.read_text())
    assert Path(doc["path"]).is_absolute() and doc["names"] == {0: "square", 1: "disc", 2: "triangle"}
    train = sorted((tmp_path / "ds" / "images" / "train").glob("*.jpg"))
    val = sorted((tmp_path / "ds" / "images" / "val").glob("*.jpg"))
    assert len(train) == 6 and len(val) == 2
    for img in train + val:
        label = Path(str(img).replace("/images/", "/labels/")).with_suffix(".txt")
        for line in label.read_text().split("\n")[:-1]:
            k, *box = line.split()
            assert 0 <= int(k) < 3 and len(box) == 4 and all(0 <= float(v) <= 1 for v in box)
    data = load_data_yaml(str(data_yaml))
    assert data["nc"] == 3 and data["train"] == [str(tmp_path / "ds" / "images" / "train")]


def test_synth_segments_write_polygons(tmp_path: Path) -> None:
    write_dataset(tmp_path / "ds", images=2, classes=2, imgsz=32, segments=True)
    line = next((tmp_path / "ds" / "labels" / "train").glob("*.txt")).read_text().split("\n")[0].split()
    assert len(line) >= 7 and len(line) % 2 == 1


@pytest.mark.parametrize(
    "body, message",
    [
        ("train: images\nval: images\n", "'names' is missing or empty"),
        ("train: images\nval: images\nnames: []\n", "'names' is missing or empty"),
        ("train: images\nval: images\nnames: {0: a, 2: b}\n", "keys must be 0..1"),
        ("val: images\nnames: [a]\n", "no 'train' entry"),
        ("train: nowhere\nval: images\nnames: [a]\ndownload: https://x/y.zip\n", "never downloads"),
        ("- just a list\n", "expected a mapping"),
    ],
)
def test_bad_data_yaml_is_one_clear_line(tmp_path: Path, body: str, message: str) -> None:
    (tmp_path / "images").mkdir()
    f = tmp_path / "data.yaml"
    f.write_text(body)
    with pytest.raises(TrainerError, match=message) as e:
        load_data_yaml(str(f))
    assert "\n" not in str(e.value)


def test_missing_data_yaml(tmp_path: Path) -> None:
    with pytest.raises(TrainerError, match="no such file"):
        load_data_yaml(str(tmp_path / "nope.yaml"))


def test_checkpoint_write_is_atomic_and_rng_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "w" / "last.pt"
    checkpoint.save_atomic({"epoch": 1}, path)
    checkpoint.save_atomic({"epoch": 2}, path)
    assert torch.load(path)["epoch"] == 2 and list(path.parent.iterdir()) == [path]
    state = checkpoint.rng_state()
    a = torch.rand(3)
    checkpoint.set_rng_state(state)
    assert torch.equal(torch.rand(3), a)
    with pytest.raises(TrainerError, match="not written by this trainer"):
        checkpoint.load_for_resume(path)
    checkpoint.save_atomic({"epoch": -1, "model": None}, path)
    with pytest.raises(TrainerError, match="that run finished.*--weights"):
        checkpoint.load_for_resume(path)


def test_warmup_then_linear_or_cosine_decay_as_ultralytics() -> None:
    from ultralytics.utils.torch_utils import one_cycle

    from trainer import schedule

    lf = schedule.lr_factor(10, 0.1, cos=False)
    assert [round(lf(e), 6) for e in (0, 5, 9)] == [1.0, 0.55, round(0.1 * 0.9 + 0.1, 6)]
    cos, ref = schedule.lr_factor(10, 0.1, cos=True), one_cycle(1, 0.1, 10)
    assert [cos(e) for e in range(10)] == pytest.approx([ref(e) for e in range(10)])
    assert schedule.warmup_iterations(3.0, 10, 25) == 75
    assert schedule.warmup_iterations(3.0, 2, 25) == 25  # leaves the final epoch out of warmup
    assert schedule.warmup_iterations(0.0, 10, 25) == 0
    opt = SimpleNamespace(
        param_groups=[
            {"initial_lr": 0.01, "param_group": "weight", "momentum": 0.9},
            {"initial_lr": 0.01, "param_group": "bias", "momentum": 0.9},
        ]
    )
    acc = schedule.micro_step(opt, 0, 10, 0, lf, 4, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937)
    assert acc == 1 and opt.param_groups[0]["lr"] == 0.0 and opt.param_groups[1]["lr"] == pytest.approx(0.1)
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.8)
    acc = schedule.micro_step(opt, 5, 10, 0, lf, 4, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937)
    assert acc == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.005)  # np.round(2.5) == 2, as ultralytics
    acc = schedule.micro_step(opt, 10, 10, 0, lf, 4, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937)
    assert acc == 4 and opt.param_groups[1]["lr"] == pytest.approx(0.01) and opt.param_groups[0]["momentum"] == 0.937
    schedule.start_epoch(opt, 5, lf)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0055)
    assert schedule.micro_step(opt, 11, 10, 1, lf, 4, 0.1, 0.8, 0.937) == 4 and opt.param_groups[0][
        "lr"
    ] == pytest.approx(0.0055)


def test_main_prints_one_line_and_exits_2(tmp_path: Path, capsys, monkeypatch) -> None:
    from trainer.train import main

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["--data", str(tmp_path / "missing.yaml")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("[rank 0] error: --data ") and "no such file" in err[0]


def test_loader_workers_share_the_nodes_cpus_between_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer import data

    monkeypatch.setattr(data.os, "cpu_count", lambda: 16)
    assert data.worker_count(8, local_world_size=4, batches=100) == 4
    assert data.worker_count(2, local_world_size=4, batches=100) == 2
    assert data.worker_count(8, local_world_size=1, batches=3) == 3  # no more workers than batches
    assert data.worker_count(8, local_world_size=1, batches=1) == 0  # one batch: in the process


def test_cpu_training_threads_as_ultralytics_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """min(8, CPUs - 1) intra-op threads, shared by the node's ranks; an OMP_NUM_THREADS given stands."""
    import torch

    from trainer import dist

    monkeypatch.setattr(dist.os, "cpu_count", lambda: 2)
    given: list[str | None] = [None]  # OMP_NUM_THREADS as the process was started with
    monkeypatch.setattr(dist, "omp_threads_given", lambda: given[0])
    assert dist.cpu_threads(dist.Topology()) == 1  # ultralytics on this 2-core machine: 1
    monkeypatch.setattr(dist.os, "cpu_count", lambda: 64)
    assert dist.cpu_threads(dist.Topology()) == 8
    assert dist.cpu_threads(dist.Topology(world_size=4, local_world_size=4)) == 8
    assert dist.cpu_threads(dist.Topology(world_size=16, local_world_size=16)) == 3
    given[0] = "5"
    assert dist.cpu_threads(dist.Topology()) is None
    before = torch.get_num_threads()
    try:
        dist.select_device("cpu", dist.Topology())
        assert torch.get_num_threads() == before  # the user's count stands
        given[0] = None
        dist.select_device("cpu", dist.Topology())
        assert torch.get_num_threads() == 8
    finally:
        torch.set_num_threads(before)


def test_ultralytics_own_omp_num_threads_is_not_taken_for_the_users() -> None:
    """`import ultralytics` sets OMP_NUM_THREADS=1 where it is unset; `cpu_threads` took that for a
    count the user gave and left torch's default (every core): the thread count then hung on whether
    ultralytics was imported before the device was chosen (a 2-core run: 1 thread or 2, 41 or 57
    images/s). What counts is the count the process was started with."""
    script = (
        "import os, ultralytics\n"
        "from trainer import dist\n"
        "print(os.environ.get('OMP_NUM_THREADS'), dist.cpu_threads(dist.Topology()), os.cpu_count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    omp, threads, cpus = done.stdout.split()
    assert omp == "1", done.stdout  # ultralytics' doing
    assert threads == str(max(1, min(8, int(cpus) - 1))), done.stdout
    env["OMP_NUM_THREADS"] = "3"  # the user's (or torchrun's): it stands
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split()[:2] == ["3", "None"], done.stdout


def test_a_node_adjustment_is_said_once_and_recorded_as_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workers 4` was capped to CPUs / ranks without a word while trainer.yaml recorded 4, and
    `--pin-memory` was ignored on CPU: each adjustment is now a start-up note, and the
    configuration the run records (trainer.yaml, args.yaml) holds the value used."""
    from trainer import data, dist, loop, output
    from trainer.config import parse_config

    root = write_dataset(tmp_path / "d", images=4, classes=2, imgsz=32)
    monkeypatch.setattr(data.os, "cpu_count", lambda: 4)
    topo = dist.Topology(rank=0, world_size=2, launched=True, local_world_size=2)
    cfg = parse_config(["--data", str(root), "--batch", "2", "--workers", "4", "--pin-memory", "--imgsz", "32"])
    inp = loop.prepare(cfg, topo, torch.device("cpu"))
    assert (inp.cfg.workers, inp.cfg.pin_memory) == (2, False)
    said = [n for n in inp.cfg.notes if "workers" in n or "pin-memory" in n]
    assert len(said) == 2, inp.cfg.notes
    assert any("--workers 4" in n and "2" in n and "4 CPUs" in n for n in said)
    assert any("--pin-memory" in n and "CPU" in n for n in said)
    assert inp.hyp.workers == 2
    output.write_args(tmp_path / "run", inp.cfg, inp.hyp)
    recorded = yaml.safe_load((tmp_path / "run" / "trainer.yaml").read_text())
    assert (recorded["workers"], recorded["pin_memory"]) == (2, False)
    assert yaml.safe_load((tmp_path / "run" / "args.yaml").read_text())["workers"] == 2
    quiet = loop.prepare(
        parse_config(["--data", str(root), "--batch", "2", "--workers", "1", "--imgsz", "32"]),
        topo,
        torch.device("cpu"),
    )
    assert not [n for n in quiet.cfg.notes if "workers" in n or "pin-memory" in n]  # nothing adjusted, nothing said
    assert (quiet.cfg.workers, quiet.cfg.pin_memory) == (1, False)  # the default pin-memory, recorded as used
    assert inp.node_notes == tuple(said) and quiet.node_notes == ()  # what another node's first rank says itself
