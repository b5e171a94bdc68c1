"""Checkpoints that ``ultralytics.YOLO(path)`` loads and that ``--resume`` continues exactly.

The ultralytics part of the file (``ema`` as a half-precision model, ``optimizer``, ``scaler``,
``train_args`` with the run's ``save_dir``, ``epoch``, ``best_fitness``...) matches its own
trainer's ``save_model``, so ``YOLO("last.pt").train(resume=True)`` continues a run of this trainer
too (ultralytics' own way: from the EMA, its RNG fresh). The optimizer state is stored once, in
fp32 (ultralytics saves its momentum in fp16 and loads either). The ``trainer`` entry holds the
rest of what an exact resume needs and ultralytics rounds away: fp32 model and EMA weights, the
early-stopping state, and every rank's RNG and mosaic-buffer state. Only tensors, numbers,
strings and ultralytics' own modules are pickled, so the file loads without this package installed.

Each epoch the checkpoint is serialized once; ``best.pt`` and ``epochN.pt`` are hard links to
the same bytes. After the last epoch ``last.pt`` and ``best.pt`` are stripped like ultralytics'
final files: the EMA as ``model`` in half precision, no optimizer, no resume state.
"""

from __future__ import annotations

import math
import os
import pickle
import random
from collections.abc import Mapping
from copy import deepcopy
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.errors import TrainerError
from trainer.interface import BEST, LAST

RESUME_KEYS = ("epoch", "best_fitness", "updates", "optimizer", "scaler", "train_metrics", "trainer")
"""What rank 0 sends every rank when a run resumes (the half EMA module is not needed)."""


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and CUDA)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def half_model(module: Any) -> Any:
    """A detached fp16 NCHW copy for the file, as ultralytics saves its EMA (channels_last would
    break older ultralytics' fusing, NaN/Inf from the fp16 cast clamped)."""
    return _as_saved(deepcopy(module))


def _as_saved(copy: Any) -> Any:
    """A copy of the EMA made what the file holds: fp16, NCHW, no loss, NaN/Inf clamped."""
    copy.half().to(memory_format=torch.contiguous_format)  # a model's own _apply converts its extra tensors
    if hasattr(copy, "criterion"):
        copy.criterion = None  # the loss holds device tensors and is rebuilt lazily
    for v in copy.state_dict().values():
        if v.is_floating_point():
            torch.nan_to_num_(v)
    return copy


_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}
"""A module's own bookkeeping (parameters, buffers, children, hooks): never taken attribute by attribute."""


class HalfCopy:
    """``half_model`` of the same module epoch after epoch, without its cost: the first call makes
    the copy; later calls write the module's current weights into it and take its other
    attributes again (``names``, ``args``, a head's anchors...), then convert as ``half_model``
    does, so the file holds what a fresh ``half_model`` would. The deepcopy of the whole module was
    most of an epoch-end checkpoint's time. Another module, or one of another structure (other
    names or shapes), gets a new copy.

    The copy shares the module's non-tensor attributes until the next call: serialize it before
    the module changes again (``end_epoch`` writes the checkpoint at once)."""

    def __init__(self) -> None:
        self._source: Any = None
        self._copy: Any = None

    def __call__(self, module: Any) -> Any:
        theirs = module.state_dict()
        ours = self._copy.state_dict() if self._copy is not None and module is self._source else None
        if ours is None or list(ours) != list(theirs) or any(ours[k].shape != v.shape for k, v in theirs.items()):
            self._source, self._copy = module, half_model(module)
            return self._copy
        with torch.no_grad():
            for k, v in theirs.items():
                ours[k].copy_(v)
        for (_, src), (_, dst) in zip(module.named_modules(), self._copy.named_modules()):
            for k in [k for k in vars(dst) if k not in _MODULE_INTERNALS and k not in vars(src)]:
                del dst.__dict__[k]
            for k, v in vars(src).items():
                if k not in _MODULE_INTERNALS:
                    dst.__dict__[k] = v
        return _as_saved(self._copy)


PACKED = "trainer-packed-1"
"""The `format` of a state dict `pack` wrote."""


def pack(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A state dict as one flat tensor per dtype, with each entry's name, dtype and shape: the
    file then holds a few tensors instead of one per entry. Pickling and writing each tensor on
    its own was most of an epoch-end checkpoint's time on a small model (about 25 ms of the 50
    ms for a yolo12n state dict on one CPU thread), where ultralytics writes only the fp16 EMA and
    the optimizer. Plain dicts, lists and tensors only: a file read without this package (ultralytics'
    ``YOLO(last.pt)``) still unpickles. The flat tensors are copies: the live ones may change."""
    flat: dict[str, list[torch.Tensor]] = {}
    keys, dtypes, shapes = [], [], []
    for k, v in state.items():
        keys.append(k)
        dtypes.append(str(v.dtype).removeprefix("torch."))
        shapes.append(list(v.shape))
        flat.setdefault(dtypes[-1], []).append(v.detach().reshape(-1))
    return {
        "format": PACKED,
        "keys": keys,
        "dtypes": dtypes,
        "shapes": shapes,
        "flat": {d: torch.cat(parts) for d, parts in flat.items()},
    }


def unpack(saved: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The state dict `pack` packed, each entry with a storage of its own (a view would carry its
    whole flat tensor wherever it is pickled: the resume's broadcast to every rank sent one copy of
    it per entry, 12 GB for yolo12n); a state dict as it is (a checkpoint written before packing)."""
    if saved.get("format") != PACKED:
        return dict(saved)
    at: dict[str, int] = dict.fromkeys(saved["flat"], 0)
    out = {}
    for k, d, shape in zip(saved["keys"], saved["dtypes"], saved["shapes"]):
        n = math.prod(shape)
        out[k] = saved["flat"][d][at[d] : at[d] + n].view(shape).clone()  # its own storage: see above
        at[d] += n
    return out


