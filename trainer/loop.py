"""The training loop: build everything from a ``TrainConfig``, then epochs of DDP steps.

Reads like nanoGPT's train.py: the DDP idiom is a handful of lines (``no_sync`` on all but the
last micro-step, rank 0 logs and saves, every rank validates its shard). What ultralytics already
does well (model, loss, datasets and augmentation, validator, EMA, optimizer parameter groups,
early stopping) is called, not copied; its trainer's recipe (loss scale, accumulation, warmup,
schedule, weight-decay scaling, ``optimizer=auto``) is followed step for step, so the same
settings learn the same way at any number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import checkpoint, models, output, preempt, schedule
from trainer import data as tdata
from trainer import dist as tdist
from trainer import pace as tpace
from trainer import plots as tplots
from trainer.config import TrainConfig, accumulation, for_node, precision_problems
from trainer.dist import Topology
from trainer.errors import TrainerError, refusal
from trainer.interface import BEST, LAST, small_batch_warning
from trainer.logs import (
    STEP_COUNTS,
    StepMeter,
    done_line,
    epoch_line,
    final_line,
    say,
    step_line,
    throughput_table,
    val_line,
)
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
    arch: models.Arch
    """The architecture, task and family to train."""
    amp: str
    """Resolved precision: off, fp16 or bf16."""
    hyp: SimpleNamespace
    """ultralytics settings (loss gains, augmentation, validator) as its own namespace."""
    weights_model: models.YoloModel | None = None
    """The ``--weights`` model, if any."""
    text_pe: torch.Tensor | None = None
    """YOLOE raw text embeddings (1, nc, D), if any."""
    node_notes: tuple[str, ...] = ()
    """What this node's CPUs and device changed of the command line (``config.for_node``): rank 0
    says it among its start-up lines, every other node's first rank on its own."""
    capability: tuple[int, int] | None = None
    """The GPU's compute capability (None on a CPU): what bfloat16 needs (``capability_problems``)."""


def prepare(
    cfg: TrainConfig,
    topo: Topology,
    device: torch.device,
    found: list[str] | None = None,
    capability: tuple[int, int] | None = None,
) -> Inputs:
    """Read and check data YAML, weights and text embeddings; resolve architecture and precision.

    ``found``: problems already found in the arguments, the topology and the device
    (``dist.device_problems``), refused together with these; ``capability``: the GPU's
    compute capability, read from ``device`` when not given.

    Raises:
        TrainerError: every input a run cannot use, with the fix, and every problem of ``found``:
            one refusal (a problem that hides others, such as a data YAML that does not load, leaves
            out only the checks that need it).
    """
    problems: list[str] = list(found or [])
    if capability is None and device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
    data = _checked(problems, tdata.load_data_yaml, cfg.data)
    weights_model = None
    if cfg.weights:
        loaded = _checked(problems, models.load_weights, cfg.weights)
        weights_model = loaded[0] if loaded is not None else None
    arch = None
    if weights_model is not None or not cfg.weights:
        arch = _checked(problems, models.resolve_architecture, cfg.model, weights_model, cfg.weights)
    if arch is not None:
        if cfg.task and cfg.task != arch.task:
            problems.append(f"task={cfg.task} but {arch.source} is a {arch.task} model ({arch.name})")
        cfg = replace(cfg, task=arch.task)  # the run directory lies under runs/<task> (output.project_dir)
        if data is not None:
            _checked(problems, tdata.check_labels_fit, data, arch.task, cfg.data, arch.source)
        if arch.yoloe and weights_model is not None:
            cfg = yoloe_recipe(cfg, models.scale_of(arch.yaml))
        elif arch.yoloe:
            cfg = replace(
                cfg,
                notes=(
                    *cfg.notes,
                    f"warning: {arch.name} without --weights trains YOLOE from random weights: "
                    "its text projection was never trained, so the class prompts are random directions "
                    "(for tests; fine-tune a pretrained YOLOE checkpoint with --weights)",
                ),
            )
        if cfg.text_embeddings and not arch.yoloe:
            problems.append(f"--text-embeddings is for YOLOE models; {arch.source} is {arch.name}")
        if not arch.yoloe and cfg.prompt_mode is not None:
            problems.append(f"--prompt-mode is for YOLOE models; {arch.source} is {arch.name}")
        if arch.yoloe:
            _checked(problems, yoloe_prompts_given, cfg, arch, weights_model)
    text_pe = None
    if cfg.text_embeddings and data is not None and arch is not None and arch.yoloe:
        names = list(data["names"].values())
        text_pe = _checked(problems, models.load_text_embeddings, cfg.text_embeddings, names, models.text_model(arch))
    problems += precision_problems(cfg, device.type, topo.distributed)
    problems += capability_problems(cfg, device, capability)
    amp = _checked(problems, resolve_amp, cfg.amp, device, capability)
    problems = list(dict.fromkeys(problems))  # the arguments' precision problems are found here too
    if problems:
        raise refusal(problems)
    assert data is not None and arch is not None and amp is not None  # each one's failure is a problem above
    adjusted = for_node(cfg, device.type, os.cpu_count() or 1, topo.local_world_size)  # said, and recorded as used
    node_notes, cfg = adjusted.notes[len(cfg.notes) :], adjusted
    hyp = ultralytics_hyp(cfg, arch, amp)
    return Inputs(cfg, topo, device, data, arch, amp, hyp, weights_model, text_pe, node_notes, capability)


def _checked(problems: list[str], check: Any, *args: Any) -> Any:
    """``check(*args)``, or None with its refusal added to ``problems``."""
    try:
        return check(*args)
    except TrainerError as e:
        problems.append(str(e))
        return None


def admit(cfg: TrainConfig, topo: Topology, found: list[str], select: bool = True) -> Inputs:
    """What a start (and ``--check``, with ``select`` off) admits before the process group exists:
    the arguments' problems ``found`` by ``parse_config``, the topology, this rank's device, and the
    inputs (``prepare``), all refused at once.

    Raises:
        TrainerError: every problem in one refusal; ``.stage`` is where the first was found:
            ``arguments``, ``topology``, ``device`` or ``inputs``.
    """
    cfg, device, problems, stage = tdist.device_problems(cfg, topo, select=select, found=found)
    try:
        inputs = prepare(cfg, topo, device, found=problems)
    except TrainerError as e:
        e.stage = stage if problems else "inputs"  # type: ignore[attr-defined]
        raise
    return inputs


def capability_problems(cfg: TrainConfig, device: torch.device, capability: tuple[int, int] | None) -> list[str]:
    """What needs native bfloat16 (compute capability 8.0, Ampere) on a GPU that lacks it: bf16
    gradient all-reduces and MuSGD, whose Newton-Schulz iterations run in bfloat16 (``--amp bf16`` is
    ``resolve_amp``'s)."""
    if device.type != "cuda" or capability is None or capability[0] >= 8:
        return []
    cc = f"{device} has compute capability {capability[0]}.{capability[1]}, without native bfloat16 (8.0 and later)"
    problems = []
    if cfg.ddp_grad_dtype == "bf16":
        problems.append(f"--ddp-grad-dtype bf16: {cc}; use --ddp-grad-dtype fp16 (the same bytes) or fp32")
    if cfg.optimizer.lower() == "musgd":
        problems.append(
            f"--optimizer MuSGD: its Newton-Schulz iterations run in bfloat16 and {cc}: torch would emulate "
            "them; use --optimizer SGD (what --optimizer auto picks there for long runs) or AdamW"
        )
    return problems


def resolve_amp(requested: str, device: torch.device, capability: tuple[int, int] | None = None) -> str:
    """off, fp16 or bf16 from ``--amp``: auto is fp16 on CUDA and off elsewhere; on and fp16 need
    CUDA; bf16 on a GPU needs native bfloat16 (compute capability 8.0, Ampere). ``capability``: the
    GPU's, read from the device when not given.

    Raises:
        TrainerError: fp16 asked for on a CPU; bf16 on a GPU before Ampere (V100, T4), where torch
            emulates it, several times slower than fp16.
    """
    if requested == "auto":
        return "fp16" if device.type == "cuda" else "off"
    if requested in ("on", "fp16"):
        if device.type != "cuda":
            raise TrainerError(precision_problems(replace(TrainConfig(), amp=requested), device.type, False)[0])
        return "fp16"
    if requested == "bf16" and device.type == "cuda":
        major, minor = capability if capability is not None else torch.cuda.get_device_capability(device)
        if major < 8:
            raise TrainerError(
                f"--amp bf16: {device} has compute capability {major}.{minor}, without native bfloat16 "
                "(8.0 and later: A100, H100): torch would emulate it, several times slower than fp16; "
                "use --amp fp16 (GradScaler, the default on CUDA) or --amp off"
            )
    return requested


