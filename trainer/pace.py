"""Each rank's own pace over a window of steps: data wait, compute outside collectives, wall.

In synchronous DDP every rank's step takes as long as the slowest rank's, because the fast ranks
wait for it inside the gradient all-reduce (backward). What tells the ranks apart is the time each
spends outside collectives: waiting for its data loader, and its forward and loss. ``Pace`` times
those two per micro-step; at the end of a window the loop prints :func:`trainer.logs.timing_line`
on every rank (no collective: a slow rank's line is late, never the others').

On a GPU the forward is timed with CUDA events (recorded on the stream, read once per window,
after the last one completes), so no step waits for the device; on a CPU with the host clock.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainer.logs import timing_line


class Pace:
    """The current window of one rank."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        """Start a new window now."""
        self.steps = self.images = 0
        self.data_s = self.compute_s = 0.0
        self.started = time.perf_counter()
        self.events: list[tuple[Any, Any]] = []
        self._t: Any = None

    def data(self, seconds: float) -> None:
        """The data loader kept this rank waiting `seconds` for the next batch."""
        self.data_s += seconds

    def forward_begins(self) -> None:
        if self.cuda:
            self._t = torch.cuda.Event(enable_timing=True)
            self._t.record()
        else:
            self._t = time.perf_counter()

    def forward_ends(self, images: int) -> None:
        """Forward and loss of one micro-step are queued (GPU) or done (CPU)."""
        self.steps += 1
        self.images += images
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._t, end))
        else:
            self.compute_s += time.perf_counter() - self._t

    def line(self, epoch: int, batch: int) -> str:
        """The window's timing line (then a new window starts)."""
        if self.events:
            self.events[-1][1].synchronize()
            self.compute_s += sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
        text = timing_line(
            epoch, batch, self.steps, self.images, self.data_s, self.compute_s, time.perf_counter() - self.started
        )
        self.reset()
        return text
