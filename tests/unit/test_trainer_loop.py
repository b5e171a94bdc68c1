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
    parts: Any = SimpleNamespace(scaler=scaler, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 model=model, ema=NoEMA())
    skipped = torch.zeros((), dtype=torch.float64)
    nonfinite = 0
    for _ in range(steps):
        loss = model(torch.ones(2, 4)).sum()
        if nonfinite_loss:
            loss = loss * float("inf")
            nonfinite += 1
        scaler.scale(loss).backward()
        if max_grad * scaler.get_scale() > FP16_MAX:
            model.weight.grad[0, 0] = float("inf")  # what the fp16 backward makes of it
        skipped += loop.optimizer_step(parts, clip=10.0)
    troubled = torch.tensor([float(nonfinite), float(skipped), 1.0], dtype=torch.float64)
    _, _, health = loop.epoch_summary(0, ["box"], torch.zeros(1, dtype=torch.float64), 2 * steps, loop.StepMeter(),
                                      None, troubled, steps, scaler.get_scale())  # type: ignore[arg-type]
    return health


def test_fp16_warm_up_skips_in_a_short_first_epoch_are_not_divergence() -> None:
    scaler = torch.amp.GradScaler("cpu")  # starts at 2^16, as on CUDA
    # max |grad| 2e3 x 8 ranks: the scale fits at 2^2, after 14 skipped steps; an epoch of 5 skips them all
    first = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)
    assert first.skipped == first.steps == 5 and first.scale == 2.0 ** 11
    assert not first.broken, first.why()
    second = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)
    assert second.skipped == 5 and not second.broken
    third = fp16_epoch(scaler, steps=5, max_grad=2e3 * 8)  # 2^1 .. 2^-3 skip no more: the scale fits
    assert third.skipped == 4 and third.scale == 2.0 ** 2 and not third.broken


def test_skips_at_a_small_scale_or_with_non_finite_losses_are_divergence() -> None:
    diverged = fp16_epoch(torch.amp.GradScaler("cpu", init_scale=2.0 ** -9), steps=3, max_grad=1e9)
    assert diverged.skipped == diverged.steps == 3 and diverged.scale is not None and diverged.scale < loop.DIVERGED_SCALE
    assert diverged.broken and "all 3 optimizer steps were skipped" in diverged.why()
    nan = fp16_epoch(torch.amp.GradScaler("cpu"), steps=2, max_grad=1.0, nonfinite_loss=True)
    assert nan.skipped == 2 and nan.nonfinite == 2 and nan.broken
    assert loop.Health(nonfinite=1, skipped=0, steps=4, finite=False).broken  # without a scaler: weights not finite
    assert not loop.Health(skipped=4, steps=5, scale=2.0 ** -20).broken  # a step went through