def ultralytics_hyp(cfg: TrainConfig, arch: models.Arch, amp: str) -> SimpleNamespace:
    """ultralytics' settings namespace: our flags in its names, plus the honoured ``key=value`` ones.

    Raises:
        TrainerError: a value of the wrong type or range (ultralytics' own check).
    """
    from ultralytics.cfg import get_cfg
    from ultralytics.utils import DEFAULT_CFG_DICT

    overrides: dict[str, Any] = {
        "model": cfg.weights or arch.name,
        "data": cfg.data,
        "task": arch.task,
        "epochs": cfg.epochs,
        "batch": cfg.batch,
        "imgsz": cfg.imgsz,
        "lr0": 0.01 if cfg.lr is None else cfg.lr,
        "lrf": cfg.lrf,
        "momentum": 0.937 if cfg.momentum is None else cfg.momentum,
        "weight_decay": cfg.weight_decay,
        "warmup_epochs": cfg.warmup_epochs,
        "workers": cfg.workers,
        "seed": cfg.seed,
        "nbs": cfg.nbs,
        "amp": {"off": False, "fp16": True}.get(amp, amp),
        "save_period": cfg.save_period or -1,
        "optimizer": cfg.optimizer,
        "cos_lr": cfg.cos_lr,
        "close_mosaic": cfg.close_mosaic,
        "patience": cfg.patience,
        "cache": cfg.cache or False,
        "fraction": cfg.fraction,
        "freeze": list(cfg.freeze) if isinstance(cfg.freeze, tuple) else cfg.freeze,
        "multi_scale": cfg.multi_scale,
        "deterministic": cfg.deterministic,
        "channels_last": cfg.channels_last,
        "cls_remap": cfg.cls_remap,
        "plots": cfg.plots,
        "val": cfg.val_period > 0,
        "device": output.ultralytics_device(cfg),
        "exist_ok": cfg.exist_ok,
        "project": cfg.project or None,
        "name": cfg.name,
        "verbose": False,
        "resume": cfg.resume is not None,
        **cfg.hyp,
    }
    try:
        return get_cfg(DEFAULT_CFG_DICT, overrides)
    except (TypeError, ValueError, SyntaxError) as e:
        raise TrainerError(f"settings: {str(e).splitlines()[0]}") from None


@dataclass
class State:
    """What changes while training and goes into checkpoints."""

    epoch: int = 0
    """Next epoch to run (0-based)."""
    best_fitness: float = -1.0
    """Best validation fitness (mAP50-95) so far."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Last validation metrics, repeated in results.csv rows of epochs without validation."""
    buffers: dict[int, list[int]] = field(default_factory=dict)
    """This rank's mosaic buffers: loader worker id (-1: this process) -> buffered image indices."""
    seen: dict[int, list[str]] = field(default_factory=dict)
    """Debug: image files this rank trained on, per epoch."""
    half: checkpoint.HalfCopy = field(default_factory=checkpoint.HalfCopy)
    """Rank 0: the checkpoints' fp16 EMA, made once and refreshed each epoch."""
    attempt: int = 0
    """The attempt at the current epoch: 0, then 1, 2... when NaN recovery trains it again (``recover``),
    each at half the rate of the attempt before, in another image order."""
    left_out: set[str] = field(default_factory=set)
    """Training images left out for the rest of the run: those of the batches whose loss was the
    first non-finite one of an epoch that NaN recovery trained again (checkpointed)."""
    troubled: tuple[torch.Tensor, list[list[str]]] | None = None
    """This rank's last epoch: a flag per micro-step whose loss was not finite (on the device, read
    only by ``recover``) and each micro-step's image files."""
    skip: int = 0
    """Batches of ``epoch`` a preempted run trained before its checkpoint: loaded again, not trained."""
    skip_rng: dict[str, Any] | None = None
    """This rank's generators where the preempted run stopped: set once those batches are loaded again."""


@dataclass
class Parts:
    """The objects one run trains with."""

    model: models.YoloModel
    ddp: models.YoloModel
    ema: Any
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    stopper: Any
    nominal_accumulate: int
    lf: Any
    hyp: SimpleNamespace
    unused: list[str]
    """Trainable parameters the probe step left without a gradient (DDP then finds unused ones)."""
    stride: int
    """The model's largest stride (at least 32), read from the device once."""
    comm: tdist.GradComm | None = None
    """DDP's gradient all-reduce hook (``--ddp-grad-dtype`` fp16/bf16, or counting with --debug-dir)."""


@dataclass(frozen=True)
class Health:
    """An epoch's troubled steps over all ranks, and whether training can go on from it."""

    nonfinite: int = 0
    """Micro-steps whose loss was inf or NaN (every rank's)."""
    skipped: int = 0
    """Optimizer steps the fp16 GradScaler skipped (their gradients overflowed)."""
    steps: int = 0
    """Optimizer steps of the epoch."""
    finite: bool = True
    """Whether every rank's model and EMA (parameters and buffers: BatchNorm's running statistics
    included) are finite after the epoch (``state_finite``)."""
    scale: float | None = None
    """The fp16 GradScaler's scale after the epoch (None without it)."""
    recoveries: int = 0
    """NaN recoveries the epoch took before this attempt at it (``recover``)."""

    @property
    def broken(self) -> bool:
        """Divergence: the weights (or the EMA, or BatchNorm's statistics) are no longer finite, or
        the fp16 GradScaler's scale collapsed below ``DIVERGED_SCALE`` in an epoch in which no
        optimizer step changed anything. Skipped steps while the scale still falls from its initial
        2^16 are fp16's warm-up (about 11 + log2(ranks) for YOLO from scratch), and a non-finite
        loss among them is one bad batch the GradScaler already skipped (a degenerate label): an
        epoch made only of such steps goes on, as ultralytics does."""
        if not self.finite:
            return True
        if self.steps == 0 or self.skipped < self.steps:
            return False
        return self.scale is not None and self.scale < DIVERGED_SCALE

    def why(self) -> str:
        """What went wrong, for the recovery line and the error."""
        if not self.finite:
            return f"the weights are no longer finite after {self.nonfinite} non-finite loss(es)"
        scale = f", GradScaler scale {self.scale:g}" if self.scale is not None else ""
        return (
            f"all {self.steps} optimizer steps were skipped (fp16 gradients overflowed{scale}; "
            f"{self.nonfinite} non-finite loss(es))"
        )

    def counts(self) -> dict[str, float]:
        """results.csv's ``steps/*`` columns (``logs.STEP_COUNTS``)."""
        return dict(zip(STEP_COUNTS, (float(self.nonfinite), float(self.skipped), float(self.recoveries))))


DIVERGED_SCALE = 2.0**-10
"""A GradScaler scale below which a whole epoch of skipped steps is divergence, not warm-up. fp16
overflows above 65504: warm-up settles near 2^16 / (max |grad| x ranks), the loss being multiplied
by the world size (about 2^0 for YOLO from scratch, max |grad| 2e3, on 32 ranks); gradients that
still overflow 1000 times below that are no longer finite in any precision."""

MAX_RECOVERIES = 3
"""Recoveries from last.pt in a row before a diverging run stops (ultralytics' limit too)."""


def open_run(inp: Inputs) -> tuple[Path, dict[str, Any] | None]:
    """The run directory and the checkpoint to resume from, both decided by rank 0 and sent to every rank.

    The checkpoint is read once, by rank 0, and broadcast: ``--out`` need not be storage every
    node shares. A problem rank 0 finds stops every rank with the same message.

    Raises:
        TrainerError: what ``output.resolve`` or ``checkpoint.load_for_resume`` raised on rank 0.
    """
    payload: tuple[str | None, dict[str, Any] | None, str | None] = (None, None, None)
    if inp.topo.is_main:
        try:
            out, resume = decide_run(inp.cfg)
            out.mkdir(parents=True, exist_ok=True)
            output.mark_run(out)
            payload = (str(out), resume, None)
        except TrainerError as e:
            payload = (None, None, str(e))
    payload = tdist.broadcast_object(payload)
    if payload[2] is not None:
        raise TrainerError(payload[2])
    return Path(str(payload[0])), payload[1]


def decide_run(cfg: TrainConfig) -> tuple[Path, dict[str, Any] | None]:
    """Rank 0's decision before the run starts (``open_run``; ``--check`` makes it too, writing
    nothing): the run directory (``output.resolve``) and, with ``--resume``, the checkpoint's
    resume state, read and checked.

    Raises:
        TrainerError: the directory already holds a run without ``--resume``, nothing to resume,
            or a checkpoint that cannot be resumed.
    """
    out, path = output.resolve(cfg)
    return out, checkpoint.load_for_resume(path) if path is not None else None


