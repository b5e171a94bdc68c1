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


def fp16_epoch(
    scaler: torch.amp.GradScaler,
    steps: int,
    max_grad: float,
    nonfinite_loss: bool = False,
    nonfinite_at: tuple[int, ...] = (),
) -> loop.Health:
    """``steps`` optimizer steps through ``loop.optimizer_step`` with a real GradScaler; a gradient
    overflows as fp16's would: when the scaled gradient passes fp16's largest value (or the loss is
    not finite: every step's with ``nonfinite_loss``, those of ``nonfinite_at``, 0-based). Returns
    the epoch's Health as the loop builds it."""
    model = torch.nn.Linear(4, 1)
    parts: Any = SimpleNamespace(
        scaler=scaler, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), model=model, ema=NoEMA()
    )
    skipped = torch.zeros((), dtype=torch.float64)
    nonfinite = 0
    for step in range(steps):
        loss = model(torch.ones(2, 4)).sum()
        if nonfinite_loss or step in nonfinite_at:
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


def test_skips_at_a_collapsed_scale_are_divergence() -> None:
    diverged = fp16_epoch(torch.amp.GradScaler("cpu", init_scale=2.0**-9), steps=3, max_grad=1e9)
    assert (
        diverged.skipped == diverged.steps == 3 and diverged.scale is not None and diverged.scale < loop.DIVERGED_SCALE
    )
    assert diverged.broken and "all 3 optimizer steps were skipped" in diverged.why()
    # a loss that is never finite: every step skipped, the scale halved each time until it collapses
    nan = fp16_epoch(torch.amp.GradScaler("cpu"), steps=30, max_grad=1.0, nonfinite_loss=True)
    assert nan.skipped == 30 and nan.nonfinite == 30 and nan.scale == 2.0**-14 and nan.broken
    assert loop.Health(nonfinite=1, skipped=0, steps=4, finite=False).broken  # without a scaler: weights not finite
    assert not loop.Health(skipped=4, steps=5, scale=2.0**-20).broken  # a step went through


def test_one_non_finite_loss_in_a_first_epoch_of_warm_up_skips_is_not_divergence() -> None:
    """32 ranks: fp16's warm-up skips about 16 steps while the scale falls from 2^16, so a short
    fine-tune's first epoch (16 optimizer steps of 384 images) skips them all; one of its batches
    has a degenerate label, whose loss is not finite. The GradScaler skipped that step as it skips
    the others: the epoch is not divergence (ultralytics carries on), whatever the loss count."""
    first = fp16_epoch(torch.amp.GradScaler("cpu"), steps=16, max_grad=2e3 * 32, nonfinite_at=(7,))
    assert first.skipped == first.steps == 16 and first.nonfinite == 1 and first.scale == 1.0, first
    assert not first.broken, first.why()
    assert not loop.Health(nonfinite=3, skipped=16, steps=16, scale=2.0**-9).broken  # still above the collapse


def v100_inputs(device: str, capability: tuple[int, int] | None, amp: str) -> Any:
    from trainer.config import TrainConfig
    from trainer.dist import Topology

    return SimpleNamespace(
        cfg=TrainConfig(data="/d.yaml"), topo=Topology(), device=torch.device(device), capability=capability, amp=amp
    )


def test_the_advice_on_divergence_is_what_the_device_can_do(tmp_path: Any) -> None:
    """A first epoch that diverges (no last.pt to recover from) stops with what to change: on a
    V100 not --amp bf16, which the trainer refuses there, but fp32; on an A100 either; on a CPU,
    which trains in fp32 already, no precision at all."""
    import pytest

    from trainer.errors import TrainerError

    broken = loop.Health(nonfinite=40, skipped=40, steps=40, scale=2.0**-24)

    def advice(device: str, capability: tuple[int, int] | None, amp: str) -> str:
        with pytest.raises(TrainerError) as info:
            loop.recover(0, broken, 1, None, v100_inputs(device, capability, amp), loop.State(), tmp_path)  # type: ignore[arg-type]
        return str(info.value)

    v100 = advice("cuda", (7, 0), "fp16")
    assert "there is no weights/last.pt yet to recover from" in v100
    assert "try --amp off (bf16 is not native on this GPU)" in v100 and "bf16 or" not in v100, v100
    assert "try --amp bf16 or --amp off" in advice("cuda", (8, 0), "fp16")
    assert "try --amp off" in advice("cuda", (9, 0), "bf16") and "--amp bf16" not in advice("cuda", (9, 0), "bf16")
    cpu = advice("cpu", None, "off")
    assert "--amp" not in cpu and "lower the learning rate (--lr / lr0), keep --clip on, and check the labels" in cpu


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
    parts: Any = SimpleNamespace(optimizer=optimizer, nominal_accumulate=1, unused=[], model=model)
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


