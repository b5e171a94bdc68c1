"""The training loop: build everything from a ``TrainConfig``, then epochs of DDP steps.

Reads like nanoGPT's train.py: the DDP idiom is a handful of lines (``no_sync`` on all but the
last micro-step, rank 0 logs and saves, every rank validates its shard). What ultralytics already
does well (model, loss, datasets and augmentation, validator, EMA, optimizer parameter groups) is
called, not copied.
"""

from __future__ import annotations

import csv
import hashlib
import inspect
import json
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import checkpoint, models
from trainer import data as tdata
from trainer import dist as tdist
from trainer.config import NOMINAL_BATCH, TrainConfig, effective_lr, effective_lr_text
from trainer.dist import Topology
from trainer.errors import TrainerError
from trainer.logs import StepMeter, say, throughput_table
from trainer.validate import make_validator, run_validation


@dataclass
class Inputs:
    """Everything read from disk and checked before the process group exists.

    Every rank reads and checks the same files, so a bad input stops every rank with the same
    one-line message instead of leaving the others waiting in a collective.
    """

    cfg: TrainConfig
    """The parsed command line."""
    topo: Topology
    """This process's place in the job."""
    device: torch.device
    """This rank's device."""
    data: dict[str, Any]
    """The checked data YAML."""
    arch: str | dict[str, Any]
    """Architecture to build (YAML name or the checkpoint's YAML dict)."""
    task: str
    """detect or segment."""
    amp: str
    """Resolved precision: off, fp16 or bf16."""
    hyp: SimpleNamespace
    """ultralytics hyperparameters (loss gains, augmentation) as its own namespace."""
    weights_model: nn.Module | None = None
    """The ``--weights`` model, if any."""
    text_pe: torch.Tensor | None = None
    """YOLOE raw text embeddings (1, nc, D), if any."""
    resume: dict[str, Any] | None = None
    """The checkpoint to continue from, if any."""


def prepare(cfg: TrainConfig, topo: Topology, device: torch.device) -> Inputs:
    """Read and check data YAML, weights, text embeddings and resume checkpoint.

    Raises:
        TrainerError: any input a run cannot use, with the fix in the message.
    """
    data = tdata.load_data_yaml(cfg.data)
    weights_model = models.load_weights(cfg.weights)[0] if cfg.weights else None
    arch = models.architecture(cfg.model, weights_model)
    name = arch if isinstance(arch, str) else str(arch.get("yaml_file", "checkpoint"))
    yoloe = models.is_yoloe(name)
    if cfg.text_embeddings and not yoloe:
        raise TrainerError(f"--text-embeddings is for YOLOE models; --model {name} is not one")
    names = list(data["names"].values())
    text_pe = models.load_text_embeddings(cfg.text_embeddings, names) if cfg.text_embeddings else None
    amp = cfg.amp if cfg.amp != "auto" else ("fp16" if device.type == "cuda" else "off")
    if amp == "fp16" and device.type != "cuda":
        raise TrainerError("--amp fp16 needs CUDA (GradScaler); on CPU use --amp off or --amp bf16")
    resume = None
    if cfg.resume is not None:
        resume = checkpoint.load_for_resume(Path(cfg.resume) if cfg.resume else cfg.out_dir / "weights" / "last.pt")
    elif (cfg.out_dir / "weights" / "last.pt").exists():
        raise TrainerError(f"--out {cfg.out} already holds a run (weights/last.pt): add --resume, or pick another --out")
    task = models.task_of(name)
    hyp = ultralytics_hyp(cfg, name, task, amp)
    return Inputs(cfg, topo, device, data, arch, task, amp, hyp, weights_model, text_pe, resume)