def fit(inp: Inputs) -> None:
    """Train for ``cfg.epochs`` epochs (continuing a resumed run), validate, checkpoint, log; then
    validate the final best.pt and strip last.pt and best.pt."""
    cfg, topo = inp.cfg, inp.topo
    out, resume = open_run(inp)
    local_batch = cfg.batch // topo.world_size
    parts, train_set, val_set = build_parts(inp, local_batch)
    cfg = inp.cfg  # with what building them decided (optimizer auto's note)
    validator = None
    if val_set is not None:
        vloader = tdata.val_loader(val_set, local_batch * 2, cfg.workers, topo, inp.device)
        validator = make_validator(inp.arch.task, vloader, out, inp.hyp, writes=topo.is_main)
    state = State()
    if resume is not None:
        state = restore(resume, parts, topo, epochs=cfg.epochs)
    else:
        # Augmentation streams differ per rank (like ultralytics' seed + 1 + RANK); sampler order does not.
        seed_everything(cfg.seed + 1 + topo.rank)

    closes_at = cfg.epochs - cfg.close_mosaic if cfg.close_mosaic else cfg.epochs + 1
    mosaic_closed = state.epoch > closes_at  # closed before the checkpoint: the first loader is built closed
    if mosaic_closed:
        close_mosaic(train_set, parts.hyp)
        mosaic_note(inp, max(closes_at, 0))
    loader = make_loader(train_set, local_batch, inp, restore=state.buffers if resume is not None else None)
    if loader.num_workers != cfg.workers:  # no more workers than batches (data.worker_count): said, recorded as used
        note = f"--workers {cfg.workers} -> {loader.num_workers}: {len(loader)} batch(es) per epoch on each rank" + (
            ", loaded in the process" if loader.num_workers == 0 else ""
        )
        cfg = inp.cfg = replace(cfg, workers=loader.num_workers, notes=(*cfg.notes, note))
        parts.hyp.workers = loader.num_workers
    if cfg.accumulate is None:  # ultralytics: never accumulate over more batches than the run has
        parts.nominal_accumulate = min(parts.nominal_accumulate, len(loader) * cfg.epochs)
    scalars = None
    if topo.is_main:
        output.write_args(out, cfg, parts.hyp)
        scalars = output.Scalars(out)
        for line in startup_lines(inp, parts, state.epoch):
            say(line)
    elif topo.local_rank == 0:  # another node's own adjustments, said once there
        for line in inp.node_notes:
            say(line)

    train_start = time.time()
    for epoch in range(state.epoch, cfg.epochs):
        if not mosaic_closed and epoch >= closes_at:
            mosaic_closed = True
            close_mosaic(train_set, parts.hyp)
            mosaic_note(inp, epoch)
            loader = make_loader(train_set, local_batch, inp, restore=None)  # fresh workers see it
            state.buffers.clear()
        state.attempt = 0
        while True:
            try:
                loss_means, throughput, health = train_epoch(epoch, loader, parts, inp, state)
            except preempt.Preempted as halt:  # every rank, at one optimizer step: checkpoint, then exit
                preempt.save(halt, parts, inp, state, out)
                raise
            if not health.broken:
                break
            recover(epoch, health, state.attempt + 1, parts, inp, state, out)  # the same loader: its workers go on
        health = replace(health, recoveries=state.attempt)
        state.epoch = epoch + 1
        if isinstance(loader.dataset, tdata.EpochSeeded):
            loader.dataset.restore = None  # a worker started after this epoch starts like one never resumed
        if topo.is_main:
            say(throughput_table(epoch + 1, throughput, cfg.ref_ips))
            say(epoch_line(epoch + 1, cfg.epochs, loss_means, learning_rates(parts.optimizer), health.counts()))
        fitness = validate_epoch(validator, epoch, loss_means, parts, inp, state)
        stop = parts.stopper(epoch + 1, fitness)
        end_epoch(
            epoch, fitness, {**loss_means, **health.counts()}, throughput, parts, inp, state, out, scalars, train_start
        )
        if cfg.debug_exit_after and epoch + 1 == cfg.debug_exit_after:
            tdist.barrier()
            say(f"debug: exiting abruptly after epoch {epoch + 1} (--debug-exit-after)")
            os._exit(3)
        if not stop and epoch + 1 < cfg.epochs and preempt.agreed(inp.device):  # last.pt is this epoch's
            raise preempt.Preempted(epoch, len(loader), len(loader))
        if stop:
            if topo.is_main:
                say(
                    f"early stop after epoch {epoch + 1}: no better mAP50-95 for {cfg.patience} epochs (best at "
                    f"epoch {parts.stopper.best_epoch}; --patience)"
                )
            break
    if cfg.debug_dir:
        write_debug(Path(cfg.debug_dir), topo, parts.model, state, parts.comm)
    tdist.barrier()
    loss_names = tuple(k[4:] for k in state.metrics if k.startswith("val/"))
    finish(validator, parts.ema, inp, out, scalars, loss_names, state.epoch, time.time() - train_start)


def close_mosaic(train_set: Any, hyp: SimpleNamespace) -> None:
    """Turn mosaic (and mixup, copy-paste) off in ``train_set``, on a copy of the settings as
    ultralytics' trainer does: ``hyp`` stays the run's, which every checkpoint's train_args record."""
    from copy import copy

    train_set.close_mosaic(copy(hyp))


def mosaic_note(inp: Inputs, epoch: int) -> None:
    """Rank 0 says that mosaic is off from ``epoch`` (0-based) on, as ultralytics' trainer does."""
    if inp.topo.is_main:
        say(
            f"closing mosaic: epochs {epoch + 1}..{inp.cfg.epochs} train without it (--close-mosaic "
            f"{inp.cfg.close_mosaic})"
        )


def build_parts(inp: Inputs, local_batch: int) -> tuple[Parts, Any, Any]:
    """Model, EMA, datasets, optimizer, scaler, DDP wrapper and early stopping, in the order that
    matters: the EMA copies the model before SyncBatchNorm replaces its BatchNorm (checkpoints hold
    plain BatchNorm), and a probe step decides ``find_unused_parameters`` before DDP wraps it."""
    from ultralytics.utils.torch_utils import EarlyStopping, init_seeds

    cfg, topo, device = inp.cfg, inp.topo, inp.device
    init_seeds(cfg.seed, deterministic=cfg.deterministic)  # identical initial weights on every rank
    # cuDNN picks the fastest convolution algorithm per input shape, by timing them (not deterministic)
    torch.backends.cudnn.benchmark = not cfg.deterministic
    model = models.to_device(build_network(inp), device)
    if device.type == "cuda" and cfg.channels_last is not False:
        model = model.to(memory_format=torch.channels_last)
    stride = max(int(model.stride.max()), 32)
    cached = f", caching images in {cfg.cache}" if cfg.cache else ""
    with tdata.Heartbeat(f"building the datasets{cached}", topo, cfg.progress_every_s):
        with tdata.one_writer_first(topo):  # only the labels.cache writes take turns
            if topo.local_rank == 0:  # after this node's first rank the cache is there: the others only read it
                tdata.write_label_caches(inp.hyp, inp.data, ("train", "val"), stride)
        train_set, val_set = tdata.build_splits(inp.hyp, inp.data, local_batch, stride, topo, cfg.val_period > 0)
        probe_set = val_set or tdata.build_dataset(tdata.without_cache(inp.hyp), inp.data, "val", 2, stride)
        tdist.startup_barrier()  # every rank built (and cached) before the first collective of the job's group
    unused = unused_parameters(model, probe_set, device)
    find_unused = tdist.any_rank(bool(unused))
    model, ema = ema_then_sync_bn(model, cfg.sync_bn and topo.distributed)
    nominal = accumulation(cfg)
    optimizer = build_optimizer(model, inp, nominal, len(train_set))
    ddp, comm = (
        wrap_ddp(model, device, find_unused, cfg.ddp_grad_dtype, cfg.bucket_mb, count=cfg.debug_dir is not None)
        if topo.distributed
        else (model, None)
    )
    parts = Parts(
        model=model,
        ddp=ddp,
        comm=comm,
        ema=ema,
        optimizer=optimizer,
        scaler=torch.amp.GradScaler("cuda") if inp.amp == "fp16" else None,
        stopper=EarlyStopping(patience=cfg.patience),
        nominal_accumulate=nominal,
        lf=schedule.lr_factor(cfg.epochs, cfg.lrf, cfg.cos_lr),
        hyp=inp.hyp,
        unused=unused,
        stride=stride,
    )
    return parts, train_set, val_set


def ema_then_sync_bn(model: models.YoloModel, sync_bn: bool) -> tuple[models.YoloModel, Any]:
    """The EMA, copied from the model while it still has plain BatchNorm (so every checkpoint does:
    ``YOLO(last.pt)`` then runs anywhere, without a process group), then the model converted to
    SyncBatchNorm when asked for."""
    from ultralytics.utils.torch_utils import ModelEMA

    ema = ModelEMA(model)
    if sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model, ema


def validate_epoch(
    validator: Any, epoch: int, loss_means: dict[str, float], parts: Parts, inp: Inputs, state: State
) -> float | None:
    """Validate after ``epoch`` when it is due (every ``--val-period``, the last epoch, or when early
    stopping may trigger); return the fitness (mAP50-95), or None without validation."""
    cfg = inp.cfg
    if validator is not None and not state.metrics:  # fixed results.csv columns from the first row on
        state.metrics = {**dict.fromkeys(validator.metrics.keys, 0.0), **{f"val/{k}": 0.0 for k in loss_means}}
    parts.ema.update_attr(parts.model, include=["yaml", "nc", "args", "names", "stride", "class_weights"])
    due = (epoch + 1) % max(cfg.val_period, 1) == 0 or epoch + 1 == cfg.epochs or parts.stopper.possible_stop
    if validator is None or not due:
        return None
    results = validate(validator, parts.ema, inp, tuple(loss_means), epoch)
    fitness = float(results.pop("fitness", results.get("metrics/mAP50-95(B)", 0.0)))
    state.metrics = results
    if inp.topo.is_main:
        say(val_line(epoch + 1, cfg.epochs, results))
    return fitness


