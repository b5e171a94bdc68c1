"""Validation with ultralytics' own validator, run on every rank over its shard of the val set."""

from __future__ import annotations

from copy import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


class _TrainerView:
    """The few attributes ultralytics' validator reads from its trainer when validating in training mode."""

    def __init__(
        self,
        ema: Any,
        device: torch.device,
        data: dict[str, Any],
        amp: bool,
        loss_names: tuple[str, ...],
        epoch: int,
        epochs: int,
        world_size: int,
        final: bool = False,
    ) -> None:
        """Capture what ``BaseValidator.__call__(trainer=...)`` touches. ``final``: the validation
        that may plot (the validator keeps ``plots`` only when the stopper may stop or at the last
        epoch; the final validation of best.pt runs at best.pt's epoch)."""
        self.ema, self.device, self.data, self.amp = ema, device, data, amp
        self.loss_items = {k: torch.zeros((), device=device) for k in loss_names}
        self.stopper = SimpleNamespace(possible_stop=final)
        self.epoch, self.epochs, self.world_size = epoch, epochs, world_size

    @staticmethod
    def label_loss_items(loss_items: dict[str, Any], prefix: str = "train") -> dict[str, float]:
        """``{"box_loss": t}`` → ``{"val/box_loss": float}``, as ultralytics' trainer does."""
        return {f"{prefix}/{k}": round(float(v), 5) for k, v in loss_items.items()}


def make_validator(task: str, loader: Any, save_dir: Path, hyp: SimpleNamespace, writes: bool = True) -> Any:
    """ultralytics' Detection- or SegmentationValidator over ``loader``, with plots and JSON off
    (``run_validation(..., plots=True)`` turns plots on for one validation).

    ``writes``: whether this rank writes the run directory (rank 0 only). ultralytics' validator
    creates its ``save_dir`` when it is built; another rank's is built on a directory that exists
    (the file system's root: creating it does nothing) and then pointed at ``save_dir``, which it
    never writes (ultralytics plots on rank 0 only), so no other rank creates the run directory."""
    from ultralytics.models.yolo.detect import DetectionValidator
    from ultralytics.models.yolo.segment import SegmentationValidator

    args = copy(hyp)
    args.plots, args.save_json, args.save_txt = False, False, False
    cls = SegmentationValidator if task == "segment" else DetectionValidator
    validator = cls(dataloader=loader, save_dir=save_dir if writes else Path(save_dir.anchor or "/"), args=args)
    validator.save_dir = save_dir
    return validator


def run_validation(
    validator: Any,
    ema: Any,
    device: torch.device,
    data: dict[str, Any],
    amp: bool,
    loss_names: tuple[str, ...],
    epoch: int,
    epochs: int,
    world_size: int,
    plots: bool = False,
) -> dict[str, float] | None:
    """Validate the EMA model on every rank; rank 0 gets the merged metrics, the others None.

    Every rank must call this (with the same ``plots``): the validator gathers per-rank statistics
    to rank 0. With ``plots``, rank 0 writes ultralytics' plots into the validator's save_dir: the
    confusion matrices (summed over every rank's shard by the validator's own reduce), the PR, F1,
    P and R curves (from the gathered statistics), and val_batch0-2 images of its own shard, these
    only where their PIL font is local (never a download).
    """
    from trainer.plots import pil_fonts_local, without_pil_plots

    view = _TrainerView(ema, device, data, amp, loss_names, epoch, epochs, world_size, final=plots)
    validator.args.plots = plots
    if plots and not pil_fonts_local():
        without_pil_plots(validator)
    try:
        return validator(trainer=view)
    finally:
        validator.args.plots = False