def ultralytics_hyp(cfg: TrainConfig, model_name: str, task: str, amp: str) -> SimpleNamespace:
    """ultralytics' config namespace (loss gains, augmentation) with our flags and ``--cfg`` overrides.

    Raises:
        TrainerError: an unknown ``--cfg`` key or a value of the wrong type.
    """
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG_DICT

    overrides: dict[str, Any] = {
        "model": model_name, "data": cfg.data, "task": task, "epochs": cfg.epochs, "batch": cfg.batch,
        "imgsz": cfg.imgsz, "lr0": cfg.lr, "lrf": cfg.lrf, "momentum": cfg.momentum,
        "weight_decay": cfg.weight_decay, "warmup_epochs": cfg.warmup_epochs, "workers": cfg.workers,
        "seed": cfg.seed, "nbs": NOMINAL_BATCH, "amp": amp != "off", "save_period": cfg.save_period or -1,
        "optimizer": "SGD", "plots": False, "val": cfg.val_period > 0, "project": str(cfg.out_dir.parent),
        "name": cfg.out_dir.name, "exist_ok": True, "verbose": False,
    }
    for key, value in cfg.extra.items():
        if key not in DEFAULT_CFG_DICT:
            raise TrainerError(f"--cfg {key}={value}: unknown ultralytics setting")
        overrides[key] = yaml.safe_load(value)
    try:
        return get_cfg(DEFAULT_CFG_DICT, overrides)
    except (TypeError, ValueError, SyntaxError) as e:
        raise TrainerError(f"--cfg: {str(e).splitlines()[0]}") from None


@dataclass
class State:
    """What changes while training and goes into checkpoints."""

    epoch: int = 0
    """Next epoch to run (0-based)."""
    best_fitness: float = -1.0
    """Best validation fitness (mAP50-95) so far."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Last validation metrics, repeated in results.csv rows of epochs without validation."""
    seen: dict[int, list[str]] = field(default_factory=dict)
    """Debug: image files this rank trained on, per epoch."""