def finish(
    validator: Any,
    ema: Any,
    inp: Inputs,
    out: Path,
    scalars: output.Scalars | None,
    loss_names: tuple[str, ...],
    epochs: int,
    seconds: float,
) -> None:
    """Validate best.pt as it will be shipped (fp16 weights) on every rank, with ultralytics' plots
    when ``plots`` is on, and print the per-class table (rank 0); then strip last.pt and best.pt into
    ultralytics' final form and draw results.png (rank 0)."""
    topo = inp.topo
    if validator is not None:
        best = None
        if topo.is_main and (out / BEST).exists():
            ckpt = torch.load(out / BEST, map_location="cpu", weights_only=False)
            best = (
                {k: v.float() if v.is_floating_point() else v for k, v in ckpt["ema"].state_dict().items()},
                ckpt["epoch"] + 1,
            )
        best = tdist.broadcast_object(best)
        if best is not None:
            ema.ema.load_state_dict(best[0])
            results = run_validation(
                validator,
                ema,
                inp.device,
                inp.data,
                inp.amp != "off",
                loss_names,
                best[1] - 1,
                inp.cfg.epochs,
                topo.world_size,
                plots=inp.cfg.plots,
            )
            results = tdist.broadcast_object(results)
            results.pop("fitness", None)
            if topo.is_main:
                say(final_line("best.pt", best[1], results))
                for line in tplots.class_table(validator):  # rank 0's validator holds every shard's statistics
                    say(line)
                if scalars is not None:
                    scalars.add({k: v for k, v in results.items() if k.startswith("metrics/")}, inp.cfg.epochs + 1)
    if topo.is_main:
        checkpoint.finalize(out)
        if scalars is not None:
            scalars.close()
        if inp.cfg.plots:
            _png, why = tplots.results_png(out)  # after the final validation, as ultralytics' trainer draws it
            if why:
                say(f"warning: {why} (the run's figures are all in results.csv)")
        full = out.resolve()  # absolute, so `orch report` can fetch results.csv from this node
        say(done_line(epochs, seconds, str((full / LAST).parent), str(full / "results.csv")))
    tdist.barrier()


LR_SCALED_BY_HAND = 0.02
"""An ``--lr`` above this on several ranks is warned about as multiplied by the GPU count:
ultralytics' rates stay at or below 0.01 (SGD's lr0; AdamW's auto rate is lower)."""


def lr_scaling_warning(lr: float | None, world_size: int, optimizer: torch.optim.Optimizer) -> str | None:
    """The start-up warning for an ``--lr`` multiplied by the GPU count by hand (the linear-scaling
    rule of the field guides: 0.01 x 8 = 0.08 on 8 GPUs): above ``LR_SCALED_BY_HAND``, or exactly
    ultralytics' SGD rate 0.01 x the ranks. ultralytics trains every GPU count with one lr0; with
    SGD its summed loss already grows the step with the global batch. The warning gives the
    equivalent lr0, lr / ranks. None on one rank, or for a rate that looks like ultralytics' own."""
    if lr is None or world_size < 2:
        return None
    if not (lr > LR_SCALED_BY_HAND or math.isclose(lr, 0.01 * world_size)):
        return None
    why = (
        "ultralytics' summed loss already grows the step with the global batch"
        if isinstance(optimizer, torch.optim.SGD)
        else f"ultralytics uses one lr0 at any GPU count ({type(optimizer).__name__}'s step follows lr0, not the batch)"
    )
    return (
        f"warning: lr0 {lr:g} on {world_size} ranks looks multiplied by the GPU count (the linear-scaling rule): "
        f"{why}, so this trains with steps about {world_size}x ultralytics'; the equivalent of ultralytics' "
        f"recipe is lr0 {lr / world_size:g} (--lr {lr / world_size:g})"
    )


def startup_lines(inp: Inputs, parts: Parts, start: int) -> list[str]:
    """Rank 0's opening lines: what trains, where, how; every choice made for the user, said."""
    cfg, topo = inp.cfg, inp.topo
    group = parts.optimizer.param_groups[0]
    threads = torch.get_num_threads()
    where = f"cpu ({threads} thread{'s' if threads != 1 else ''})" if inp.device.type == "cpu" else inp.device.type
    lines = [
        f"training {inp.arch.name} ({inp.arch.task}{', YOLOE ' + prompt_mode_text(cfg) if inp.arch.yoloe else ''}"
        f"{', from ' + cfg.weights if cfg.weights else ''}) on {topo.world_size} rank(s), {where}, "
        f"global batch {cfg.batch} ({cfg.batch // topo.world_size} per rank) x accumulate {parts.nominal_accumulate}, "
        f"{type(parts.optimizer).__name__} lr0 {group['initial_lr']:.6g} ({'cosine' if cfg.cos_lr else 'linear'} to "
        f"x{cfg.lrf:g}), amp {inp.amp}, {epochs_left(start, cfg.epochs)}",
        *cfg.notes,
    ]
    small = small_batch_warning(
        cfg.batch,
        topo.world_size,
        cfg.sync_bn,
        cuda=inp.device.type == "cuda",
        per_device=cfg.batch_per_device is not None,
    )
    if small:
        lines.append(small)
    warning = lr_scaling_warning(cfg.lr, topo.world_size, parts.optimizer)
    if warning:
        lines.append(warning)
    elif cfg.lr is not None and topo.distributed and isinstance(parts.optimizer, torch.optim.SGD):
        lines.append(
            f"note: lr0 {cfg.lr:g} is ultralytics' rate: with SGD the step already grows with the global batch "
            f"x accumulate ({cfg.batch} x {parts.nominal_accumulate} images, the loss is summed), so a rate "
            f"multiplied by the GPU count by hand is scaled twice"
        )
    said = comm_line(parts.model, cfg, topo.world_size)
    if said:
        lines.append(said)
    if parts.unused and topo.distributed:
        lines.append(
            f"{len(parts.unused)} trainable parameter(s) got no gradient in a probe step (e.g. "
            f"{parts.unused[0]}): DDP runs with find_unused_parameters"
        )
    return lines


def wrap_ddp(
    model: nn.Module,
    device: torch.device,
    find_unused: bool,
    grad_dtype: str = "fp32",
    bucket_mb: float = 25.0,
    count: bool = False,
) -> tuple[DDP, tdist.GradComm | None]:
    """DDP as ultralytics configures it: rank-local BatchNorm buffers, and ``find_unused_parameters``
    only when a probe step left a trainable parameter without a gradient (it costs a graph traversal
    per step, and torch warns when it finds nothing); buckets of ``bucket_mb`` MB; gradients
    all-reduced in ``grad_dtype`` (``--ddp-grad-dtype``: fp16 and bf16 through ``dist.GradComm``,
    fp32 through DDP's own all-reduce, or through the hook too with ``count``, which counts the
    bytes). Returns the wrapper and the hook (None: DDP's own).

    Buffers are not synced on every forward (ultralytics' broadcast_buffers=False); the EMA's are
    broadcast before validation instead.
    """
    import inspect

    buffers = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DDP).parameters
        else {"broadcast_buffers": False}
    )  # the new name since torch 2.14; same behaviour
    options: dict[str, Any] = {
        "device_ids": [device.index] if device.type == "cuda" else None,
        "find_unused_parameters": find_unused,
        "bucket_cap_mb": bucket_mb,
        **buffers,
    }
    ddp = DDP(model, **options)
    comm = None
    if grad_dtype != "fp32" or count:
        comm = tdist.GradComm(tdist.GRAD_DTYPES[grad_dtype])
        comm.register(ddp)
    return ddp, comm


def grad_bytes(model: nn.Module, grad_dtype: str) -> int:
    """Bytes of the gradients DDP all-reduces per optimizer step in ``grad_dtype``: every trainable
    parameter's, each rank's (what ``dist.GradComm`` counts)."""
    size = torch.tensor([], dtype=tdist.GRAD_DTYPES[grad_dtype]).element_size()
    return sum(p.numel() for p in model.parameters() if p.requires_grad) * size


def comm_line(model: nn.Module, cfg: TrainConfig, world_size: int) -> str | None:
    """The start-up line of DDP's gradient all-reduce: its dtype, the bytes per optimizer step and
    the buckets; on one rank, what of them was given has no effect (None when nothing was)."""
    if world_size < 2:
        given = [f for f in ("ddp_grad_dtype", "bucket_mb") if f in cfg.given]
        if not given:
            return None
        flags = " and ".join("--" + f.replace("_", "-") for f in given)
        return f"note: {flags} without effect: one rank all-reduces no gradient"
    mb = grad_bytes(model, cfg.ddp_grad_dtype) / 1e6
    how = (
        f"in {cfg.ddp_grad_dtype} (compression hook; fp32 would be {grad_bytes(model, 'fp32') / 1e6:.1f} MB)"
        if cfg.ddp_grad_dtype != "fp32"
        else "in fp32 (--ddp-grad-dtype fp16 or bf16 halves it)"
    )
    return (
        f"DDP all-reduces {mb:.1f} MB of gradients per optimizer step per rank {how}, "
        f"in buckets of {cfg.bucket_mb:g} MB (--bucket-mb)"
    )


