"""Command line → ``TrainConfig``: every flag, its default, and the checks that need no I/O."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path

from trainer.errors import TrainerError

NOMINAL_BATCH = 64
"""``--lr`` is the learning rate for this many images per optimizer step (ultralytics' ``nbs``)."""

EXAMPLES = """\
examples:
  # one process, CPU or one GPU
  python -m trainer --model yolo12n.yaml --data /data/coco8/data.yaml --epochs 3 --batch 16 --imgsz 320

  # 2 nodes x 8 GPUs, global batch 256 (16 per GPU), started by torchrun on every node
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \\
      -m trainer --model yolo12m.yaml --data /mnt/nfs/coco/data.yaml --batch 256 --epochs 100 --out /mnt/nfs/runs/y12m

  # YOLOE linear probing from a checkpoint, text prompts from a precomputed file
  python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt   # once, where the text model is
  torchrun --nproc-per-node 8 -m trainer --model yoloe-11s.yaml --weights /models/yoloe-11s-seg.pt \\
      --data /data/mine/data.yaml --text-embeddings /data/mine/text_pe.pt --prompt-mode linear

  # continue a run that stopped (same command plus --resume)
  torchrun ... -m trainer ... --out /mnt/nfs/runs/y12m --resume
"""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; built from the command line by ``parse_config``."""

    model: str = "yolo12n.yaml"
    """Architecture YAML with the scale in its name (yolo12{n,s,m,l,x}.yaml, yoloe-11s.yaml, yoloe-v8l-seg.yaml)."""
    weights: str | None = None
    """Checkpoint (.pt) to start from; its architecture wins over ``model`` when ``model`` is left default."""
    data: str = ""
    """Absolute path of a YOLO-format data YAML with ``train``, ``val`` and non-empty ``names``."""
    epochs: int = 100
    """Number of passes over the training set."""
    batch: int = 16
    """Global batch: images per micro-step over all ranks; must divide by WORLD_SIZE."""
    imgsz: int = 640
    """Square training and validation image size in pixels (multiple of 32)."""
    lr: float = 0.01
    """SGD learning rate for the nominal batch of 64 images; the effective rate scales linearly."""
    lrf: float = 0.01
    """Final learning rate as a fraction of the initial one (linear decay over the epochs)."""
    momentum: float = 0.937
    """SGD momentum (Nesterov)."""
    weight_decay: float = 5e-4
    """Weight decay of conv/linear weights (not of biases or norm layers)."""
    warmup_epochs: float = 3.0
    """Epochs of linear warmup of learning rate and momentum (fractions allowed)."""
    accumulate: int = 1
    """Micro-steps per optimizer step; gradients are all-reduced only on the last one."""
    clip: float = 10.0
    """Max gradient norm (0 disables clipping)."""
    amp: str = "auto"
    """Mixed precision: auto (fp16 on CUDA, off on CPU), off, fp16 (CUDA + GradScaler), bf16."""
    sync_bn: bool = False
    """Convert BatchNorm to SyncBatchNorm (CUDA only; helps at <= 8 images per GPU)."""
    workers: int = 4
    """Data loader worker processes per rank."""
    seed: int = 0
    """Seed of model init, sampler order and augmentation; same on every rank."""
    out: str = "runs/train/exp"
    """Run directory: weights/last.pt, best.pt, epochN.pt, results.csv, args.yaml."""
    save_period: int = 0
    """Also keep weights/epoch{N}.pt every N epochs (0: never)."""
    val_period: int = 1
    """Validate every N epochs (and always after the last one); 0 disables validation."""
    resume: str | None = None
    """Checkpoint to continue from ('' means <out>/weights/last.pt)."""
    text_embeddings: str | None = None
    """YOLOE: file mapping class name → text embedding (from ``python -m trainer.embed``)."""
    prompt_mode: str = "linear"
    """YOLOE: linear (only the prompt head trains, like train_pe) or full (everything, like train_pe_all)."""
    log_every: int = 10
    """Rank 0 prints one progress line every N optimizer steps."""
    ref_ips: float | None = None
    """Single-rank images/s to report scaling efficiency against."""
    device: str = "auto"
    """auto, cpu or cuda (each rank uses cuda:LOCAL_RANK)."""
    cfg: tuple[str, ...] = ()
    """ultralytics hyperparameter overrides as key=value (mosaic=0.5, close_mosaic=0, fliplr=0...)."""
    timeout_min: float = 30.0
    """Minutes a collective may wait before the process group gives up (a lost node ends the job)."""
    debug_dir: str | None = None
    """Testing aid: each rank writes rank{R}.json (samples seen per epoch, parameter checksum)."""
    debug_exit_after: int = 0
    """Testing aid: exit abruptly (code 3) after saving this epoch, as if the job were killed."""
    extra: dict[str, str] = field(default_factory=dict)
    """Parsed ``cfg`` overrides."""

    @property
    def out_dir(self) -> Path:
        """The run directory as a Path."""
        return Path(self.out)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m trainer`` argument parser; ``--help`` shows every flag and examples."""
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="DDP training of ultralytics YOLO12 / YOLOE models; run it under torchrun on every node.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("--model", default=d.model, help=f"architecture YAML, scale in the name, e.g. yolo12s.yaml, yoloe-v8l-seg.yaml (default {d.model})")
    a("--weights", help="absolute path of a .pt checkpoint to start from, e.g. /models/yolo12n.pt")
    a("--data", required=True, help="absolute path of the data YAML (train, val, names), e.g. /data/coco/data.yaml")
    a("--epochs", type=int, default=d.epochs, help=f"training epochs (default {d.epochs})")
    a("--batch", type=int, default=d.batch, help=f"global batch over all ranks, divisible by WORLD_SIZE, e.g. 256 on 16 GPUs (default {d.batch})")
    a("--imgsz", type=int, default=d.imgsz, help=f"image size, e.g. 640 (default {d.imgsz})")
    a("--lr", type=float, default=d.lr, help=f"learning rate at the nominal batch {NOMINAL_BATCH}; scaled by global batch x accumulate / {NOMINAL_BATCH} (default {d.lr})")
    a("--lrf", type=float, default=d.lrf, help=f"final lr fraction, e.g. 0.01 (default {d.lrf})")
    a("--momentum", type=float, default=d.momentum, help=f"SGD momentum (default {d.momentum})")
    a("--weight-decay", type=float, default=d.weight_decay, help=f"weight decay (default {d.weight_decay})")
    a("--warmup-epochs", type=float, default=d.warmup_epochs, help=f"warmup epochs, e.g. 1.5 (default {d.warmup_epochs})")
    a("--accumulate", type=int, default=d.accumulate, help=f"micro-steps per optimizer step, e.g. 2 (default {d.accumulate})")
    a("--clip", type=float, default=d.clip, help=f"max gradient norm, 0 = off (default {d.clip})")
    a("--amp", choices=["auto", "off", "fp16", "bf16"], default=d.amp, help="mixed precision: auto = fp16 on CUDA, off on CPU (default auto)")
    a("--sync-bn", action="store_true", help="SyncBatchNorm across ranks (CUDA only), e.g. for <= 8 images per GPU")
    a("--workers", type=int, default=d.workers, help=f"data loader workers per rank, e.g. 8 (default {d.workers})")
    a("--seed", type=int, default=d.seed, help=f"random seed, same on all ranks (default {d.seed})")
    a("--out", help=f"run directory, e.g. /mnt/nfs/runs/y12m (default {d.out}, or PROJECT/NAME)")
    a("--project", default="runs/train", help="parent of the run directory when --out is not given (default runs/train)")
    a("--name", help="run directory name under --project (default: the orch run id when started by orch "
                     "up, so every run gets its own directory; else exp)")
    a("--save-period", type=int, default=d.save_period, help="also keep weights/epochN.pt every N epochs, e.g. 10 (default 0 = never)")
    a("--val-period", type=int, default=d.val_period, help="validate every N epochs and after the last, 0 = never (default 1)")
    a("--resume", nargs="?", const="", default=None, metavar="PATH", help="continue from PATH, or from OUT/weights/last.pt without PATH")
    a("--text-embeddings", help="YOLOE: absolute path of the class-name -> vector file from `python -m trainer.embed`")
    a("--prompt-mode", choices=["linear", "full"], default=d.prompt_mode, help="YOLOE: linear = train the prompt head only, full = train everything (default linear)")
    a("--log-every", type=int, default=d.log_every, help=f"rank 0 prints a progress line every N steps, e.g. 50 (default {d.log_every})")
    a("--ref-ips", type=float, help="single-rank images/s for the scaling-efficiency column, e.g. 95.5")
    a("--device", choices=["auto", "cpu", "cuda"], default=d.device, help="auto = cuda:LOCAL_RANK if CUDA is available (default auto)")
    a("--cfg", action="append", default=[], metavar="KEY=VALUE", help="ultralytics hyperparameter override, repeatable, e.g. --cfg mosaic=0 --cfg close_mosaic=0")
    a("--timeout-min", type=float, default=d.timeout_min, help=f"collective timeout in minutes (default {d.timeout_min:g})")
    a("--debug-dir", help="testing: each rank writes DIR/rank{R}.json with samples seen and a parameter checksum")
    a("--debug-exit-after", type=int, default=0, metavar="EPOCH", help="testing: exit with code 3 right after saving EPOCH, as if killed")
    return p


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["mosaic=0", ...]`` → ``{"mosaic": "0"}``.

    Raises:
        TrainerError: an item without ``=``.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TrainerError(f"--cfg expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse the command line into a checked ``TrainConfig``.

    Raises:
        TrainerError: a value no run could use (non-positive batch, epochs or accumulate).
    """
    ns = build_parser().parse_args(argv)
    # A leading `~/` means this node's home: no shell expands it (orch quotes every argument),
    # and it is how one inventory names per-node paths that are absolute on every node.
    for name in ("weights", "data", "out", "project", "text_embeddings", "debug_dir"):
        value = getattr(ns, name)
        if isinstance(value, str) and value.startswith("~"):
            setattr(ns, name, os.path.expanduser(value))
    if isinstance(ns.resume, str) and ns.resume.startswith("~"):
        ns.resume = os.path.expanduser(ns.resume)
    # Started by `orch up`: one directory per orch run, so running the same inventory twice never
    # collides with (or silently resumes) the previous run's weights.
    name = ns.name or os.environ.get("ORCH_RUN_ID") or "exp"
    out = ns.out or str(Path(ns.project) / name)
    cfg = TrainConfig(
        model=ns.model, weights=ns.weights, data=ns.data, epochs=ns.epochs, batch=ns.batch, imgsz=ns.imgsz,
        lr=ns.lr, lrf=ns.lrf, momentum=ns.momentum, weight_decay=ns.weight_decay, warmup_epochs=ns.warmup_epochs,
        accumulate=ns.accumulate, clip=ns.clip, amp=ns.amp, sync_bn=ns.sync_bn, workers=ns.workers, seed=ns.seed,
        out=out, save_period=ns.save_period, val_period=ns.val_period, resume=ns.resume,
        text_embeddings=ns.text_embeddings, prompt_mode=ns.prompt_mode, log_every=ns.log_every,
        ref_ips=ns.ref_ips, device=ns.device, cfg=tuple(ns.cfg), timeout_min=ns.timeout_min,
        debug_dir=ns.debug_dir, debug_exit_after=ns.debug_exit_after, extra=parse_overrides(ns.cfg),
    )
    for name in ("epochs", "batch", "accumulate", "imgsz", "log_every"):
        if getattr(cfg, name) < 1:
            raise TrainerError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    return cfg


def effective_lr(cfg: TrainConfig) -> float:
    """``--lr`` scaled linearly from the nominal batch to the images per optimizer step."""
    return cfg.lr * cfg.batch * cfg.accumulate / NOMINAL_BATCH


def effective_lr_text(cfg: TrainConfig) -> str:
    """``"0.01 @ 64 -> 0.04"``: the flag, its batch, and the rate actually used."""
    return f"{cfg.lr:g} @ {NOMINAL_BATCH} -> {effective_lr(cfg):g}"


def check_topology(cfg: TrainConfig, world_size: int, launched: bool) -> None:
    """Checks that depend on the job's shape, made identically on every rank.

    Raises:
        TrainerError: global batch not divisible by the world size; a relative weights, data or
            text-embeddings path under torchrun (each node may start in another directory).
    """
    if cfg.batch % world_size:
        lo = cfg.batch // world_size * world_size
        raise TrainerError(
            f"--batch {cfg.batch} is not divisible by WORLD_SIZE {world_size}: "
            f"use {lo or world_size} or {lo + world_size} ({cfg.batch / world_size:.2f} images per rank is not possible)"
        )
    if launched:
        for flag, value in (("--data", cfg.data), ("--weights", cfg.weights), ("--text-embeddings", cfg.text_embeddings)):
            if value and not Path(value).is_absolute():
                raise TrainerError(
                    f"{flag} {value} is relative; under torchrun every node must see the same absolute path "
                    f"(here it would be {Path(value).absolute()})"
                )