# --- gradients over the network: --ddp-grad-dtype, --bucket-mb ------------------------------------


def one_rank_group() -> Any:
    """An in-process gloo group of one rank (DDP needs one), on a port of this test's own."""
    import torch.distributed as dist

    from tests.ports import job_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job_port()}", rank=0, world_size=1)
    return dist


def test_the_gradient_all_reduce_hook_sends_fp16_in_half_the_bytes_of_fp32() -> None:
    """The comm hook casts each bucket to fp16 (DDP's compression hook) and counts what it sends:
    half of fp32's bytes, per step and per bucket; the gradients come back into the fp32 bucket,
    equal to fp32's to fp16's precision. Buckets of --bucket-mb MB."""
    dist = one_rank_group()
    try:
        grads, sent = {}, {}
        for dtype in ("fp32", "fp16", "bf16"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
            ddp, comm = loop.wrap_ddp(model, torch.device("cpu"), False, dtype, bucket_mb=0.01, count=True)
            assert comm is not None and ddp.bucket_bytes_cap == int(0.01 * 1024 * 1024)
            for _ in range(3):  # three optimizer steps' all-reduces
                ddp(torch.ones(8, 64)).square().sum().backward()
            grads[dtype] = torch.cat([p.grad.flatten() for p in model.parameters()])
            sent[dtype] = comm.record()
            assert sent[dtype]["steps"] == 3 and sent[dtype]["buckets"] > 3  # 0.01 MB: several buckets a step
            assert sent[dtype]["bytes"] == 3 * loop.grad_bytes(model, dtype)
        params = sum(p.numel() for p in model.parameters())
        assert sent["fp32"]["bytes_per_step"] == 4 * params
        assert sent["fp16"]["bytes_per_step"] == sent["bf16"]["bytes_per_step"] == 2 * params
        assert torch.allclose(grads["fp16"], grads["fp32"], rtol=2e-3, atol=1e-3)
        assert torch.allclose(grads["bf16"], grads["fp32"], rtol=2e-2, atol=1e-2)
        plain, none = loop.wrap_ddp(torch.nn.Linear(2, 2), torch.device("cpu"), False)  # fp32: DDP's own all-reduce
        assert none is None and plain.bucket_bytes_cap == 25 * 1024 * 1024
    finally:
        dist.destroy_process_group()


def test_the_start_up_says_the_gradient_bytes_dtype_and_buckets() -> None:
    from trainer.config import parse_config

    model = torch.nn.Linear(1000, 1000)  # 1 001 000 parameters
    fp16 = loop.comm_line(model, parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "fp16"]), 8)
    assert fp16 == (
        "DDP all-reduces 2.0 MB of gradients per optimizer step per rank in fp16 (compression hook; fp32 would be "
        "4.0 MB), in buckets of 25 MB (--bucket-mb)"
    )
    fp32 = loop.comm_line(model, parse_config(["--data", "/d.yaml", "--bucket-mb", "100"]), 8)
    assert fp32 is not None and "4.0 MB" in fp32 and "fp16 or bf16 halves it" in fp32 and "buckets of 100 MB" in fp32
    assert loop.comm_line(model, parse_config(["--data", "/d.yaml"]), 1) is None
    alone = loop.comm_line(model, parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "bf16"]), 1)
    assert alone == "note: --ddp-grad-dtype without effect: one rank all-reduces no gradient"