def unused_parameters(model: models.YoloModel, probe_set: Any, device: torch.device) -> list[str]:
    """Trainable parameters that get no gradient from one forward/backward on the first labelled
    validation image, twice (a batch of two for BatchNorm), run on a copy of the model (nothing of
    the real one, nor any RNG, moves). One image, loaded twice: validation's rect batches give
    images of different shapes, which no batch can stack."""
    first = next((i for i, label in enumerate(probe_set.labels) if len(label["cls"])), 0)
    batch = preprocess(probe_set.collate_fn([probe_set[first], probe_set[first]]), device)
    probe = _deepcopy(model)
    probe.train()
    loss, _ = probe(batch)
    loss.sum().backward()
    return [name for name, p in probe.named_parameters() if p.requires_grad and p.grad is None]


def _deepcopy(model: nn.Module) -> nn.Module:
    from copy import deepcopy

    return deepcopy(model)


def prompt_mode_text(cfg: TrainConfig) -> str:
    """The YOLOE prompt mode as the header line says it, with the YOLOE script it matches."""
    mode = cfg.prompt_mode or "full"
    return f"{mode} ({'train_pe_all' if mode == 'full' else 'train_pe'}{'' if cfg.prompt_mode else ', the default'})"


YOLOE_RECIPE: dict[str, Any] = {"optimizer": "AdamW", "lr": 1e-3, "weight_decay": 0.025, "momentum": 0.9}
"""The YOLOE prompt-tuning recipe (ultralytics' train_pe examples, THU-MIG's train_pe.py and
train_pe_all.py): the optimizer settings, taken together or not at all."""
YOLOE_RECIPE_HYP: dict[str, Any] = {"warmup_bias_lr": 0.0, "mixup": 0.15, "copy_paste": 0.3}
"""ultralytics settings of the recipe, each taken unless the user set it: THU-MIG's scripts train
with their coco_{scale}_train.yaml, whose mixup and copy_paste are these at every scale."""
YOLOE_RECIPE_SCALE: dict[str, float] = {"s": 0.6, "m": 0.9, "l": 0.9}
"""The augmentation ``scale`` of coco_{s,m,l}_train.yaml, by model scale (other scales keep ultralytics' 0.5)."""
YOLOE_CLOSE_MOSAIC = {"full": 10, "linear": 5}
"""close_mosaic by prompt mode: train_pe_all.py's 10, train_pe.py's 5 (linear probing runs 10 epochs)."""


def yoloe_recipe(cfg: TrainConfig, scale: str | None = None) -> TrainConfig:
    """``cfg`` with the YOLOE recipe where the user set nothing: the optimizer settings (AdamW, lr0
    1e-3, weight decay 0.025, momentum 0.9) unless any of optimizer, lr0, momentum or weight decay
    was given; each unless given: close_mosaic 10 (``--prompt-mode linear``: 5), warmup_bias_lr 0,
    mixup 0.15, copy_paste 0.3 and the augmentation scale of the model's ``scale`` (s 0.6, m and l
    0.9). Said on the start-up line; what the user gave always wins."""
    given = set(cfg.given)
    mode = cfg.prompt_mode or "full"
    changes: dict[str, Any] = {}
    if not given & set(YOLOE_RECIPE):
        changes.update(YOLOE_RECIPE)
    if "close_mosaic" not in given:
        changes["close_mosaic"] = YOLOE_CLOSE_MOSAIC[mode]
    recipe_hyp = {**YOLOE_RECIPE_HYP, **({"scale": YOLOE_RECIPE_SCALE[scale]} if scale in YOLOE_RECIPE_SCALE else {})}
    taken_hyp = {k: v for k, v in recipe_hyp.items() if k not in given}
    took = {**changes, **taken_hyp}
    if not took:
        return cfg
    names = {"lr": "lr0"}
    said = ", ".join(
        f"{names.get(k, k)} {v:g}" if isinstance(v, float) else f"{names.get(k, k)} {v}" for k, v in took.items()
    )
    kept = sorted(given & {*YOLOE_RECIPE, *recipe_hyp, "close_mosaic"})
    script = "train_pe.py" if mode == "linear" else "train_pe_all.py"
    source = f"{script}, coco_{scale}_train.yaml" if scale in YOLOE_RECIPE_SCALE else script
    note = (
        f"YOLOE recipe ({source}): {said}"
        + (f"; yours kept: {', '.join(kept)}" if kept else "")
        + " (set any of them to override)"
    )
    return replace(cfg, **changes, hyp={**cfg.hyp, **taken_hyp}, notes=(*cfg.notes, note))


def yoloe_prompts_given(cfg: TrainConfig, arch: models.Arch, weights_model: models.YoloModel | None) -> None:
    """A YOLOE run needs its class prompts from exactly one place: ``--text-embeddings``, or a
    checkpoint whose prompts are already fused into its weights (one this trainer wrote).

    Raises:
        TrainerError: no embeddings for a model without fused prompts (from scratch, or an unfused
            YOLOE checkpoint): every rank would fail building it; embeddings for a fused
            checkpoint, which has no text projection left to take them (they would be ignored).
    """
    fused = weights_model is not None and models.is_fused(weights_model)
    if fused and cfg.text_embeddings:
        raise TrainerError(
            f"--text-embeddings {cfg.text_embeddings}: {arch.source} is a YOLOE model whose class "
            "prompts are already fused into its weights (a checkpoint this trainer wrote): it has no "
            "text projection left to take new embeddings, so they would be ignored; drop "
            "--text-embeddings to fine-tune it on its own prompts, or start from the unfused YOLOE "
            "checkpoint (e.g. yoloe-11s-seg.pt) with --text-embeddings"
        )
    if not fused and not cfg.text_embeddings:
        raise TrainerError(
            f"YOLOE needs text-prompt embeddings ({arch.name}{' from ' + cfg.weights if cfg.weights else ''}"
            "): pass --text-embeddings FILE (make it once with: python -m trainer.embed --data DATA "
            "--out FILE)"
        )


def build_network(inp: Inputs) -> models.YoloModel:
    """The model with its classes, pretrained weights, (YOLOE) prompt head and frozen layers set up."""
    cfg = inp.cfg
    model = models.build_model(
        inp.arch, inp.data["names"], inp.hyp, inp.weights_model, inp.data["channels"], cfg.cls_remap
    )
    if inp.arch.yoloe:
        models.setup_yoloe_prompts(model, inp.data["names"], inp.text_pe, inp.weights_model, cfg.prompt_mode or "full")
    models.apply_freeze(model, cfg.freeze)
    return model


def build_optimizer(model: nn.Module, inp: Inputs, nominal: int, train_images: int) -> torch.optim.Optimizer:
    """ultralytics' optimizer: its three parameter groups, its ``auto`` rule, weight decay scaled
    by global batch x accumulate / nbs. ``auto`` records its choice in ``inp.hyp`` (as ultralytics
    does in its args), so args.yaml and checkpoints say what trained. Where ``auto`` would pick
    MuSGD on a GPU without native bfloat16 (``auto_optimizer``), SGD trains instead, said among the
    start-up lines (a note in ``inp.cfg``)."""
    from ultralytics.engine.trainer import BaseTrainer

    cfg, hyp = inp.cfg, inp.hyp
    decay = cfg.weight_decay * cfg.batch * nominal / cfg.nbs
    iterations = math.ceil(train_images / max(cfg.batch, cfg.nbs)) * cfg.epochs
    name, lr, momentum = cfg.optimizer, hyp.lr0, hyp.momentum
    chosen = auto_optimizer(cfg.optimizer, iterations, inp.device, inp.capability)
    if chosen is not None:
        (name, lr, momentum), note = chosen
        hyp.optimizer, hyp.lr0, hyp.momentum, hyp.warmup_bias_lr = name, lr, momentum, 0.0  # what auto records
        inp.cfg = replace(cfg, notes=(*cfg.notes, note))
    shim: Any = SimpleNamespace(args=hyp, data=inp.data)  # the two attributes build_optimizer reads
    optimizer = BaseTrainer.build_optimizer(
        shim, model, name=name, lr=lr, momentum=momentum, decay=decay, iterations=iterations
    )
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]
    return optimizer


AUTO_LONG_RUN = 10_000
"""ultralytics' ``optimizer=auto`` picks MuSGD beyond this many iterations (AdamW below)."""
SGD_FOR_MUSGD = ("SGD", 0.01, 0.9)
"""What ``auto`` picks instead of MuSGD where bfloat16 is not native: ultralytics' own long-run
choice before MuSGD (SGD, lr0 0.01, momentum 0.9)."""