def fit(inp: Inputs) -> None:
    """Train for ``cfg.epochs`` epochs (continuing a resumed run), validate, checkpoint, log."""
    cfg, topo, device = inp.cfg, inp.topo, inp.device
    from ultralytics.utils.torch_utils import ModelEMA

    torch.manual_seed(cfg.seed)  # identical initial weights on every rank and at every world size
    model = build_network(inp).to(device)
    if cfg.sync_bn and device.type == "cuda" and topo.distributed:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    elif cfg.sync_bn:
        say("warning: --sync-bn ignored (needs CUDA and more than one rank)")
    ema = ModelEMA(model)
    optimizer = build_optimizer(model, inp)
    scaler = torch.amp.GradScaler("cuda") if inp.amp == "fp16" else None
    ddp = wrap_ddp(model, device) if topo.distributed else model

    local_batch = cfg.batch // topo.world_size
    stride = max(int(model.stride.max()), 32)
    with tdata.one_writer_first(topo):
        train_set = tdata.build_dataset(inp.hyp, inp.data, "train", local_batch, stride)
        val_set = tdata.build_dataset(inp.hyp, inp.data, "val", local_batch * 2, stride) if cfg.val_period else None
    loader = tdata.train_loader(train_set, local_batch, cfg.workers, cfg.seed, topo, device)
    validator = None
    if val_set is not None:
        vloader = tdata.val_loader(val_set, local_batch * 2, cfg.workers, topo, device)
        validator = make_validator(inp.task, vloader, cfg.out_dir, inp.hyp)

    state = State()
    if inp.resume is not None:
        state = restore(inp.resume, model, ema, optimizer, scaler, topo)
        if state.epoch >= cfg.epochs:
            say(f"nothing to do: the checkpoint already finished epoch {state.epoch} of {cfg.epochs}")
            return
    else:
        # Augmentation streams differ per rank (like ultralytics' seed + 1 + RANK); sampler order does not.
        seed_everything(cfg.seed + 1 + topo.rank)
    if topo.is_main:
        write_args(cfg, inp.hyp)
        say(f"training {cfg.model or 'checkpoint'} on {topo.world_size} rank(s), {device.type}, global batch "
            f"{cfg.batch} ({local_batch} per rank) x accumulate {cfg.accumulate}, "
            f"lr {effective_lr_text(cfg)}, amp {inp.amp}, epochs {state.epoch + 1}..{cfg.epochs}")

    mosaic_closed = False
    train_start = time.time()
    for epoch in range(state.epoch, cfg.epochs):
        if not mosaic_closed and epoch >= cfg.epochs - inp.hyp.close_mosaic:
            mosaic_closed = True
            train_set.close_mosaic(inp.hyp)
            loader = tdata.train_loader(train_set, local_batch, cfg.workers, cfg.seed, topo, device)  # fresh workers see it
        loss_means = train_epoch(epoch, ddp, model, ema, optimizer, scaler, loader, inp, state)
        if validator is not None and not state.metrics:  # fixed results.csv columns from the first row on
            state.metrics = {**dict.fromkeys(validator.metrics.keys, 0.0), **{f"val/{k}": 0.0 for k in loss_means}}
        ema.update_attr(model, include=["yaml", "nc", "args", "names", "stride", "class_weights"])
        fitness = None
        if validator is not None and (((epoch + 1) % cfg.val_period == 0) or epoch + 1 == cfg.epochs):
            tdist.broadcast_buffers(ema.ema)
            results = run_validation(validator, ema, device, inp.data, inp.amp != "off", tuple(loss_means),
                                     epoch, cfg.epochs, topo.world_size)
            results = tdist.broadcast_object(results)
            fitness = float(results.pop("fitness", results.get("metrics/mAP50-95(B)", 0.0)))
            state.metrics = results
            say_metrics(epoch, cfg.epochs, results)
        end_epoch(epoch, fitness, loss_means, model, ema, optimizer, scaler, inp, state, train_start)
        if cfg.debug_exit_after and epoch + 1 == cfg.debug_exit_after:
            tdist.barrier()
            say(f"debug: exiting abruptly after epoch {epoch + 1} (--debug-exit-after)")
            os._exit(3)
    if cfg.debug_dir:
        write_debug(Path(cfg.debug_dir), topo, model, state)
    tdist.barrier()
    if topo.is_main:
        out = cfg.out_dir.resolve()  # absolute, so `orch report` can fetch results.csv from this node
        say(f"done: {cfg.epochs} epochs in {time.time() - train_start:.1f} s; weights in {out / 'weights'}, "
            f"results in {out / 'results.csv'}")


def wrap_ddp(model: nn.Module, device: torch.device) -> DDP:
    """DDP as ultralytics configures it: rank-local BatchNorm buffers, unused parameters allowed.

    find_unused_parameters: a scale with no target in a batch leaves head parameters without a
    gradient, and without it DDP waits for them forever (ultralytics #24536). Buffers are not
    synced on every forward (ultralytics' broadcast_buffers=False); the EMA's are broadcast
    before validation instead.
    """
    buffers = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else {"broadcast_buffers": False})  # the new name since torch 2.14; same behaviour
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=True, **buffers)


def build_network(inp: Inputs) -> nn.Module:
    """The model with its classes, pretrained weights and (YOLOE) prompt head set up."""
    model = models.build_model(inp.arch, inp.data["names"], inp.hyp, inp.weights_model)
    name = inp.arch if isinstance(inp.arch, str) else str(inp.arch.get("yaml_file", ""))
    if models.is_yoloe(name):
        models.setup_yoloe_prompts(model, inp.data["names"], inp.text_pe, inp.weights_model, inp.cfg.prompt_mode)
    models.freeze_dfl(model)
    return model