def test_bf16_gradients_and_musgd_are_refused_on_a_gpu_without_native_bfloat16() -> None:
    from trainer.config import parse_config

    cuda = torch.device("cuda", 0)
    cfg = parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "bf16", "--optimizer", "MuSGD"])
    v100 = loop.capability_problems(cfg, cuda, (7, 0))
    assert len(v100) == 2
    assert v100[0].startswith("--ddp-grad-dtype bf16: cuda:0 has compute capability 7.0, without native bfloat16")
    assert "use --ddp-grad-dtype fp16" in v100[0]
    assert v100[1].startswith("--optimizer MuSGD: its Newton-Schulz iterations run in bfloat16") and "SGD" in v100[1]
    assert loop.capability_problems(cfg, cuda, (8, 0)) == loop.capability_problems(cfg, torch.device("cpu"), None) == []


def test_optimizer_auto_picks_sgd_where_musgd_would_run_in_emulated_bf16() -> None:
    """ultralytics' auto picks MuSGD beyond 10 000 iterations; its Newton-Schulz iterations run in
    bfloat16, which a V100 emulates: SGD there (ultralytics' own long-run choice before MuSGD), said."""
    cuda = torch.device("cuda", 0)
    chosen = loop.auto_optimizer("auto", 30_000, cuda, (7, 0))
    assert chosen is not None
    (name, lr, momentum), note = chosen
    assert (name, lr, momentum) == ("SGD", 0.01, 0.9)
    assert note.startswith("optimizer auto: SGD lr0 0.01 momentum 0.9 instead of MuSGD (30000 iterations)"), note
    assert loop.auto_optimizer("auto", 30_000, cuda, (8, 0)) is None  # an A100 runs MuSGD as ultralytics picks it
    assert loop.auto_optimizer("auto", 10_000, cuda, (7, 0)) is None  # AdamW: no bf16 in it
    assert loop.auto_optimizer("auto", 30_000, torch.device("cpu"), None) is None
    assert loop.auto_optimizer("SGD", 30_000, cuda, (7, 0)) is None


# --- NaN recovery changes what caused it -----------------------------------------------------------


class Images:
    """A dataset's length and image files, all a sampler reads of it."""

    def __init__(self, n: int) -> None:
        self.im_files = [f"/d/im{i}.jpg" for i in range(n)]

    def __len__(self) -> int:
        return len(self.im_files)


def test_another_attempt_at_an_epoch_draws_another_order_without_the_images_left_out() -> None:
    from torch.utils.data import DistributedSampler

    from trainer.data import ShardSampler

    images = Images(21)
    ranks = [ShardSampler(images, 2, r, seed=3) for r in range(2)]
    for epoch in (0, 4):  # attempt 0 is DistributedSampler's own order: a resumed run continues exactly
        for r, s in enumerate(ranks):
            s.set_epoch(epoch)
            plain = DistributedSampler(images, num_replicas=2, rank=r, shuffle=True, seed=3)  # type: ignore[arg-type]
            plain.set_epoch(epoch)
            assert list(s) == list(plain) and len(s) == len(plain) == 11
    first = [list(s) for s in ranks]
    for s in ranks:
        s.set_epoch(4, attempt=1)
    second = [list(s) for s in ranks]
    assert second != first and set(second[0] + second[1]) == set(first[0] + first[1]) == set(range(21))
    left = ["/d/im3.jpg", "/d/im8.jpg", "/d/im20.jpg", "/d/not-in-the-set.jpg"]
    for s in ranks:
        s.set_epoch(4, attempt=1, left_out=left)
    third = [list(s) for s in ranks]
    assert len(third[0]) == len(third[1]) == len(ranks[0]) == 9  # 18 images: the ranks stay in step
    assert not {3, 8, 20} & set(third[0] + third[1]) and set(third[0] + third[1]) == set(range(21)) - {3, 8, 20}
    import pytest

    from trainer.errors import TrainerError

    with pytest.raises(TrainerError, match="every one of the 21 training images was left out"):
        ranks[0].set_epoch(5, left_out=images.im_files)