def auto_optimizer(
    name: str, iterations: int, device: torch.device, capability: tuple[int, int] | None
) -> tuple[tuple[str, float, float], str] | None:
    """SGD instead of MuSGD where ``--optimizer auto`` would pick MuSGD (beyond ``AUTO_LONG_RUN``
    iterations) on a GPU without native bfloat16 (compute capability below 8.0: V100, T4), whose
    Newton-Schulz iterations run in bfloat16, emulated there (as ``--amp bf16`` is refused): the
    (name, lr0, momentum) to train with and the start-up note; None where ultralytics' own choice
    stands."""
    if name.lower() != "auto" or iterations <= AUTO_LONG_RUN:
        return None
    if device.type != "cuda" or capability is None or capability[0] >= 8:
        return None
    sgd, lr, momentum = SGD_FOR_MUSGD
    return SGD_FOR_MUSGD, (
        f"optimizer auto: {sgd} lr0 {lr:g} momentum {momentum:g} instead of MuSGD ({iterations} iterations): "
        f"MuSGD's Newton-Schulz iterations run in bfloat16, which {device} (compute capability "
        f"{capability[0]}.{capability[1]}) would emulate, as for --amp bf16"
    )


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (augmentation runs on all three)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def make_loader(train_set: Any, local_batch: int, inp: Inputs, restore: dict[int, list[int]] | None) -> Any:
    """The training loader; ``restore``: the mosaic buffers of a resumed run, put back in its first epoch."""
    cfg = inp.cfg
    workers_restore = None
    if restore:
        if -1 in restore:  # the buffer lived in this process (no workers)
            tdata.restore_buffer(train_set, restore[-1])
        elif cfg.persistent_workers:  # without persistent workers every epoch starts with empty buffers
            workers_restore = restore
    return tdata.train_loader(
        train_set,
        local_batch,
        cfg.workers,
        cfg.seed,
        inp.topo,
        inp.device,
        pin_memory=cfg.pin_memory,
        persistent=cfg.persistent_workers,
        restore=workers_restore,
    )


def preprocess(
    batch: dict[str, Any], device: torch.device, hyp: SimpleNamespace | None = None, stride: int = 32
) -> dict[str, Any]:
    """Move a collated batch to the device; images to float in [0, 1]; with ``multi_scale``, resize
    the batch to a random stride multiple within imgsz +/- that fraction (ultralytics' recipe)."""
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            batch[k] = v.to(device, non_blocking=device.type == "cuda")
    batch["img"] = batch["img"].float() / 255
    if hyp is not None and hyp.multi_scale > 0.0:
        imgs = batch["img"]
        size = (
            random.randrange(
                max(stride, int(hyp.imgsz * (1.0 - hyp.multi_scale))), int(hyp.imgsz * (1.0 + hyp.multi_scale) + stride)
            )
            // stride
            * stride
        )
        factor = size / max(imgs.shape[2:])
        if factor != 1:
            shape = [math.ceil(x * factor / stride) * stride for x in imgs.shape[2:]]
            batch["img"] = nn.functional.interpolate(imgs, size=shape, mode="bilinear", align_corners=False)
    return batch


def train_epoch(
    epoch: int, loader: Any, parts: Parts, inp: Inputs, state: State
) -> tuple[dict[str, float], list[list[float]], Health]:
    """One pass over this rank's shard.

    Returns the epoch's mean loss components over all ranks' images, every rank's
    ``[images, data-wait s, total s]``, and the epoch's ``Health`` (non-finite losses, skipped
    steps, finite weights) over all ranks. Nothing here waits for the device between micro-steps:
    the loss components are summed on the device and read once, at a progress line or the end.
    """
    cfg, device = inp.cfg, inp.device
    # a new order each epoch, the same on every rank; another attempt at it (NaN recovery) draws another
    # order and other augmentation, at half the rate of the attempt before, without the images left out
    loader.sampler.set_epoch(epoch, state.attempt, state.left_out)
    lr_scale = 0.5**state.attempt
    models.set_train_mode(parts.model)
    advance_criterion(parts.model, epoch)
    nb = len(loader)
    nw = schedule.warmup_iterations(cfg.warmup_epochs, cfg.epochs, nb)
    schedule.start_epoch(parts.optimizer, epoch, parts.lf, lr_scale)
    pace = tpace.Pace(device, tpace.collective_layers(parts.model))  # SyncBatchNorm's all-gathers timed apart
    try:
        return _epoch_steps(epoch, loader, parts, inp, state, pace, nb, nw, lr_scale)
    finally:
        pace.close()


def _epoch_steps(
    epoch: int,
    loader: Any,
    parts: Parts,
    inp: Inputs,
    state: State,
    pace: tpace.Pace,
    nb: int,
    nw: int,
    lr_scale: float,
) -> tuple[dict[str, float], list[list[float]], Health]:
    """``train_epoch``'s micro-steps, timed by ``pace``."""
    cfg, topo, device, hyp = inp.cfg, inp.topo, inp.device, parts.hyp
    autocast = torch.autocast(
        device.type, dtype=torch.bfloat16 if inp.amp == "bf16" else torch.float16, enabled=inp.amp != "off"
    )
    names: list[str] = []
    sums: torch.Tensor | None = None
    troubled = torch.zeros(2, dtype=torch.float64, device=device)  # non-finite losses, skipped steps (on the device)
    flags = torch.zeros(nb, dtype=torch.bool, device=device)  # which micro-steps' loss was not finite
    files: list[list[str]] = []
    state.troubled = (flags, files)
    images, steps, pending = 0, 0, 0
    epoch_meter, window, first = StepMeter(), StepMeter(), StepMeter()
    seen = state.seen.setdefault(epoch + 1, []) if cfg.debug_dir else None
    skip, state.skip, began = state.skip, 0, ({k: list(v) for k, v in state.buffers.items()}, checkpoint.rng_state())
    t_prev = time.perf_counter()
    for i, batch in enumerate(loader):
        t_batch = time.perf_counter()
        pace.data(t_batch - t_prev)
        worker, buffer = batch.pop(tdata.MOSAIC_KEY, (-1, None))
        if buffer is not None:
            state.buffers[worker] = buffer
        if i < skip:  # trained before a preemption: loaded again (augmentation, mosaic buffers), not trained
            if i + 1 == skip and state.skip_rng is not None:
                checkpoint.set_rng_state(state.skip_rng)  # where the preempted run's generators were
            t_prev = time.perf_counter()
            continue
        accumulate = schedule.micro_step(
            parts.optimizer,
            i + nb * epoch,
            nw,
            epoch,
            parts.lf,
            parts.nominal_accumulate,
            hyp.warmup_bias_lr,
            hyp.warmup_momentum,
            hyp.momentum,
            lr_scale,
        )
        pending += 1
        step_now = pending >= accumulate or i + 1 == nb  # an epoch ends on a step: no gradient outlives a checkpoint
        files.append(list(batch["im_file"]))
        if seen is not None:
            seen.extend(Path(f).name for f in batch["im_file"])
        batch = preprocess(batch, device, hyp, parts.stride)
        n_local = batch["img"].shape[0]
        # In DDP only the micro-step that ends an optimizer step all-reduces gradients.
        with nullcontext() if (step_now or not topo.distributed) else parts.ddp.no_sync():
            pace.forward_begins()
            with autocast:
                loss, items = parts.ddp(batch)
            pace.forward_ends(n_local)
            # ultralytics' scale: the criterion returns per-image means x local batch; x world size
            # makes DDP's average a sum over the global batch, the rate lr0 is tuned for.
            loss = loss.sum() * topo.world_size
            flags[i] = ~torch.isfinite(loss.detach())
            troubled[0] += flags[i].double()
            (parts.scaler.scale(loss) if parts.scaler else loss).backward()
        if step_now:
            skipped = optimizer_step(parts, cfg.clip)
            if skipped is not None:
                troubled[1] += skipped
            pending, steps = 0, steps + 1
        if sums is None:
            names = list(items)
            sums = torch.zeros(len(names), dtype=torch.float64, device=device)
        sums += torch.stack([items[k].detach() for k in names]).double() * n_local
        images += n_local
        t_end = time.perf_counter()
        # the first step of an epoch waits for workers to start: not throughput, unless it is the only one
        (epoch_meter if i > 0 else first).add(n_local, t_batch - t_prev, t_end - t_prev)
        window.add(n_local, t_batch - t_prev, t_end - t_prev)
        if step_now and (steps % cfg.log_every == 0 or i + 1 == nb):
            say(pace.line(epoch + 1, i + 1))  # every rank, its own pace: what names a straggler
        if step_now and topo.is_main and (steps % cfg.log_every == 0 or i + 1 == nb):
            values = torch.cat([sums / images, troubled]).tolist()  # the one device read between progress lines
            means, (nonfinite, skipped_steps) = values[:-2], values[-2:]
            say(
                step_line(
                    epoch + 1,
                    cfg.epochs,
                    i + 1,
                    nb,
                    dict(zip(names, means)),
                    parts.optimizer.param_groups[0]["lr"],
                    window.ips * topo.world_size,
                    window.wait_share,
                    int(nonfinite),
                    int(skipped_steps),
                )
            )
            window = StepMeter()
        if step_now and i + 1 < nb and steps % cfg.log_every == 0 and preempt.agreed(device):
            raise preempt.Preempted(epoch, i + 1, nb, *began)
        t_prev = time.perf_counter()
    assert sums is not None, "an epoch without batches"
    if epoch_meter.images == 0:  # an epoch of one batch: its one step is all there is to measure
        epoch_meter = first
    if loader.num_workers == 0:  # the mosaic buffer lives in this process
        state.buffers[-1] = list(loader.dataset.buffer)
    finite = state_finite(parts.model, parts.ema.ema)
    scale = parts.scaler.get_scale() if parts.scaler is not None else None  # the same on every rank
    return epoch_summary(
        epoch, names, sums, images, epoch_meter, inp, torch.cat([troubled, finite.reshape(1)]), steps, scale
    )