def build_optimizer(model: nn.Module, inp: Inputs) -> torch.optim.Optimizer:
    """SGD over ultralytics' three parameter groups (weights with decay, norm weights, biases).

    The loss is kept on ultralytics' scale (summed over a nominal batch of 64; its gains and lr0
    are tuned for that) and averaged over the images of the step, so ``--lr`` means what lr0
    means there and the linear scaling rule is applied here, visibly, to the rate.
    """
    from ultralytics.engine.trainer import BaseTrainer

    shim = SimpleNamespace(args=inp.hyp, data=inp.data)  # only read for optimizer="auto", which we never use
    lr = effective_lr(inp.cfg)
    optimizer = BaseTrainer.build_optimizer(shim, model, name="SGD", lr=lr, momentum=inp.cfg.momentum,
                                            decay=inp.cfg.weight_decay)
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    return optimizer


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (augmentation runs on all three)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_at(step: float, epoch: int, steps_per_epoch: int, inp: Inputs, group: dict[str, Any]) -> tuple[float, float | None]:
    """Learning rate and momentum of a parameter group at optimizer step ``step``.

    Linear decay per epoch to ``lrf``; during warmup, biases fall from ``warmup_bias_lr`` and
    everything else rises from 0, while momentum rises from ``warmup_momentum`` (ultralytics' recipe).
    """
    cfg, hyp = inp.cfg, inp.hyp
    target = group["initial_lr"] * ((1 - epoch / cfg.epochs) * (1.0 - cfg.lrf) + cfg.lrf)
    warmup = round(cfg.warmup_epochs * steps_per_epoch) if cfg.warmup_epochs > 0 else 0
    if step >= warmup:
        return target, cfg.momentum
    start = hyp.warmup_bias_lr * cfg.batch * cfg.accumulate / NOMINAL_BATCH if group.get("param_group") == "bias" else 0.0
    lr = float(np.interp(step, [0, warmup], [start, target]))
    return lr, float(np.interp(step, [0, warmup], [hyp.warmup_momentum, cfg.momentum]))


def preprocess(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Move a collated batch to the device; images to float in [0, 1]."""
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            batch[k] = v.to(device, non_blocking=True)
    batch["img"] = batch["img"].float() / 255
    return batch


def train_epoch(epoch: int, ddp: nn.Module, model: nn.Module, ema: Any, optimizer: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler | None, loader: Any, inp: Inputs, state: State) -> dict[str, float]:
    """One pass over this rank's shard; returns the epoch's mean loss components over all ranks."""
    cfg, topo, device = inp.cfg, inp.topo, inp.device
    loader.sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank
    model.train()
    criterion = getattr(model, "criterion", None)
    if criterion is not None and hasattr(criterion, "update"):
        criterion.update()
    nb = len(loader)
    steps_per_epoch = math.ceil(nb / cfg.accumulate)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16 if inp.amp == "bf16" else torch.float16,
                              enabled=inp.amp != "off")
    sums: dict[str, float] = {}
    epoch_meter, window = StepMeter(), StepMeter()
    seen = state.seen.setdefault(epoch + 1, []) if cfg.debug_dir else None
    t_prev = time.perf_counter()
    for i, batch in enumerate(loader):
        t_batch = time.perf_counter()
        step = epoch * steps_per_epoch + i // cfg.accumulate
        first_micro, last_micro = i % cfg.accumulate == 0, (i + 1) % cfg.accumulate == 0 or i + 1 == nb
        if first_micro:
            for group in optimizer.param_groups:
                group["lr"], momentum = lr_at(step, epoch, steps_per_epoch, inp, group)
                if momentum is not None and "momentum" in group:
                    group["momentum"] = momentum
        if seen is not None:
            seen.extend(Path(f).name for f in batch["im_file"])
        batch = preprocess(batch, device)
        micro = min(cfg.accumulate, nb - (i // cfg.accumulate) * cfg.accumulate)  # micro-steps in this step
        n_local = batch["img"].shape[0]
        # In DDP only the last micro-step of an optimizer step needs to all-reduce gradients.
        sync = nullcontext() if (last_micro or not topo.distributed) else ddp.no_sync()
        with sync:
            with autocast:
                loss, items = ddp(batch)
            # criterion returns (component means) x local batch; scale to "summed over the nominal batch,
            # averaged over the step's images". DDP averages over ranks.
            (scaler.scale(loss.sum() * NOMINAL_BATCH / (n_local * micro)) if scaler
             else loss.sum() * NOMINAL_BATCH / (n_local * micro)).backward()
        if last_micro:
            optimizer_step(model, optimizer, scaler, cfg.clip)
            ema.update(model)
        for k, v in items.items():
            sums[k] = sums.get(k, 0.0) + float(v) * n_local
        sums["_images"] = sums.get("_images", 0.0) + n_local
        t_end = time.perf_counter()
        if i > 0:  # the first step of an epoch waits for workers to start: not throughput
            epoch_meter.add(n_local, t_batch - t_prev, t_end - t_prev)
        window.add(n_local, t_batch - t_prev, t_end - t_prev)
        if last_micro and topo.is_main and ((step + 1) % cfg.log_every == 0 or i + 1 == nb):
            say(step_line(epoch, cfg.epochs, step % steps_per_epoch + 1, steps_per_epoch, items,
                          optimizer, window, topo.world_size))
            window = StepMeter()
        t_prev = time.perf_counter()
    return epoch_summary(epoch, sums, epoch_meter, inp)


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                   clip: float) -> None:
    """Unscale, clip, step, zero: the order AMP needs (unscale before measuring the norm)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=clip)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_line(epoch: int, epochs: int, step: int, steps: int, items: dict[str, Any],
              optimizer: torch.optim.Optimizer, window: StepMeter, world_size: int) -> str:
    """Rank 0's progress line: epoch, step, loss components, lr, global images/s, data wait."""
    losses = " ".join(f"{k} {float(v):.4f}" for k, v in items.items())
    lr = optimizer.param_groups[0]["lr"]
    return (f"epoch {epoch + 1}/{epochs} step {step}/{steps} {losses} lr {lr:.6f} "
            f"images/s {window.ips * world_size:.1f} data {window.wait_share:.0%}")


