"""The training loop's decisions on CPU, with the real torch pieces they read: the fp16
GradScaler's warm-up against divergence, the unused-parameter probe's batch, the start-up lines."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from trainer import loop

FP16_MAX = 65504.0


class NoEMA:
    def update(self, model: Any) -> None:
        pass


def fp16_epoch(scaler: torch.amp.GradScaler, steps: int, max_grad: float, nonfinite_loss: bool = False) -> loop.Health:
    """``steps`` optimizer steps through ``loop.optimizer_step`` with a real GradScaler; a gradient
    overflows as fp16's would: when the scaled gradient passes fp16's largest value (or the loss is
    not finite). Returns the epoch's Health as the loop builds it."""
    model = torch.nn.Linear(4, 1)
    parts: Any = SimpleNamespace(
        scaler=scaler, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), model=model, ema=NoEMA()
    )
    skipped = torch.zeros((), dtype=torch.float64)
    nonfinite = 0
    for _ in range(steps):
        loss = model(torch.ones(2, 4)).sum()
        if nonfinite_loss:
            loss = loss * float("inf")
            nonfinite += 1
        scaler.scale(loss).backward()
        if max_grad * scaler.get_scale() > FP16_MAX:
            assert model.weight.grad is not None
            model.weight.grad[0, 0] = float("inf")  # what the fp16 backward makes of it
        step = loop.optimizer_step(parts, clip=10.0)
        assert step is not None  # with a scaler: whether it skipped
        skipped += step
    troubled = torch.tensor([float(nonfinite), float(skipped), 1.0], dtype=torch.float64)
    _, _, health = loop.epoch_summary(
        0,
        ["box"],
        torch.zeros(1, dtype=torch.float64),
        2 * steps,
        loop.StepMeter(),
        None,
        troubled,
        steps,
        scaler.get_scale(),
    )  # type: ignore[arg-type]
    return health


def test_fp16_warm_up_skips_in_a_short_first_epoch_are_not_divergence() -> None:
    scaler = torch.amp.GradScaler("cpu")  # starts at 2^16, as on CUDA
    # max |grad| 2e3 x 8 ranks: the scale fits at 2^2, after 14 skipped steps; an epoch of 5 skips them all
    first = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)
    assert first.skipped == first.steps == 5 and first.scale == 2.0**11
    assert not first.broken, first.why()
    second = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)
    assert second.skipped == 5 and not second.broken
    third = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)  # 2^1 .. 2^-3 skip no more: the scale fits
    assert third.skipped == 4 and third.scale == 2.0**2 and not third.broken


def test_skips_at_a_small_scale_or_with_non_finite_losses_are_divergence() -> None:
    diverged = fp16_epoch(torch.amp.GradScaler("cpu", init_scale=2.0**-9), steps=3, max_grad=1e9)
    assert (
        diverged.skipped == diverged.steps == 3 and diverged.scale is not None and diverged.scale < loop.DIVERGED_SCALE
    )
    assert diverged.broken and "all 3 optimizer steps were skipped" in diverged.why()
    nan = fp16_epoch(torch.amp.GradScaler("cpu"), steps=2, max_grad=1.0, nonfinite_loss=True)
    assert nan.skipped == 2 and nan.nonfinite == 2 and nan.broken
    assert loop.Health(nonfinite=1, skipped=0, steps=4, finite=False).broken  # without a scaler: weights not finite
    assert not loop.Health(skipped=4, steps=5, scale=2.0**-20).broken  # a step went through


