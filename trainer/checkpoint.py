"""Checkpoints that ``ultralytics.YOLO(path)`` loads and that ``--resume`` continues exactly.

The ultralytics part of the file (``ema`` as a half-precision model, ``train_args``, ``epoch``,
``best_fitness``...) matches its own trainer's ``save_model``. The ``trainer`` entry holds what an
exact resume needs and ultralytics rounds away: fp32 model and EMA weights, the optimizer in
fp32, and every rank's RNG state. Only tensors, numbers, strings and ultralytics' own modules are
pickled, so the file loads without this package installed.
"""

from __future__ import annotations

import os
import random
from copy import deepcopy
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.errors import TrainerError


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


def build(*, epoch: int, best_fitness: float, model: torch.nn.Module, ema: Any, optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, train_args: dict[str, Any], metrics: dict[str, float],
          config: dict[str, Any], rng: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint dict after ``epoch`` (0-based, completed)."""
    import ultralytics

    half_ema = deepcopy(ema.ema).half()
    half_ema.criterion = None  # the loss holds device tensors and is rebuilt lazily
    return {
        "epoch": epoch,
        "best_fitness": best_fitness,
        "model": None,
        "ema": half_ema,
        "updates": ema.updates,
        "optimizer": None,
        "scaler": None,
        "train_args": train_args,
        "train_metrics": metrics,
        "date": datetime.now().isoformat(),
        "version": ultralytics.__version__,
        "trainer": {
            "config": config,
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "ema": {k: v.detach().clone() for k, v in ema.ema.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng,
            "world_size": len(rng),
        },
    }


def save_atomic(ckpt: dict[str, Any], path: Path) -> None:
    """Write ``ckpt`` to ``path`` through a temporary file and a rename.

    A reader (or a resume after a crash) sees the old file or the new one, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_for_resume(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by this trainer.

    Raises:
        TrainerError: missing file, or a checkpoint without this trainer's resume state.
    """
    if not path.is_file():
        raise TrainerError(f"--resume {path}: no such file (is --out the directory of the run that stopped?)")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(ckpt, dict) or "trainer" not in ckpt:
        raise TrainerError(f"--resume {path}: not written by this trainer; start from it with --weights instead")
    return ckpt