def build(
    *,
    epoch: int,
    best_fitness: float,
    stopper: dict[str, Any],
    model: torch.nn.Module,
    ema: Any,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    train_args: dict[str, Any],
    metrics: dict[str, float],
    config: dict[str, Any],
    ranks: list[dict[str, Any]],
    half: HalfCopy | None = None,
    left_out: list[str] | None = None,
) -> dict[str, Any]:
    """The checkpoint dict after ``epoch`` (0-based, completed); ``ranks`` holds each rank's RNG and
    mosaic-buffer state, in rank order; ``half`` makes the file's fp16 EMA (a fresh copy when None);
    ``left_out``: the training images NaN recovery left out for the rest of the run;
    ``train_args`` should name the run directory as ``save_dir``, where ultralytics' resume writes.

    The optimizer state holds the live tensors, not copies: serialize the dict before the next
    training step. The fp32 weights and EMA are packed copies (``pack``; ``load_for_resume`` unpacks)."""
    import ultralytics

    return {
        "epoch": epoch,
        "best_fitness": best_fitness,
        "model": None,
        "ema": (half or half_model)(ema.ema),
        "updates": ema.updates,
        "optimizer": optimizer.state_dict(),  # what ultralytics' resume requires; fp32, the exact resume's too
        "scaler": scaler.state_dict() if scaler is not None else {},  # {}: ultralytics' disabled scaler's
        "train_args": train_args,
        "train_metrics": metrics,
        "date": datetime.now().astimezone().isoformat(),
        "version": ultralytics.__version__,
        "trainer": {
            "config": config,
            "model": pack(model.state_dict()),
            "ema": pack(ema.ema.state_dict()),
            "stopper": stopper,
            "ranks": ranks,
            "world_size": len(ranks),
            "left_out": sorted(left_out or ()),
        },
    }


def save_atomic(ckpt: dict[str, Any], path: Path) -> None:
    """Serialize ``ckpt`` straight into a temporary file beside ``path`` and rename it over
    ``path``: a reader (or a resume after a crash) sees the old file or the new one, never half
    of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(ckpt, tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def link_atomic(source: Path, path: Path) -> None:
    """Make ``path`` the same bytes as ``source``: a hard link (no second write), or a copy where
    the file system has no hard links; replaced atomically like every checkpoint."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        tmp.write_bytes(source.read_bytes())
    os.replace(tmp, path)


def strip(ckpt: dict[str, Any]) -> dict[str, Any]:
    """The final form of a checkpoint, as ultralytics' ``strip_optimizer`` leaves it: the EMA as
    ``model`` (fp16, no gradients, no loss), no optimizer or resume state, ``epoch`` -1 and
    ``train_args`` limited to ultralytics' own settings."""
    from ultralytics.utils import DEFAULT_CFG_DICT, DEFAULT_CFG_KEYS

    out = {k: v for k, v in ckpt.items() if k != "trainer"}
    model = out.get("ema") or out["model"]
    if hasattr(model, "args"):
        model.args = dict(vars(model.args)) if not isinstance(model.args, dict) else dict(model.args)
    if hasattr(model, "criterion"):
        model.criterion = None
    model.half()
    for p in model.parameters():
        p.requires_grad = False
    args = {**DEFAULT_CFG_DICT, **(out.get("train_args") or {})}
    out.update(
        model=model,
        optimizer=None,
        best_fitness=None,
        ema=None,
        updates=None,
        scaler=None,
        epoch=-1,
        train_args={k: v for k, v in args.items() if k in DEFAULT_CFG_KEYS},
        date=datetime.now().astimezone().isoformat(),
    )
    return out


def finalize(run_dir: Path) -> None:
    """Strip the run folder's ``last.pt`` and ``best.pt`` (best.pt stays a link when it was one)."""
    last, best = run_dir / LAST, run_dir / BEST
    same = last.exists() and best.exists() and os.path.samefile(last, best)
    for path in (last,) if same else (last, best):
        if path.exists():
            save_atomic(strip(torch.load(path, map_location="cpu", weights_only=False)), path)
    if same:
        link_atomic(last, best)


def load_for_resume(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by this trainer; only what resuming needs is returned.

    Raises:
        TrainerError: missing file, one that is not a checkpoint, a finished run's final (stripped)
            checkpoint, or a checkpoint without this trainer's resume state.
    """
    if not path.is_file():
        raise TrainerError(f"--resume {path}: no such file (is --out the directory of the run that stopped?)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as e:
        raise TrainerError(
            f"--resume {path}: cannot be read as a checkpoint"
            f" ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "a damaged or partial copy? give --resume another checkpoint of the run (weights/epochN.pt)"
        ) from None
    if not isinstance(ckpt, dict):
        raise TrainerError(f"--resume {path}: not a checkpoint")
    if "trainer" not in ckpt:
        if ckpt.get("epoch") == -1:
            raise TrainerError(
                f"--resume {path}: that run finished (this is its final checkpoint): nothing to resume; "
                f"to train further start a new run from it with --weights {path}"
            )
        raise TrainerError(f"--resume {path}: not written by this trainer; start from it with --weights instead")
    resume = {k: ckpt[k] for k in RESUME_KEYS if k in ckpt}
    resume["trainer"] = {**ckpt["trainer"], **{k: unpack(ckpt["trainer"][k]) for k in ("model", "ema")}}
    return resume