def test_the_first_non_finite_loss_names_its_batch_and_images() -> None:
    """Without a GradScaler a non-finite loss makes the weights, and so every later loss, non-finite:
    only the first one's batch is to blame."""
    from trainer.dist import Topology

    state = loop.State()
    files = [[f"/d/b{i}a.jpg", f"/d/b{i}b.jpg"] for i in range(5)]
    state.troubled = (torch.tensor([False, False, True, True, True]), files)
    culprits = loop.first_nonfinite(state, Topology())
    assert culprits == [(0, 3, ["/d/b2a.jpg", "/d/b2b.jpg"])]
    assert loop.culprits_line(4, culprits) == (
        "warning: epoch 5: the first non-finite loss came from rank 0 batch 3, images /d/b2a.jpg, /d/b2b.jpg: left "
        "out of training from now on; check their labels (boxes outside the image, degenerate boxes, empty files)"
    )
    state.troubled = (torch.zeros(5, dtype=torch.bool), files)
    assert loop.first_nonfinite(state, Topology()) == []


# --- SyncBatchNorm's all-gathers are not compute ------------------------------------------------


def test_the_forwards_collectives_are_timed_apart_from_compute() -> None:
    """A layer whose forward is a collective (SyncBatchNorm's all-gather, where the slowest rank's
    wait lands) is timed apart: sync_s on the timing line, left out of compute_s, so the straggler
    detector's time outside collectives is the rank's own."""
    from trainer import pace as tpace
    from trainer.logs import parse_timing

    ticks = iter([0.0, 1.0, 1.5, 4.0, 4.5, 6.0, 6.0])  # window, forward, layer in/out, forward end, line, next
    layer = torch.nn.BatchNorm1d(2)
    pace = tpace.Pace(torch.device("cpu"), [layer], clock=lambda: next(ticks))
    pace.forward_begins()
    layer(torch.ones(2, 2))
    pace.forward_ends(2)
    line = pace.line(1, 1)
    assert line == "timing epoch 1 batch 1 steps 1 images 2 data_s 0 compute_s 1 wall_s 6 sync_s 2.5", line
    t = parse_timing(f"[rank 3] {line}")
    assert t is not None and (t.compute_s, t.sync_s, t.outside_s) == (1.0, 2.5, 1.0)
    pace.close()
    assert not layer._forward_hooks and not layer._forward_pre_hooks  # noqa: SLF001
    net = torch.nn.Sequential(torch.nn.SyncBatchNorm(2), torch.nn.BatchNorm2d(2))
    assert tpace.collective_layers(net) == [net[0]]
    plain = tpace.Pace(torch.device("cpu"))  # no collective in the forward: the line as it always was
    plain.forward_begins()
    plain.forward_ends(2)
    assert " sync_s " not in plain.line(1, 1)


def test_a_start_up_barrier_names_the_ranks_it_waits_for() -> None:
    """Rank 1 died building its dataset: ranks 0 and 2 wait for it on the store, and their heartbeat
    says whom they wait for (rank 1), not only that they are building; once it arrives, nobody."""
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    from trainer import data as tdata
    from trainer import dist as tdist
    from trainer.dist import Topology

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    beat = tdata.Heartbeat("building the datasets", Topology(), every_s=0)
    heard: list[list[int]] = []
    told = threading.Event()

    def hear(missing: list[int]) -> None:
        beat.waiting(missing)
        heard.append(missing)
        told.set()

    def rank(r: int, hear: Any = None) -> None:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False)
        tdist.store_barrier(client, "b", 3, timedelta(seconds=60), rank=r, waiting=hear, poll_s=0.05)

    waiting = [threading.Thread(target=rank, args=(0, hear)), threading.Thread(target=rank, args=(2,))]
    for t in waiting:
        t.start()
    assert told.wait(60), "the barrier never said whom it waits for"
    assert heard[0] == [1] and beat.text(90) == "startup: building the datasets: waiting for rank(s) 1, 90 s so far"
    rank(1)  # it comes after all
    for t in waiting:
        t.join(timeout=60)
    assert heard[-1] == [] and beat.text(91) == "startup: building the datasets, 91 s so far"