def write_wide_first_dataset(root: Any) -> str:
    """A YOLO dataset whose validation set sorts into rect batches of different shapes: two wide
    images (the first unlabelled) before square ones."""
    import numpy as np
    from PIL import Image

    for split in ("train", "val"):
        (root / split / "images").mkdir(parents=True)
        (root / split / "labels").mkdir(parents=True)
        shapes = [(64, 96), (64, 96), (96, 96), (96, 96), (96, 96)]  # (h, w)
        for i, (h, w) in enumerate(shapes):
            Image.fromarray(np.full((h, w, 3), 40 * i, dtype=np.uint8)).save(root / split / "images" / f"im{i}.jpg")
            label = "" if i == 0 else "0 0.5 0.5 0.25 0.25\n"
            (root / split / "labels" / f"im{i}.txt").write_text(label)
    (root / "data.yaml").write_text(f"path: {root}\ntrain: train/images\nval: val/images\nnames: {{0: a}}\n")
    return str(root / "data.yaml")


class ProbeNet(torch.nn.Module):
    """Returns ultralytics' (loss, items) from a batch; one layer never used."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 1)
        self.unused = torch.nn.Linear(1, 1)

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        assert len(batch["cls"]) > 0, "the probe batch has no labels"
        loss = self.conv(batch["img"]).mean().reshape(1)
        return loss, loss.detach()


def test_the_unused_parameter_probe_survives_rect_batches_of_different_shapes(tmp_path: Any) -> None:
    from ultralytics.cfg import get_cfg

    from trainer import data as tdata

    data = tdata.load_data_yaml(write_wide_first_dataset(tmp_path))
    hyp = get_cfg(overrides={"imgsz": 96, "task": "detect"})
    val_set = tdata.build_dataset(hyp, data, "val", 2, 32)  # --batch 1: validation batches of 2
    shapes = {tuple(val_set[i]["img"].shape) for i in range(len(val_set))}
    assert len(shapes) == 2, shapes  # the case: labelled images of the first two rect batches differ in shape
    assert loop.unused_parameters(ProbeNet(), val_set, torch.device("cpu")) == ["unused.weight", "unused.bias"]


def mosaic_p(dataset: Any) -> float:
    """The probability of the mosaic step in ``dataset``'s transforms."""
    from ultralytics.data.augment import Mosaic

    def walk(t: Any) -> Any:
        if isinstance(t, Mosaic):
            return t
        return next((m for m in map(walk, getattr(t, "transforms", [])) if m is not None), None)

    return float(walk(dataset.transforms).p)


def test_closing_mosaic_leaves_the_runs_settings_as_they_were(tmp_path: Any) -> None:
    from ultralytics.cfg import get_cfg

    from trainer import data as tdata

    data = tdata.load_data_yaml(write_wide_first_dataset(tmp_path))
    hyp = get_cfg(overrides={"imgsz": 64, "task": "detect", "mosaic": 1.0, "mixup": 0.1})
    train_set = tdata.build_dataset(hyp, data, "train", 2, 32)
    assert mosaic_p(train_set) == 1.0
    loop.close_mosaic(train_set, hyp)
    assert mosaic_p(train_set) == 0.0  # the dataset did close it
    assert (hyp.mosaic, hyp.mixup) == (1.0, 0.1)  # what last.pt's train_args record: the run's settings


