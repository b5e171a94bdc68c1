"""Learning rate, momentum and accumulation over the run: ultralytics' recipe, as pure functions.

Per epoch the rate of each parameter group is ``initial_lr x lf(epoch)`` (linear to ``lrf``, or
cosine with ``cos_lr``). During warmup (``warmup_epochs`` x batches per epoch, leaving at least
the final epoch) each micro-step moves every group's rate from 0 (biases: from
``warmup_bias_lr``) towards that value, momentum from ``warmup_momentum`` to ``momentum``, and
the number of micro-steps per optimizer step from 1 to its nominal value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


def lr_factor(epochs: int, lrf: float, cos: bool) -> Callable[[float], float]:
    """``lf(epoch)``: the fraction of the initial rate used in ``epoch`` (0-based)."""
    if cos:  # ultralytics' one_cycle(1, lrf, epochs)
        return lambda x: max((1 - math.cos(x * math.pi / epochs)) / 2, 0) * (lrf - 1) + 1
    return lambda x: max(1 - x / epochs, 0) * (1.0 - lrf) + lrf


def warmup_iterations(warmup_epochs: float, epochs: int, batches: int) -> int:
    """Micro-steps of warmup: ``warmup_epochs`` x batches, leaving at least the final epoch."""
    warmup = min(warmup_epochs, max(epochs - 1, 0))
    return round(warmup * batches) if warmup > 0 else 0


def start_epoch(optimizer: Any, epoch: int, lf: Callable[[float], float], scale: float = 1.0) -> None:
    """Each group's rate for ``epoch`` (what ultralytics' LambdaLR sets at the epoch's start), times
    ``scale`` (below 1 for an epoch trained again after a NaN recovery)."""
    for group in optimizer.param_groups:
        group["lr"] = group["initial_lr"] * lf(epoch) * scale


def micro_step(
    optimizer: Any,
    ni: int,
    nw: int,
    epoch: int,
    lf: Callable[[float], float],
    nominal: int,
    warmup_bias_lr: float,
    warmup_momentum: float,
    momentum: float,
    scale: float = 1.0,
) -> int:
    """Set the rates (and momentum) for micro-step ``ni`` of the run, the rates times ``scale`` (as
    ``start_epoch``); return how many micro-steps the optimizer step it belongs to accumulates."""
    if not nw or ni > nw:
        return nominal
    xi = [0, nw]
    for group in optimizer.param_groups:
        start = warmup_bias_lr if group.get("param_group") == "bias" else 0.0
        group["lr"] = float(np.interp(ni, xi, [start, group["initial_lr"] * lf(epoch)])) * scale
        if "momentum" in group:
            group["momentum"] = float(np.interp(ni, xi, [warmup_momentum, momentum]))
    return max(1, int(np.interp(ni, xi, [1, nominal]).round()))
