"""Preemption: a warning signal (SIGUSR2: Slurm's `--signal` before a time limit or a preemption)
makes the trainer write a checkpoint and exit, so that ``--resume`` continues where it stopped.

The handler only sets a flag. Every ``--log-every`` optimizer steps (where the loop already speaks)
the ranks agree on it (one all-reduce of one number), so they all stop at the same optimizer-step
boundary: there rank 0 writes ``weights/last.pt`` with the model, EMA, optimizer, every rank's
generators and mosaic buffers as the epoch began and its generators now, and how many batches of
the epoch were trained; every rank then exits with ``PREEMPTED_EXIT``, which orch reads as "preempted" (its
retry passes ``--resume auto``). The resumed run loads the epoch's first batches again, in the same
order with the same augmentation (the workers' generators restart from the epoch's seed), without
training on them, and trains from the next one: it continues exactly, mid-epoch (the epoch's mean
losses then cover the batches trained after the resume). A flag seen at an epoch's last step, or
between epochs, exits after that epoch's own checkpoint.
"""

from __future__ import annotations

import signal
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainer import checkpoint
from trainer.errors import TrainerError
from trainer.interface import LAST, PREEMPTED_EXIT
from trainer.logs import say

SIGNAL = signal.SIGUSR2
_asked: list[int] = []
"""The warning signals this process received (the handler appends: nothing else is safe there)."""


def install() -> None:
    """Handle the warning signal from now on (the agent starts torchrun, and so the ranks, with it
    ignored: a rank that never installs this keeps ignoring it)."""
    signal.signal(SIGNAL, lambda signum, _frame: _asked.append(signum))


def asked() -> bool:
    """Whether this rank received the warning signal."""
    return bool(_asked)


def agreed(device: torch.device) -> bool:
    """Whether any rank received the warning signal: every rank gets the same answer (a collective:
    every rank calls it at the same step)."""
    if not dist.is_initialized():
        return asked()
    flag = torch.tensor([1.0 if asked() else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


class Preempted(TrainerError):
    """Every rank stopped at an optimizer-step boundary for the warning signal; the checkpoint to
    continue from is written (exit ``PREEMPTED_EXIT``)."""

    exit_code = PREEMPTED_EXIT

    def __init__(
        self,
        epoch: int,
        batches: int,
        of: int,
        buffers: dict[int, list[int]] | None = None,
        rng: dict[str, Any] | None = None,
    ) -> None:
        self.epoch, self.batches, self.of = epoch, batches, of
        self.buffers = buffers or {}
        """This rank's mosaic buffers when the epoch began (what the resumed loader restores)."""
        self.rng = rng
        """This rank's generators when the epoch began (the resumed run loads the batches again from there)."""
        super().__init__(self.words())

    def words(self, where: str = LAST) -> str:
        at = (
            f"after epoch {self.epoch + 1}"
            if self.batches >= self.of
            else f"in epoch {self.epoch + 1} after batch {self.batches} of {self.of}"
        )
        return f"preempted (SIG{SIGNAL.name.removeprefix('SIG')}): checkpoint {where} {at}; --resume continues from it"


def resumed_batches(ckpt: dict[str, Any]) -> int:
    """The batches of the checkpoint's next epoch a preempted run had trained (0: it starts)."""
    return int((ckpt.get("trainer") or {}).get("preempted", {}).get("batches", 0))


def resume_note(epoch: int, batches: int) -> str:
    """What rank 0 says when it resumes a preempted run mid-epoch (`epoch` 0-based)."""
    return f"resuming mid-epoch: the first {batches} batches of epoch {epoch + 1} are loaded again, not trained"


def save(stop: Preempted, parts: Any, inp: Any, state: Any, out: Path) -> None:
    """Rank 0 writes the mid-epoch checkpoint (`stop.epoch` begun, `stop.batches` trained) as
    ``weights/last.pt``; every rank's generators and loader's mosaic buffers of the epoch's start (the
    resumed run loads the trained batches again from there) and its generators now (set once it has)
    go in it. Then a barrier: no rank exits before the file is there."""
    topo = inp.topo
    now = checkpoint.rng_state()
    mine = {"rng": stop.rng or now, "rng_now": now, "buffers": {k: list(v) for k, v in stop.buffers.items()}}
    ranks: list[Any] = [mine]
    if dist.is_initialized():
        ranks = [None] * topo.world_size if topo.is_main else []
        dist.gather_object(mine, ranks if topo.is_main else None, dst=0)
    if topo.is_main:
        stopper = {"best_fitness": parts.stopper.best_fitness, "best_epoch": parts.stopper.best_epoch}
        ckpt = checkpoint.build(
            epoch=stop.epoch - 1,  # the last finished one: the resume begins `stop.epoch` again
            best_fitness=state.best_fitness,
            stopper=stopper,
            model=parts.model,
            ema=parts.ema,
            optimizer=parts.optimizer,
            scaler=parts.scaler,
            train_args={**vars(parts.hyp), "save_dir": str(out.resolve())},
            metrics=dict(state.metrics),
            config=asdict(inp.cfg),
            ranks=ranks,
            half=state.half,
        )
        ckpt["trainer"]["preempted"] = {"epoch": stop.epoch, "batches": stop.batches}
        checkpoint.save_atomic(ckpt, out / LAST)
        say(stop.words(str(out / LAST)))
    if dist.is_initialized():
        dist.barrier()