def state_finite(*modules: nn.Module) -> torch.Tensor:
    """1.0 when every floating-point tensor of the modules' state (parameters and buffers: an fp16
    overflow can leave BatchNorm's running statistics, and with them the EMA, non-finite while the
    weights are not) is finite, else 0.0: a device scalar, not read to the host. One sum per tensor,
    in float64 (a NaN or an infinity makes its sum non-finite; no finite fp32 tensor's sum overflows
    float64), then one check: a third of the time of a check per tensor on the CPU (8 against 27 ms
    a yolo12n model and EMA on one thread), one kernel per tensor instead of two on a GPU."""
    sums = [v.sum(dtype=torch.float64) for m in modules for v in m.state_dict().values() if v.is_floating_point()]
    return torch.isfinite(torch.stack(sums)).all().double()


def advance_criterion(model: models.YoloModel, epoch: int) -> None:
    """Bring the loss's per-epoch schedule to ``epoch``: ultralytics calls ``criterion.update()``
    after every epoch (end-to-end heads shift weight from one-to-many to one-to-one); counting the
    calls makes the schedule a function of the epoch, so a resumed run continues it exactly."""
    if getattr(model, "criterion", None) is None:
        model.criterion = model.init_criterion()
    criterion = model.criterion
    if not hasattr(criterion, "update"):
        return
    done = getattr(criterion, "trainer_epochs", 0)
    for _ in range(done, epoch):
        criterion.update()
    criterion.trainer_epochs = max(done, epoch)


def optimizer_step(parts: Parts, clip: float) -> torch.Tensor | None:
    """Unscale, clip, step, zero, EMA: the order AMP needs (unscale before measuring the norm).

    Returns, with the fp16 GradScaler, a device scalar that is 1 when it skipped the step (its
    gradients overflowed: the scale then shrinks, and only then), without reading it to the host."""
    skipped = None
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.optimizer)
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(parts.model.parameters(), max_norm=clip)
    if parts.scaler is not None:
        before = parts.scaler._scale.clone() if parts.scaler._scale is not None else None  # noqa: SLF001
        parts.scaler.step(parts.optimizer)
        parts.scaler.update()
        after = parts.scaler._scale  # noqa: SLF001
        if before is not None and after is not None:
            skipped = (after < before).double().reshape(())
    else:
        parts.optimizer.step()
    parts.optimizer.zero_grad(set_to_none=True)
    parts.ema.update(parts.model)
    return skipped


def epoch_summary(
    epoch: int,
    names: list[str],
    sums: torch.Tensor,
    images: int,
    meter: StepMeter,
    inp: Inputs,
    troubled: torch.Tensor,
    steps: int,
    scale: float | None = None,
) -> tuple[dict[str, float], list[list[float]], Health]:
    """Gather every rank's loss sums, troubled steps and throughput (one collective, one device read).

    ``troubled``: [non-finite losses, skipped steps, weights finite (1/0)] of this rank."""
    n = len(names)
    row = torch.cat(
        [
            sums,
            troubled,
            torch.tensor([images, meter.images, meter.wait_s, meter.total_s], dtype=torch.float64, device=sums.device),
        ]
    )
    rows = tdist.gather_rows(row)
    total_images = sum(r[n + 3] for r in rows)
    means = {k: sum(r[j] for r in rows) / max(total_images, 1.0) for j, k in enumerate(names)}
    health = Health(
        nonfinite=int(sum(r[n] for r in rows)),
        skipped=int(max(r[n + 1] for r in rows)),
        steps=steps,
        finite=all(r[n + 2] == 1.0 for r in rows),
        scale=scale,
    )
    return means, [r[n + 4 :] for r in rows], health


def validate(validator: Any, ema: Any, inp: Inputs, loss_names: tuple[str, ...], epoch: int) -> dict[str, float]:
    """Validate the EMA model on every rank's shard; every rank gets rank 0's merged results."""
    tdist.broadcast_buffers(ema.ema)
    if inp.device.type == "cuda":  # validation's batches are twice training's: give back what training cached
        torch.cuda.empty_cache()
    results = run_validation(
        validator, ema, inp.device, inp.data, inp.amp != "off", loss_names, epoch, inp.cfg.epochs, inp.topo.world_size
    )
    return dict(tdist.broadcast_object(results))


def recover(epoch: int, health: Health, attempt: int, parts: Parts, inp: Inputs, state: State, out: Path) -> None:
    """ultralytics' NaN recovery, changing what caused the NaN: put back the EMA, optimizer and early
    stopping of ``last.pt``, the model taking the EMA's weights (as ultralytics loads them), and make
    ``attempt`` the state's attempt at ``epoch``, which ``train_epoch`` trains at 0.5^attempt of the
    rate, in another image order (``data.ShardSampler``) with other augmentation (the loader workers
    reseed, ``data.epoch_seed``; the RNG is not rewound); the fp16 GradScaler starts over (its
    initial scale, 2^16); the images of the batches whose loss was the epoch's first non-finite one
    (``first_nonfinite``, on every rank) are left out for the rest of the run, named on a warning
    line so that their labels can be fixed. Said on one line. The same decision on every rank
    (``health`` is gathered from all of them; collective).

    Raises:
        TrainerError: the epoch broke ``MAX_RECOVERIES`` times in a row, or there is no checkpoint
            yet to go back to (the first epoch of a run): training diverges, with what to change on
            this device (``divergence_advice``).
    """
    cfg, topo = inp.cfg, inp.topo
    culprits = first_nonfinite(state, topo)
    if topo.is_main and culprits:
        say(culprits_line(epoch, culprits))
    fix = divergence_advice(inp.device, inp.capability, inp.amp)
    if attempt > MAX_RECOVERIES:
        raise TrainerError(
            f"epoch {epoch + 1}: {health.why()}, again after {MAX_RECOVERIES} recoveries from "
            f"{LAST}: training diverges; {fix}"
        )
    last = out / LAST
    ckpt: dict[str, Any] | None = None
    if topo.is_main and last.is_file():
        ckpt = checkpoint.load_for_resume(last)
    ckpt = tdist.broadcast_object(ckpt)
    if ckpt is None:
        raise TrainerError(
            f"epoch {epoch + 1}: {health.why()}, and there is no {LAST} yet to recover from "
            f"(it is written after each epoch); {fix}"
        )
    left_out = {f for _rank, _batch, images in culprits for f in images} - state.left_out
    state.left_out |= left_out
    changes = [f"lr x{0.5**attempt:g} for this epoch", "another image order"]
    if parts.scaler is not None:
        changes.append(f"GradScaler reset to {INITIAL_SCALE:g}")
    changes.append(
        f"{len(left_out)} image(s) left out (above)" if left_out else "no non-finite loss to leave images out for"
    )
    if topo.is_main:
        say(
            f"warning: epoch {epoch + 1}: {health.why()}; recovering from {last} (epoch {ckpt['epoch'] + 1}) and "
            f"training epoch {epoch + 1} again, attempt {attempt}/{MAX_RECOVERIES}: {', '.join(changes)}"
        )
    parts.optimizer.zero_grad(set_to_none=True)
    load_training_state(ckpt, parts, model_from_ema=True)
    if parts.scaler is not None:  # not last.pt's state: a scale that fed the NaN would come back with it
        parts.scaler.load_state_dict(torch.amp.GradScaler(inp.device.type, init_scale=INITIAL_SCALE).state_dict())
    state.best_fitness, state.metrics, state.attempt = ckpt["best_fitness"], saved_metrics(ckpt), attempt
    if cfg.debug_dir:
        state.seen.pop(epoch + 1, None)


INITIAL_SCALE = 2.0**16
"""The fp16 GradScaler's initial scale (torch's default), which NaN recovery starts it over from."""
CULPRITS_SHOWN = 32
"""Image files a culprits line names at most (the rest counted)."""


def first_nonfinite(state: State, topo: Topology) -> list[tuple[int, int, list[str]]]:
    """The batches of the epoch's first micro-step whose loss was not finite on some rank: (rank,
    batch number from 1, its image files) for each rank whose loss was not finite then, from
    ``state.troubled``. After that micro-step, the weights (without a GradScaler to skip the step)
    and with them every later loss of every rank are no longer finite: only the first is the
    batch's doing. Collective (every rank gets the list); empty when every loss was finite."""
    mine: tuple[int, list[str]] | None = None
    if state.troubled is not None:
        flags, files = state.troubled
        bad = flags.nonzero().flatten().tolist()  # read only here, after an epoch that broke
        if bad:
            mine = (int(bad[0]), files[bad[0]])
    everyone = tdist.gather_objects(mine)
    firsts = [(rank, got) for rank, got in enumerate(everyone) if got is not None]
    if not firsts:
        return []
    step = min(got[0] for _rank, got in firsts)
    return [(rank, got[0] + 1, list(got[1])) for rank, got in firsts if got[0] == step]


