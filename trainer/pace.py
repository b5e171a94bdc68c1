"""Each rank's own pace over a window of steps: data wait, compute outside collectives, wall.

In synchronous DDP every rank's step takes as long as the slowest rank's, because the fast ranks
wait for it inside the gradient all-reduce (backward). What tells the ranks apart is the time each
spends outside collectives: waiting for its data loader, and its forward and loss. ``Pace`` times
those two per micro-step; at the end of a window the loop prints :func:`trainer.logs.timing_line`
on every rank (no collective: a slow rank's line is late, never the others').

A forward can hold collectives of its own: SyncBatchNorm (``--sync-bn``) all-gathers each layer's
statistics, so every rank's forward waits there for the slowest rank. ``Pace`` times those layers
apart (``collective_layers``, hooked around their forward) and leaves them out of the compute
seconds: the line's ``sync_s`` is their time, the slowest rank's wait included.

On a GPU the forward is timed with CUDA events (recorded on the stream, read once per window,
after the last one completes), so no step waits for the device; on a CPU with the host clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from trainer.logs import timing_line


def collective_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The layers of ``model`` whose forward holds a collective: SyncBatchNorm's."""
    return [m for m in model.modules() if isinstance(m, torch.nn.SyncBatchNorm)]


class Pace:
    """The current window of one rank. ``layers``: modules whose forward is a collective (timed
    apart, ``collective_layers``); ``close`` removes the hooks that time them."""

    def __init__(
        self,
        device: torch.device,
        layers: Sequence[torch.nn.Module] = (),
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.cuda = device.type == "cuda"
        self.clock = clock
        self.timed = bool(layers)
        self.hooks = [
            h
            for m in layers
            for h in (m.register_forward_pre_hook(self._sync_begins), m.register_forward_hook(self._sync_ends))
        ]
        self.reset()

    def reset(self) -> None:
        """Start a new window now."""
        self.steps = self.images = 0
        self.data_s = self.compute_s = self.sync_s = 0.0
        self.started = self.clock()
        self.events: list[tuple[Any, Any]] = []
        self.sync_events: list[tuple[Any, Any]] = []
        self._t: Any = None
        self._s: Any = None

    def close(self) -> None:
        """Remove the hooks on the collective layers."""
        for h in self.hooks:
            h.remove()
        self.hooks = []

    def data(self, seconds: float) -> None:
        """The data loader kept this rank waiting `seconds` for the next batch."""
        self.data_s += seconds

    def _mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return self.clock()

    def forward_begins(self) -> None:
        self._t = self._mark()

    def forward_ends(self, images: int) -> None:
        """Forward and loss of one micro-step are queued (GPU) or done (CPU)."""
        self.steps += 1
        self.images += images
        end = self._mark()
        if self.cuda:
            self.events.append((self._t, end))
        else:
            self.compute_s += end - self._t

    def _sync_begins(self, module: Any, args: Any) -> None:
        self._s = self._mark()

    def _sync_ends(self, module: Any, args: Any, output: Any) -> None:
        end = self._mark()
        if self.cuda:
            self.sync_events.append((self._s, end))
        else:
            self.sync_s += end - self._s

    def line(self, epoch: int, batch: int) -> str:
        """The window's timing line (then a new window starts)."""
        if self.events:
            self.events[-1][1].synchronize()
            self.compute_s += sum(a.elapsed_time(b) for a, b in self.events) / 1000.0
            self.sync_s += sum(a.elapsed_time(b) for a, b in self.sync_events) / 1000.0
        text = timing_line(
            epoch,
            batch,
            self.steps,
            self.images,
            self.data_s,
            max(self.compute_s - self.sync_s, 0.0),
            self.clock() - self.started,
            self.sync_s if self.timed else None,
        )
        self.reset()
        return text