def test_validation_on_cuda_frees_the_cache_first(monkeypatch: Any) -> None:
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))

    def run_validation(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls.append("validate")
        return {"fitness": 0.5}

    monkeypatch.setattr(loop, "run_validation", run_validation)
    for device, expected in (
        (torch.device("cuda", 0), ["empty_cache", "validate"]),
        (torch.device("cpu"), ["validate"]),
    ):
        calls.clear()
        inp: Any = SimpleNamespace(
            device=device, data={}, amp="off", cfg=SimpleNamespace(epochs=3), topo=SimpleNamespace(world_size=1)
        )
        assert loop.validate(None, SimpleNamespace(ema=torch.nn.Linear(1, 1)), inp, (), 0) == {"fitness": 0.5}
        assert calls == expected, device


def test_the_resume_line_says_which_epochs_are_left() -> None:
    assert loop.resume_line(2, 10, updates=40, best_fitness=0.25) == (
        "resuming at epoch 3 (checkpoint finished epoch 2, 40 optimizer steps, best fitness 0.2500): epochs 3..10 "
        "left of 10"
    )
    done = loop.resume_line(10, 10, updates=200, best_fitness=0.5)
    assert done.startswith("resuming after epoch 10 (checkpoint finished epoch 10, ") and "no epoch left of 10" in done
    assert "epochs 1..0" not in done and "epoch 11" not in done


def startup(batch: int, world_size: int, device: str, sync_bn: bool = False) -> list[str]:
    from trainer.config import parse_config, with_world_size
    from trainer.dist import Topology

    cfg = with_world_size(
        parse_config(["--data", "/d/data.yaml", "--batch", str(batch), *(["--sync-bn"] if sync_bn else [])]), world_size
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    optimizer.param_groups[0]["initial_lr"] = 0.01
    inp: Any = SimpleNamespace(
        cfg=cfg,
        topo=Topology(rank=0, world_size=world_size, launched=True),
        arch=SimpleNamespace(name="yolo12n.yaml", task="detect", yoloe=False),
        device=torch.device(device),
        amp="off",
    )
    parts: Any = SimpleNamespace(optimizer=optimizer, nominal_accumulate=1, unused=[])
    return loop.startup_lines(inp, parts, 0)


def test_the_start_up_warns_of_fewer_than_4_images_per_rank_without_sync_bn() -> None:
    lines = [ln for ln in startup(32, 32, "cuda") if ln.startswith("warning: global batch")]
    assert lines == [
        "warning: global batch 32 on 32 ranks is 1 image(s) per rank without SyncBN: each GPU's "
        "BatchNorm normalises over 1 image(s) (--batch is global); use --batch-per-device N for N "
        "images per GPU, N >= 4 (--batch-per-device 32: 32 per GPU, global 1024), or --sync-bn "
        "(BatchNorm statistics over the 32 images of all 32 ranks)"
    ]
    assert not [ln for ln in startup(32, 32, "cuda", sync_bn=True) if "per rank without SyncBN" in ln]
    assert not [ln for ln in startup(128, 32, "cuda") if "per rank without SyncBN" in ln]
    cpu = [ln for ln in startup(4, 2, "cpu") if "per rank without SyncBN" in ln]
    assert len(cpu) == 1 and "--sync-bn" not in cpu[0]  # SyncBatchNorm needs CUDA: not offered on CPU


def test_start_up_barriers_wait_on_the_rendezvous_store_not_on_a_gloo_group(monkeypatch: Any) -> None:
    """A Gloo group binds what the hostname resolves to (loopback on Ubuntu's 127.0.1.1): the
    start-up barriers of an NCCL run live on torchrun's TCPStore instead, which every rank reaches."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from trainer import dist as tdist

    made: list[Any] = []

    def new_group(*args: Any, **kwargs: Any) -> object:
        made.append(kwargs)
        return object()

    monkeypatch.setattr(dist, "new_group", new_group)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: None)
    tdist.init(tdist.Topology(rank=0, world_size=4, launched=True), torch.device("cpu"), 1.0, 30.0)
    assert made == []
    assert timedelta(minutes=30) == tdist._STARTUP_TIMEOUT  # noqa: SLF001
    tdist.close()

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    passed: list[int] = []

    def rank(r: int, key: str, world: int) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
        tdist.store_barrier(client, key, world, timedelta(seconds=60))
        passed.append(r)

    threads = [threading.Thread(target=rank, args=(r, "b1", 3)) for r in range(2)]
    for t in threads:
        t.start()
    assert not server.check(["b1/open"]) and passed == []  # two of three: nobody passes
    rank(2, "b1", 3)  # the last one opens it
    for t in threads:
        t.join(timeout=60)
    assert sorted(passed) == [0, 1, 2]
    import pytest

    with pytest.raises(dist.DistStoreError):
        tdist.store_barrier(server, "b2", 2, timedelta(seconds=0.2))  # a rank that never comes: the timeout