def epoch_summary(epoch: int, sums: dict[str, float], meter: StepMeter, inp: Inputs) -> dict[str, float]:
    """Gather every rank's losses and throughput; rank 0 prints the throughput table."""
    keys = [k for k in sums if k != "_images"]
    rows = tdist.gather_rows([*(sums[k] for k in keys), sums.get("_images", 0.0),
                              meter.images, meter.wait_s, meter.total_s], inp.device)
    images = sum(r[len(keys)] for r in rows)
    means = {k: sum(r[j] for r in rows) / max(images, 1.0) for j, k in enumerate(keys)}
    if inp.topo.is_main:
        say(throughput_table(epoch + 1, [r[len(keys) + 1:] for r in rows], inp.cfg.ref_ips))
    return means


def say_metrics(epoch: int, epochs: int, results: dict[str, float]) -> None:
    """One validation line on rank 0."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    m50, m = results.get("metrics/mAP50(B)", 0.0), results.get("metrics/mAP50-95(B)", 0.0)
    extra = " ".join(f"{k.split('/')[-1]} {v:.4f}" for k, v in results.items() if k.startswith("val/"))
    say(f"val epoch {epoch + 1}/{epochs} mAP50 {m50:.4f} mAP50-95 {m:.4f} {extra}")


def end_epoch(epoch: int, fitness: float | None, loss_means: dict[str, float], model: nn.Module, ema: Any,
              optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None, inp: Inputs, state: State,
              train_start: float) -> None:
    """results.csv row and checkpoints (rank 0), then a barrier so no rank runs ahead of the files."""
    cfg, topo = inp.cfg, inp.topo
    rng = gather_rng(topo)
    if topo.is_main:
        improved = fitness is not None and fitness > state.best_fitness
        if improved:
            state.best_fitness = fitness
        lrs = {f"lr/pg{j}": g["lr"] for j, g in enumerate(optimizer.param_groups)}
        row = {**{f"train/{k}": v for k, v in loss_means.items()}, **state.metrics, **lrs}
        append_results(cfg.out_dir / "results.csv", epoch, time.time() - train_start, row)
        ckpt = checkpoint.build(epoch=epoch, best_fitness=state.best_fitness, model=model, ema=ema,
                                optimizer=optimizer, scaler=scaler, train_args=vars(inp.hyp), metrics=row,
                                config=asdict(cfg), rng=rng)
        weights = cfg.out_dir / "weights"
        checkpoint.save_atomic(ckpt, weights / "last.pt")
        if improved:
            checkpoint.save_atomic(ckpt, weights / "best.pt")
        if cfg.save_period and (epoch + 1) % cfg.save_period == 0:
            checkpoint.save_atomic(ckpt, weights / f"epoch{epoch + 1}.pt")
    tdist.barrier()


def gather_rng(topo: Topology) -> list[dict[str, Any]]:
    """Every rank's RNG state, in rank order, on rank 0 (others get an empty list)."""
    mine = checkpoint.rng_state()
    if not topo.distributed:
        return [mine]
    out: list[Any] = [None] * topo.world_size if topo.is_main else []
    dist.gather_object(mine, out if topo.is_main else None, dst=0)
    return out