def culprits_line(epoch: int, culprits: list[tuple[int, int, list[str]]]) -> str:
    """Rank 0's warning naming the images of the batches with the epoch's first non-finite loss."""
    images = [f for _rank, _batch, files in culprits for f in files]
    shown = ", ".join(images[:CULPRITS_SHOWN]) + (
        f" and {len(images) - CULPRITS_SHOWN} more" if len(images) > CULPRITS_SHOWN else ""
    )
    where = ", ".join(f"rank {rank} batch {batch}" for rank, batch, _files in culprits)
    return (
        f"warning: epoch {epoch + 1}: the first non-finite loss came from {where}, images {shown}: left out of "
        "training from now on; check their labels (boxes outside the image, degenerate boxes, empty files)"
    )


def divergence_advice(device: torch.device, capability: tuple[int, int] | None, amp: str) -> str:
    """What to change when training diverges, in what this device can do: a lower rate, clipping,
    the labels, and a precision this device has (bf16 only where it is native: compute capability
    8.0; V100 and T4 have fp32)."""
    precision = ""
    if device.type == "cuda" and amp != "off":
        native = capability is not None and capability[0] >= 8
        others = [m for m in (("bf16", "off") if native else ("off",)) if m != amp]
        why = "" if native else " (bf16 is not native on this GPU)"
        precision = f", try {' or '.join(f'--amp {m}' for m in others)}{why}"
    return (
        f"lower the learning rate (--lr / lr0), keep --clip on{precision}, and check the labels "
        "(boxes outside the image, empty files)"
    )


def end_epoch(
    epoch: int,
    fitness: float | None,
    loss_means: dict[str, float],
    throughput: list[list[float]],
    parts: Parts,
    inp: Inputs,
    state: State,
    out: Path,
    scalars: output.Scalars | None,
    train_start: float,
) -> None:
    """Rank 0: progress lines, results.csv row, TensorBoard, and one checkpoint write (best.pt and
    epochN.pt are links to it); then a barrier so no rank runs ahead of the files."""
    cfg, topo = inp.cfg, inp.topo
    ranks = gather_rank_states(topo, state)
    if topo.is_main:
        improved = fitness is not None and fitness > state.best_fitness
        if fitness is not None and improved:
            state.best_fitness = fitness
        lrs = learning_rates(parts.optimizer)
        losses = {f"train/{k}": v for k, v in loss_means.items() if not k.startswith("steps/")}
        counts = {k: v for k, v in loss_means.items() if k.startswith("steps/")}
        row = {**losses, **state.metrics, **lrs, **counts}
        output.append_results(out / "results.csv", epoch, time.time() - train_start, row)
        if scalars is not None:
            ips = {f"throughput/rank{r}": (x[0] / x[2] if x[2] > 0 else 0.0) for r, x in enumerate(throughput)}
            scalars.add({**row, **ips, "throughput/total": sum(ips.values())}, epoch + 1)
        stopper = {"best_fitness": parts.stopper.best_fitness, "best_epoch": parts.stopper.best_epoch}
        train_args = {**vars(parts.hyp), "save_dir": str(out.resolve())}  # where ultralytics' resume writes
        ckpt = checkpoint.build(
            epoch=epoch,
            best_fitness=state.best_fitness,
            stopper=stopper,
            model=parts.model,
            ema=parts.ema,
            optimizer=parts.optimizer,
            scaler=parts.scaler,
            train_args=train_args,
            metrics=row,
            config=asdict(cfg),
            ranks=ranks,
            half=state.half,
            left_out=sorted(state.left_out),
        )
        last = out / LAST
        checkpoint.save_atomic(ckpt, last)
        if improved:
            checkpoint.link_atomic(last, out / BEST)
        if cfg.save_period and (epoch + 1) % cfg.save_period == 0:
            checkpoint.link_atomic(last, last.with_name(f"epoch{epoch + 1}.pt"))
    tdist.barrier()


def learning_rates(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Each parameter group's current rate, under results.csv's names."""
    return {f"lr/pg{j}": g["lr"] for j, g in enumerate(optimizer.param_groups)}


def gather_rank_states(topo: Topology, state: State) -> list[dict[str, Any]]:
    """Every rank's RNG state and mosaic buffers, in rank order, on rank 0 (others get an empty list)."""
    mine = {"rng": checkpoint.rng_state(), "buffers": {k: list(v) for k, v in state.buffers.items()}}
    if not topo.distributed:
        return [mine]
    out: list[Any] = [None] * topo.world_size if topo.is_main else []
    dist.gather_object(mine, out if topo.is_main else None, dst=0)
    return out


def epochs_left(done: int, epochs: int) -> str:
    """The epochs a run trains after ``done`` of them, as the start-up and resume lines say it."""
    return f"epochs {done + 1}..{epochs}" if done < epochs else f"no epoch left ({done} of {epochs} done)"


def resume_line(done: int, epochs: int, updates: int, best_fitness: float) -> str:
    """What rank 0 says on resuming a checkpoint that finished ``done`` epochs of ``epochs``."""
    where = f"at epoch {done + 1}" if done < epochs else f"after epoch {done}"
    left = (
        f"epochs {done + 1}..{epochs} left of {epochs}"
        if done < epochs
        else (f"no epoch left of {epochs}: only the final validation runs (a longer run: --epochs)")
    )
    return (
        f"resuming {where} (checkpoint finished epoch {done}, {updates} optimizer steps, best fitness "
        f"{best_fitness:.4f}): {left}"
    )


def load_training_state(ckpt: dict[str, Any], parts: Parts, model_from_ema: bool = False) -> None:
    """Load the model (the EMA's weights with ``model_from_ema``), EMA, optimizer, scaler and early
    stopping of a checkpoint of this trainer, in fp32."""
    saved = ckpt["trainer"]
    parts.model.load_state_dict(saved["ema"] if model_from_ema else saved["model"])
    parts.ema.ema.load_state_dict(saved["ema"])
    parts.ema.updates = ckpt["updates"]
    optimizer = ckpt["optimizer"] if ckpt.get("optimizer") is not None else saved["optimizer"]  # before: only there
    parts.optimizer.load_state_dict(optimizer)
    scaler = ckpt.get("scaler") or saved.get("scaler")
    if parts.scaler is not None and scaler:
        parts.scaler.load_state_dict(scaler)
    parts.stopper.__dict__.update(saved.get("stopper") or {})


def saved_metrics(ckpt: dict[str, Any]) -> dict[str, float]:
    """The last validation metrics a checkpoint holds (its train_metrics without the training columns)."""
    return {k: v for k, v in ckpt["train_metrics"].items() if not k.startswith(("train/", "lr/", "steps/"))}


def restore(
    ckpt: dict[str, Any], parts: Parts, topo: Topology, announce: bool = True, epochs: int | None = None
) -> State:
    """Load model, EMA, optimizer, scaler, early stopping, RNG and mosaic buffers; return where to continue."""
    saved = ckpt["trainer"]
    load_training_state(ckpt, parts)
    buffers: dict[int, list[int]] = {}
    mine: dict[str, Any] = {}
    if saved["world_size"] == topo.world_size:
        mine = saved["ranks"][topo.rank]
        checkpoint.set_rng_state(mine["rng"])
        buffers = {int(k): list(v) for k, v in mine["buffers"].items()}
    else:
        say(
            f"warning: resuming on {topo.world_size} ranks, saved on {saved['world_size']}: RNG streams reseeded, "
            "mosaic buffers start empty (the run continues, not bit for bit)"
        )
        seed_everything(saved["config"]["seed"] + 1 + topo.rank + ckpt["epoch"])
    state = State(
        epoch=ckpt["epoch"] + 1,
        best_fitness=ckpt["best_fitness"],
        buffers=buffers,
        metrics=saved_metrics(ckpt),
        left_out=set(saved.get("left_out", ())),  # before: none were
        skip=preempt.resumed_batches(ckpt),
        skip_rng=mine.get("rng_now") if saved["world_size"] == topo.world_size else None,
    )
    if topo.is_main and announce:
        say(
            resume_line(
                state.epoch,
                epochs if epochs is not None else saved["config"]["epochs"],
                parts.ema.updates,
                state.best_fitness,
            )
        )
        if state.skip:
            say(preempt.resume_note(state.epoch, state.skip))
    return state


def param_checksum(model: nn.Module) -> str:
    """SHA-256 over every parameter's bytes, in order: equal on all ranks iff the weights are."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def write_debug(
    directory: Path, topo: Topology, model: nn.Module, state: State, comm: tdist.GradComm | None = None
) -> None:
    """Debug record of this rank: samples seen per epoch, parameter checksum and a parameter sum,
    what its DDP gradient all-reduces sent (``dist.GradComm.record``; None on one rank)."""
    directory.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": topo.rank,
        "world_size": topo.world_size,
        "seen": state.seen,
        "checksum": param_checksum(model),
        "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "best_fitness": state.best_fitness,
        "grad_comm": comm.record() if comm is not None else None,
        "left_out": sorted(state.left_out),
    }
    (directory / f"rank{topo.rank}.json").write_text(json.dumps(record))
