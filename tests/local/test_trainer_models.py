"""What the trainer builds: the checkpoint's architecture and task, class rows matched by name,
YOLOE prompt convs that train, frozen BatchNorm that stays frozen, an EMA without SyncBatchNorm,
the optimizer and DDP settings ultralytics would use (CPU, no process group)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from trainer.offline import set_offline_env

set_offline_env()  # before ultralytics is imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import make_dataset, save_checkpoint  # noqa: E402

from trainer import loop, models  # noqa: E402
from trainer.config import parse_config  # noqa: E402
from trainer.dist import Topology  # noqa: E402
from trainer.errors import TrainerError  # noqa: E402

CPU = torch.device("cpu")
NAMES = ["square", "disc", "triangle"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("ds"), images=8, classes=3, imgsz=64, segments=True)


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pe") / "pe.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({n: torch.randn(512, generator=g) for n in NAMES}, path)
    return path


def inputs(data: Path, *argv: str) -> loop.Inputs:
    return loop.prepare(parse_config(["--data", str(data), "--imgsz", "64", "--batch", "2", *argv]), Topology(), CPU)


@pytest.mark.parametrize(
    "arch, task, yoloe",
    [
        ("yolo12n-seg.yaml", "segment", False),
        ("yolo12n.yaml", "detect", False),
        ("yoloe-11s-seg.yaml", "segment", True),
    ],
)
def test_weights_without_model_train_the_checkpoints_architecture_and_task(
    tmp_path: Path, data: Path, embeddings: Path, arch: str, task: str, yoloe: bool
) -> None:
    ckpt = tmp_path / "pretrained.pt"
    save_checkpoint(ckpt, arch, NAMES)
    inp = inputs(data, "--weights", str(ckpt), *(["--text-embeddings", str(embeddings)] if yoloe else []))
    assert (inp.arch.name, inp.arch.task, inp.arch.yoloe) == (arch, task, yoloe)
    if not yoloe:
        model = loop.build_network(inp)
        assert type(model).__name__ == ("SegmentationModel" if task == "segment" else "DetectionModel")
        assert inp.hyp.task == task


def test_contradictory_model_and_weights_are_refused_in_one_line(tmp_path: Path, data: Path) -> None:
    ckpt = tmp_path / "seg.pt"
    save_checkpoint(ckpt, "yolo12n-seg.yaml", NAMES)
    with pytest.raises(TrainerError) as e:
        inputs(data, "--model", "yolo12n.yaml", "--weights", str(ckpt))
    message = str(e.value)
    assert "--model yolo12n.yaml contradicts --weights" in message and "yolo12n-seg.yaml segment" in message
    assert "\n" not in message
    with pytest.raises(TrainerError, match="contradicts"):
        inputs(data, "--model", "yolo12s-seg.yaml", "--weights", str(ckpt))  # another scale
    assert inputs(data, "--model", "yolo12n-seg.yaml", "--weights", str(ckpt)).arch.task == "segment"  # the same one
    with pytest.raises(TrainerError, match="task=detect but the checkpoint"):
        inputs(data, "--weights", str(ckpt), "task=detect")


def test_class_rows_are_matched_by_name_when_fine_tuning(tmp_path: Path, data: Path) -> None:
    """The data lists the classes in another order than the checkpoint: each class keeps its row."""
    ckpt = tmp_path / "det.pt"
    source = save_checkpoint(ckpt, "yolo12n.yaml", ["triangle", "square", "disc"])
    inp = inputs(data, "--weights", str(ckpt))  # data names: square, disc, triangle
    model = loop.build_network(inp)
    head, src = model.model[-1], source.model[-1]
    for i in range(len(head.cv3)):
        got, want = head.cv3[i][-1].weight, src.cv3[i][-1].weight.half().float()  # saved in fp16
        assert torch.equal(got[0], want[1]) and torch.equal(got[1], want[2]) and torch.equal(got[2], want[0])
    assert model.names == dict(enumerate(NAMES))
    plain = loop.build_network(inputs(data, "--weights", str(ckpt), "cls_remap=False"))
    assert torch.equal(plain.model[-1].cv3[0][-1].weight[0], src.cv3[0][-1].weight[0].half().float())


@pytest.mark.parametrize("mode", ["linear", "full"])
def test_yoloe_prompt_convs_receive_gradients_and_change(data: Path, embeddings: Path, mode: str) -> None:
    inp = inputs(data, "--model", "yoloe-11s-seg.yaml", "--text-embeddings", str(embeddings), "--prompt-mode", mode)
    model = loop.build_network(inp)
    head = model.model[-1]
    convs = [head.cv3[i][2] for i in range(len(head.cv3))]
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    prompt = {f"model.{len(model.model) - 1}.cv3.{i}.2.{w}" for i in range(len(convs)) for w in ("weight", "bias")}
    assert prompt <= trainable
    if mode == "linear":
        assert trainable == prompt
    else:
        assert len(trainable) > 10 * len(prompt)
    before = [c.weight.detach().clone() for c in convs]
    # Adam: a from-scratch head's gradients are tiny (bias -10), its step is not
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    models.set_train_mode(model)
    batch = loop.preprocess(next(iter(_loader(inp, model))), CPU)
    loss, _ = model(batch)
    loss.sum().backward()
    assert all(c.weight.grad is not None and c.weight.grad.abs().sum() > 0 for c in convs)
    optimizer.step()
    assert all(not torch.equal(c.weight, b) for c, b in zip(convs, before))


def _loader(inp: loop.Inputs, model: torch.nn.Module) -> list:
    from trainer import data as tdata

    ds = tdata.build_dataset(inp.hyp, inp.data, "val", 2, 32)
    return [ds.collate_fn([ds[0], ds[1]])]


def test_linear_probe_keeps_frozen_batchnorm_statistics(data: Path, embeddings: Path) -> None:
    inp = inputs(data, "--model", "yoloe-11s.yaml", "--text-embeddings", str(embeddings), "--prompt-mode", "linear")
    model = loop.build_network(inp)
    models.set_train_mode(model)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and all(not m.training for m in norms)  # linear: only the prompt convs train, none is a norm
    stats = [(m.running_mean.clone(), m.running_var.clone()) for m in norms]
    model(loop.preprocess(_loader(inp, model)[0], CPU))
    assert all(torch.equal(m.running_mean, a) and torch.equal(m.running_var, b) for m, (a, b) in zip(norms, stats))


def test_freeze_freezes_those_layers_and_their_batchnorm(data: Path) -> None:
    model = loop.build_network(inputs(data, "--freeze", "3"))
    models.set_train_mode(model)
    for name, p in model.named_parameters():
        assert p.requires_grad == (not name.startswith(("model.0.", "model.1.", "model.2.")) and ".dfl" not in name), (
            name
        )
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.training == (not name.startswith(("model.0.", "model.1.", "model.2."))), name
    with pytest.raises(TrainerError, match="freezes the whole model"):
        loop.build_network(inputs(data, "--freeze", "99"))


def test_the_ema_is_taken_before_syncbatchnorm_so_checkpoints_hold_batchnorm(data: Path) -> None:
    from trainer import checkpoint

    model, ema = loop.ema_then_sync_bn(loop.build_network(inputs(data)), sync_bn=True)
    assert any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    saved = checkpoint.half_model(ema.ema)
    assert not any(isinstance(m, torch.nn.SyncBatchNorm) for m in saved.modules())
    assert any(type(m) is torch.nn.BatchNorm2d for m in saved.modules())


def test_the_checkpoints_half_ema_refreshed_in_place_is_what_a_fresh_copy_would_be(data: Path) -> None:
    """HalfCopy skips the per-epoch deepcopy; after the EMA trains on, validates (the head's
    anchors) and gets new attributes, its copy holds what half_model makes from scratch."""
    from trainer import checkpoint

    _, ema = loop.ema_then_sync_bn(loop.build_network(inputs(data)), sync_bn=False)
    half = checkpoint.HalfCopy()
    first = half(ema.ema)
    with torch.no_grad():
        for p in ema.ema.parameters():
            p.add_(0.5)
        next(iter(ema.ema.parameters())).view(-1)[0] = float("inf")  # clamped like a fresh copy's
        ema.ema.eval()(torch.zeros(1, 3, 64, 64))  # inference sets the head's anchors and strides
    ema.ema.names = {0: "a", 1: "b", 2: "c"}
    ema.ema.criterion = ema.ema.init_criterion()  # the loss is never in the file
    again, fresh = half(ema.ema), checkpoint.half_model(ema.ema)
    assert again is first and again is not ema.ema
    assert list(again.state_dict()) == list(fresh.state_dict())
    assert all(
        torch.equal(a, b) and a.dtype == b.dtype
        for a, b in zip(again.state_dict().values(), fresh.state_dict().values())
    )
    for (name, a), (_, b) in zip(again.named_modules(), fresh.named_modules()):
        extra = sorted(k for k in vars(b) if k not in checkpoint._MODULE_INTERNALS)  # noqa: SLF001
        assert sorted(k for k in vars(a) if k not in checkpoint._MODULE_INTERNALS) == extra, name  # noqa: SLF001
        for k in extra:
            x, y = vars(a)[k], vars(b)[k]
            if isinstance(y, torch.Tensor):
                assert x.dtype == y.dtype and torch.equal(x, y), f"{name}.{k}"
            elif not isinstance(y, torch.nn.Module):
                assert x == y, f"{name}.{k}"
    head = again.model[-1]
    assert head.anchors.numel() > 0 and head.anchors.dtype == torch.float16
    assert again.criterion is None and again.names == {0: "a", 1: "b", 2: "c"}
    assert ema.ema.state_dict()["model.0.conv.weight"].dtype == torch.float32  # the EMA itself untouched
    other = loop.build_network(inputs(data, "--model", "yolo12s.yaml"))
    assert half(other) is not first  # another module: a new copy


def test_probe_finds_parameters_without_gradient(data: Path, embeddings: Path) -> None:
    from trainer import data as tdata

    inp = inputs(data)
    model = loop.build_network(inp)
    probe = tdata.build_dataset(inp.hyp, inp.data, "val", 2, 32)
    assert loop.unused_parameters(model, probe, CPU) == []
    model.extra = torch.nn.Parameter(torch.zeros(3))  # trainable, outside the graph
    assert loop.unused_parameters(model, probe, CPU) == ["extra"]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # the probe ran on a copy


@pytest.mark.parametrize(
    "argv, kind, lr",
    [
        ([], "AdamW", round(0.002 * 5 / (4 + 3), 6)),  # ultralytics' auto rule for 3 classes, few iterations
        (["--optimizer", "SGD"], "SGD", 0.01),
        (["--lr", "0.02"], "SGD", 0.02),
        (["optimizer=AdamW", "lr0=0.003"], "AdamW", 0.003),
    ],
)
def test_optimizer_as_ultralytics_builds_it(data: Path, argv: list[str], kind: str, lr: float) -> None:
    inp = inputs(data, *argv, "--batch", "8", "--weight-decay", "0.001", "--patience", "7")
    parts, train_set, _ = loop.build_parts(inp, 8)
    assert type(parts.optimizer).__name__ == kind
    groups = {g["param_group"]: g for g in parts.optimizer.param_groups}
    assert groups["weight"]["initial_lr"] == pytest.approx(lr)
    assert groups["weight"]["weight_decay"] == pytest.approx(0.001 * 8 * 8 / 64)  # x batch x accumulate / nbs
    assert groups["bias"]["weight_decay"] == 0 and groups["bn"]["weight_decay"] == 0
    assert parts.nominal_accumulate == 8 and parts.stopper.patience == 7
    assert inp.hyp.optimizer == kind and inp.hyp.lr0 == pytest.approx(lr)  # args.yaml says what trained


def test_cache_fraction_and_multi_scale_reach_the_data(tmp_path: Path) -> None:
    from trainer import data as tdata

    ds = make_dataset(tmp_path / "ds", images=16, imgsz=64)
    inp = inputs(ds, "--cache", "ram", "--fraction", "0.5", "--multi-scale", "0.5")
    train = tdata.build_dataset(inp.hyp, inp.data, "train", 2, 32)
    assert train.cache == "ram" and len(train) == 6  # half of the 12 training images
    sizes = {
        loop.preprocess({"img": torch.zeros(1, 3, 64, 64, dtype=torch.uint8)}, CPU, inp.hyp, 32)["img"].shape[-1]
        for _ in range(40)
    }
    assert len(sizes) > 1 and all(s % 32 == 0 and 32 <= s <= 96 for s in sizes)


def test_one_checkpoint_write_per_epoch_and_best_pt_is_the_same_bytes(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer import checkpoint

    inp = inputs(data, "--batch", "2")
    parts, _, _ = loop.build_parts(inp, 2)
    writes = []
    real = checkpoint.save_atomic
    monkeypatch.setattr(checkpoint, "save_atomic", lambda ckpt, path: writes.append(ckpt["epoch"]) or real(ckpt, path))
    state, weights = loop.State(), tmp_path / "weights"
    loop.end_epoch(0, 0.5, {"box_loss": 1.0}, [[4, 0.1, 1.0]], parts, inp, state, tmp_path, None, 0.0)
    assert writes == [0] and (weights / "best.pt").samefile(weights / "last.pt")
    loop.end_epoch(1, 0.4, {"box_loss": 1.0}, [[4, 0.1, 1.0]], parts, inp, state, tmp_path, None, 0.0)
    assert writes == [0, 1] and not (weights / "best.pt").samefile(weights / "last.pt")
    assert torch.load(weights / "best.pt", weights_only=False)["epoch"] == 0
    assert torch.load(weights / "last.pt", weights_only=False)["epoch"] == 1


def test_the_loss_schedule_of_end_to_end_heads_follows_the_epoch(data: Path) -> None:
    """yolo26's loss moves weight from one-to-many to one-to-one after every epoch (ultralytics'
    criterion.update()); the schedule depends on the epoch only, so a resumed run continues it."""
    inp = inputs(data, "--model", "yolo26n.yaml", "--epochs", "5")
    straight, resumed = loop.build_network(inp), loop.build_network(inp)
    for epoch in range(4):
        loop.advance_criterion(straight, epoch)
    loop.advance_criterion(resumed, 3)  # a run resumed at epoch 4 (0-based 3)
    reference = loop.build_network(inp)
    reference.criterion = reference.init_criterion()
    for _ in range(3):
        reference.criterion.update()  # what ultralytics' trainer has done after epochs 1..3
    for model in (straight, resumed):
        assert (model.criterion.o2m, model.criterion.o2o) == (reference.criterion.o2m, reference.criterion.o2o)
    assert reference.criterion.o2m != loop.build_network(inp).init_criterion().o2m


def test_yoloe_weights_train_in_full_mode_with_ultralytics_recipe_unless_told(
    tmp_path: Path, data: Path, embeddings: Path
) -> None:
    """The field guides run train_pe_all.py: YOLOE weights without --prompt-mode train everything,
    with ultralytics' YOLOE recipe where nothing was given; what the user gives wins; the prompt
    embeddings move with the model."""
    ckpt = tmp_path / "yoloe.pt"
    save_checkpoint(ckpt, "yoloe-11s-seg.yaml", NAMES)
    inp = inputs(data, "--weights", str(ckpt), "--text-embeddings", str(embeddings))
    cfg = inp.cfg
    assert (cfg.optimizer, cfg.lr, cfg.weight_decay, cfg.momentum, cfg.close_mosaic) == ("AdamW", 1e-3, 0.025, 0.9, 10)
    assert inp.hyp.warmup_bias_lr == 0.0 and inp.hyp.lr0 == 1e-3 and inp.hyp.optimizer == "AdamW"
    # THU-MIG's coco_s_train.yaml augmentation for an s model
    assert (inp.hyp.scale, inp.hyp.mixup, inp.hyp.copy_paste, inp.hyp.close_mosaic) == (0.6, 0.15, 0.3, 10)
    assert any(
        n == "YOLOE recipe (train_pe_all.py, coco_s_train.yaml): optimizer AdamW, lr0 0.001, weight_decay "
        "0.025, momentum 0.9, close_mosaic 10, warmup_bias_lr 0, mixup 0.15, copy_paste 0.3, scale 0.6 "
        "(set any of them to override)"
        for n in cfg.notes
    ), cfg.notes
    model = loop.build_network(inp)
    trainable = sum(p.requires_grad for p in model.parameters())
    assert trainable > 100  # full: everything trains
    assert loop.prompt_mode_text(cfg) == "full (train_pe_all, the default)"
    mine = inputs(
        data,
        "--weights",
        str(ckpt),
        "--text-embeddings",
        str(embeddings),
        "--lr",
        "0.005",
        "close_mosaic=2",
        "--prompt-mode",
        "linear",
    ).cfg
    assert (mine.optimizer, mine.lr, mine.weight_decay, mine.close_mosaic) == ("SGD", 0.005, 5e-4, 2)
    assert (
        any("yours kept: close_mosaic, lr" in n for n in mine.notes)
        and loop.prompt_mode_text(mine) == "linear (train_pe)"
    )
    linear = inputs(
        data,
        "--weights",
        str(ckpt),
        "--text-embeddings",
        str(embeddings),
        "--prompt-mode",
        "linear",
        "scale=0.5",
        "mixup=0.0",
    )
    # train_pe.py's close_mosaic 5: a 10-epoch linear probe trains 5 epochs with mosaic; the user's values win
    assert (linear.cfg.close_mosaic, linear.hyp.close_mosaic, linear.hyp.scale, linear.hyp.mixup) == (5, 5, 0.5, 0.0)
    assert linear.hyp.copy_paste == 0.3
    assert any(
        n.startswith("YOLOE recipe (train_pe.py, coco_s_train.yaml): ") and "yours kept: mixup, scale" in n
        for n in linear.cfg.notes
    ), linear.cfg.notes
    moved = models.to_device(model, CPU)
    assert isinstance(moved.pe, torch.Tensor) and moved.pe.device == CPU


@pytest.mark.parametrize(
    "argv, ranks, equivalent",
    [
        (["--lr", "0.08"], 8, "0.01"),  # seed 001: 0.01 x 8 GPUs
        (["--lr", "0.02"], 2, "0.01"),  # its two-GPU line: exactly ultralytics' rate x the ranks
        (["--lr", "0.04", "--optimizer", "AdamW"], 4, "0.01"),
        (["--lr", "0.01"], 8, None),  # ultralytics' own rate: the note only
        (["--lr", "0.08"], 1, None),  # one rank: nothing was multiplied
        ([], 8, None),  # optimizer auto picks its own rate
    ],
)
def test_an_lr_multiplied_by_the_gpu_count_is_warned_with_the_equivalent_lr0(
    data: Path, argv: list[str], ranks: int, equivalent: str | None
) -> None:
    from types import SimpleNamespace

    from trainer.config import with_world_size

    topo = Topology(world_size=ranks, launched=ranks > 1, local_world_size=ranks)
    cfg = with_world_size(parse_config(["--data", str(data), "--imgsz", "64", "--batch", str(2 * ranks), *argv]), ranks)
    inp = loop.prepare(cfg, topo, CPU)
    kind = torch.optim.AdamW if "AdamW" in argv else torch.optim.SGD
    optimizer = kind([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr or 0.01)
    optimizer.param_groups[0]["initial_lr"] = cfg.lr or 0.01
    parts = SimpleNamespace(optimizer=optimizer, nominal_accumulate=1, unused=[], model=torch.nn.Linear(1, 1))
    lines = loop.startup_lines(inp, parts, 0)  # type: ignore[arg-type]
    assert lines[0].startswith("training ")
    warned = [ln for ln in lines if "looks multiplied by the GPU count" in ln]
    if equivalent is None:
        assert not warned, lines
        return
    assert len(warned) == 1 and warned[0].startswith(f"warning: lr0 {cfg.lr:g} on {ranks} ranks"), lines
    assert f"steps about {ranks}x ultralytics'" in warned[0]
    assert warned[0].endswith(f"the equivalent of ultralytics' recipe is lr0 {equivalent} (--lr {equivalent})")
    assert ("summed loss" in warned[0]) == (kind is torch.optim.SGD)


@pytest.mark.parametrize("scale, expected", [("s", 0.6), ("m", 0.9), ("l", 0.9), ("n", None)])
def test_the_yoloe_recipe_augments_by_model_scale_as_thu_migs_coco_yamls(
    data: Path, scale: str, expected: float | None
) -> None:
    cfg = loop.yoloe_recipe(parse_config(["--data", str(data)]), scale)
    assert cfg.hyp.get("scale") == expected and cfg.hyp["mixup"] == 0.15 and cfg.hyp["copy_paste"] == 0.3
    assert (
        all(
            n.startswith(f"YOLOE recipe (train_pe_all.py, coco_{scale}_train.yaml)")
            for n in cfg.notes
            if n.startswith("YOLOE recipe")
        )
        if expected
        else "coco_" not in " ".join(cfg.notes)
    )
    assert loop.yoloe_recipe(parse_config(["--data", str(data), "--cfg", "scale=0.3"]), scale).hyp["scale"] == 0.3


def test_detection_and_segmentation_runs_keep_ultralytics_augmentation(data: Path) -> None:
    """The YOLOE recipe is YOLOE's only: a YOLO12 run trains with ultralytics' own defaults."""
    from ultralytics.utils import DEFAULT_CFG_DICT

    for arch in ("yolo12n.yaml", "yolo12n-seg.yaml"):
        inp = inputs(data, "--model", arch)
        assert all(
            getattr(inp.hyp, k) == DEFAULT_CFG_DICT[k] for k in ("scale", "mixup", "copy_paste", "warmup_bias_lr")
        )
        assert inp.cfg.close_mosaic == 10 and not any(n.startswith("YOLOE recipe") for n in inp.cfg.notes)


def test_yoloe_prompts_come_from_one_place_or_the_start_is_refused(
    tmp_path: Path, data: Path, embeddings: Path
) -> None:
    """A YOLOE model without fused prompts needs --text-embeddings (refused before any rank builds
    it: `--check` says what the start would); a fused checkpoint (one this trainer wrote) has no text
    projection left: embeddings given with it would be ignored, so they are refused."""
    from copy import deepcopy

    with pytest.raises(
        TrainerError,
        match=r"^YOLOE needs text-prompt embeddings \(yoloe-11s-seg.yaml\): pass "
        r"--text-embeddings FILE",
    ):
        inputs(data, "--model", "yoloe-11s-seg.yaml")
    unfused = tmp_path / "yoloe.pt"
    save_checkpoint(unfused, "yoloe-11s-seg.yaml", NAMES)
    with pytest.raises(TrainerError, match="YOLOE needs text-prompt embeddings"):
        inputs(data, "--weights", str(unfused))
    model = loop.build_network(inputs(data, "--weights", str(unfused), "--text-embeddings", str(embeddings)))
    assert models.is_fused(model)
    fused = tmp_path / "fused.pt"
    torch.save(
        {
            "epoch": -1,
            "model": deepcopy(model).half(),
            "ema": None,
            "optimizer": None,
            "train_args": {"task": "segment"},
        },
        fused,
    )
    with pytest.raises(
        TrainerError,
        match=r"^--text-embeddings .*: the checkpoint .*fused.pt is a YOLOE model whose "
        r"class prompts are already fused into its weights",
    ):
        inputs(data, "--weights", str(fused), "--text-embeddings", str(embeddings))
    again = inputs(data, "--weights", str(fused))  # its own prompts: accepted, and it builds
    assert models.is_fused(loop.build_network(again))


def test_optimizer_auto_trains_sgd_on_a_v100_where_ultralytics_picks_musgd(data: Path) -> None:
    """Beyond 10 000 iterations ultralytics' auto picks MuSGD, whose Newton-Schulz iterations run in
    bfloat16: emulated on a V100 (compute capability 7.0), where the trainer trains SGD lr0 0.01
    momentum 0.9 instead, says so and records it (args.yaml); an A100 and a CPU keep MuSGD."""
    from dataclasses import replace

    def built(device: torch.device, capability: tuple[int, int] | None) -> tuple[loop.Inputs, torch.optim.Optimizer]:
        inp = replace(inputs(data, "--epochs", "20000"), device=device, capability=capability)  # 20 000 iterations
        return inp, loop.build_optimizer(loop.build_network(inp), inp, 1, 6)

    v100, optimizer = built(torch.device("cuda", 0), (7, 0))
    assert type(optimizer).__name__ == "SGD" and optimizer.param_groups[0]["initial_lr"] == 0.01
    assert optimizer.param_groups[0]["momentum"] == 0.9 and optimizer.param_groups[0]["nesterov"] is True
    assert (v100.hyp.optimizer, v100.hyp.lr0, v100.hyp.momentum, v100.hyp.warmup_bias_lr) == ("SGD", 0.01, 0.9, 0.0)
    assert [n for n in v100.cfg.notes if n.startswith("optimizer auto: SGD lr0 0.01 momentum 0.9 instead of MuSGD")]
    for device, capability in ((torch.device("cuda", 0), (8, 0)), (CPU, None)):
        inp, optimizer = built(device, capability)
        assert type(optimizer).__name__ == "MuSGD" and inp.hyp.optimizer == "MuSGD", device


@pytest.mark.parametrize("deterministic", [True, False])
def test_cudnn_benchmark_is_on_exactly_when_not_deterministic(data: Path, deterministic: bool) -> None:
    """ultralytics' deterministic=False lets cuDNN choose its convolution algorithms by timing them."""
    before = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = deterministic  # the opposite of what the run must set
        loop.build_parts(inputs(data, "--deterministic", str(deterministic).lower()), 2)
        assert torch.backends.cudnn.benchmark is (not deterministic)
        assert torch.backends.cudnn.deterministic is deterministic  # ultralytics' init_seeds
    finally:
        torch.backends.cudnn.benchmark = before
        torch.use_deterministic_algorithms(False)