def restore(ckpt: dict[str, Any], model: nn.Module, ema: Any, optimizer: torch.optim.Optimizer,
            scaler: torch.amp.GradScaler | None, topo: Topology) -> State:
    """Load model, EMA, optimizer, scaler and RNG state; return where to continue."""
    saved = ckpt["trainer"]
    model.load_state_dict(saved["model"])
    ema.ema.load_state_dict(saved["ema"])
    ema.updates = ckpt["updates"]
    optimizer.load_state_dict(saved["optimizer"])
    if scaler is not None and saved.get("scaler"):
        scaler.load_state_dict(saved["scaler"])
    if saved["world_size"] == topo.world_size:
        checkpoint.set_rng_state(saved["rng"][topo.rank])
    else:
        say(f"warning: resuming on {topo.world_size} ranks, saved on {saved['world_size']}: RNG streams reseeded")
        seed_everything(saved["config"]["seed"] + 1 + topo.rank + ckpt["epoch"])
    state = State(epoch=ckpt["epoch"] + 1, best_fitness=ckpt["best_fitness"],
                  metrics={k: v for k, v in ckpt["train_metrics"].items() if not k.startswith(("train/", "lr/"))})
    if topo.is_main:
        say(f"resuming at epoch {state.epoch + 1} (checkpoint finished epoch {ckpt['epoch'] + 1}, "
            f"{ema.updates} optimizer steps, best fitness {state.best_fitness:.4f})")
    return state


def append_results(path: Path, epoch: int, elapsed: float, row: dict[str, float]) -> None:
    """Append one row to results.csv with ultralytics' column names (header on first write)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.writer(f)
        if new:
            w.writerow(["epoch", "time", *row])
        w.writerow([epoch + 1, f"{elapsed:.6g}", *(f"{float(v):.6g}" for v in row.values())])


def write_args(cfg: TrainConfig, hyp: SimpleNamespace) -> None:
    """``args.yaml``: ultralytics' settings as used, plus this trainer's own flags under ``trainer``."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**{k: v for k, v in vars(hyp).items()}, "trainer": {**asdict(cfg), "cfg": list(cfg.cfg)}}
    (cfg.out_dir / "args.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def param_checksum(model: nn.Module) -> str:
    """SHA-256 over every parameter's bytes, in order: equal on all ranks iff the weights are."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def write_debug(directory: Path, topo: Topology, model: nn.Module, state: State) -> None:
    """Debug record of this rank: samples seen per epoch, parameter checksum and a parameter sum."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {"rank": topo.rank, "world_size": topo.world_size, "seen": state.seen,
              "checksum": param_checksum(model),
              "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
              "best_fitness": state.best_fitness}
    (directory / f"rank{topo.rank}.json").write_text(json.dumps(record))
