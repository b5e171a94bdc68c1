"""Host syncs per training step of ``python -m trainer``, under ``torch.cuda.set_sync_debug_mode("warn")``.

Runs the trainer in this process (one rank, plain ``python``) with two wrappers around its loop:
while ``trainer.loop.train_epoch`` runs, and only then, CUDA's sync debug mode is ``warn`` and
every warning it raises is recorded with the Python line that made the synchronizing call
(setup, validation and checkpoints are outside the window: they may read the device freely); and
each micro-step is counted where the loop hands a batch to ``trainer.loop.preprocess``. The
trainer itself is unchanged: nothing of this is in its hot path, here or anywhere else.

Usage: ``python -m bench.gpu_syncs --json OUT.json -- TRAINER ARGS...`` (the trainer's own flags,
e.g. ``--model yolo12n.yaml --data /d/data.yaml --epochs 1 --batch 64 --imgsz 320 --device 0``);
writes ``{"cuda", "micro_steps", "optimizer_steps", "syncs", "per_micro_step", "per_step",
"sites": [{"site", "code", "count"}], "exit_code"}``. Without CUDA the mode has nothing to watch:
``cuda`` is false and only the steps are counted. Part of ``bench/gpu_smoke.py`` (its step 3).
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[1]
SYNC_WARNING = "synchroniz"
"""What torch's sync-debug warning says: ``called a synchronizing CUDA operation``."""


class SyncRecorder:
    """Counts micro-steps and the sync warnings raised while a training epoch runs."""

    def __init__(self) -> None:
        self.in_epoch = False
        self.micro_steps = 0
        self.optimizer_steps = 0
        self.per_step: Counter[int] = Counter()
        """Syncs by micro-step index (0: before the first batch reached preprocess)."""
        self.sites: Counter[str] = Counter()
        self.code: dict[str, str] = {}

    def warning(self, message: Warning | str, category: type[Warning], filename: str, lineno: int) -> None:
        """A warning seen inside the window: counted when it is the sync-debug one."""
        if SYNC_WARNING not in str(message):
            return
        site = f"{short_path(filename)}:{lineno}"
        self.sites[site] += 1
        self.per_step[self.micro_steps] += 1
        if site not in self.code:
            self.code[site] = linecache.getline(filename, lineno).strip()

    def showwarning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        """``warnings.showwarning``'s signature: what the window installs."""
        self.warning(message, category, filename, lineno)

    def report(self, cuda: bool, exit_code: int | None) -> dict[str, Any]:
        syncs = sum(self.sites.values())
        return {
            "cuda": cuda,
            "micro_steps": self.micro_steps,
            "optimizer_steps": self.optimizer_steps,
            "syncs": syncs,
            "per_micro_step": syncs / self.micro_steps if self.micro_steps else None,
            "per_step": [self.per_step.get(i, 0) for i in range(self.micro_steps + 1)],
            "sites": [{"site": s, "code": self.code.get(s, ""), "count": n} for s, n in self.sites.most_common()],
            "exit_code": exit_code,
        }


def short_path(filename: str) -> str:
    """A source path from the repository or below ``site-packages``, as people read it."""
    p = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1]
    repo = str(REPO).replace("\\", "/") + "/"
    return p[len(repo) :] if p.startswith(repo) else p


def install(recorder: SyncRecorder, cuda: bool) -> None:
    """Wrap the loop's epoch, micro-step and optimizer step (module attributes: the loop looks them
    up at each call)."""
    import torch

    import trainer.loop as loop

    real_epoch: Callable[..., Any] = loop.train_epoch
    real_preprocess: Callable[..., Any] = loop.preprocess
    real_step: Callable[..., Any] = loop.optimizer_step

    def train_epoch(*args: Any, **kwargs: Any) -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # every call, not once per line
            warnings.showwarning = recorder.showwarning
            recorder.in_epoch = True
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                return real_epoch(*args, **kwargs)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
                recorder.in_epoch = False

    def preprocess(*args: Any, **kwargs: Any) -> Any:
        if recorder.in_epoch:
            recorder.micro_steps += 1
        return real_preprocess(*args, **kwargs)

    def optimizer_step(*args: Any, **kwargs: Any) -> Any:
        if recorder.in_epoch:
            recorder.optimizer_steps += 1
        return real_step(*args, **kwargs)

    loop.train_epoch = train_epoch
    loop.preprocess = preprocess
    loop.optimizer_step = optimizer_step


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.gpu_syncs",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m bench.gpu_syncs --json /tmp/syncs.json -- --model "
        "yolo12n.yaml --data /tmp/ds/data.yaml --epochs 1 --batch 64 --device 0",
    )
    ap.add_argument("--json", required=True, type=Path, help="where to write the counts")
    ap.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the trainer's arguments")
    a = ap.parse_args(argv)
    args = a.trainer_args[1:] if a.trainer_args[:1] == ["--"] else a.trainer_args
    sys.path.insert(0, str(REPO))
    import torch

    cuda = torch.cuda.is_available()
    recorder = SyncRecorder()
    install(recorder, cuda)
    from trainer.train import main as train

    code: int | None = None  # None in the JSON: the trainer raised (its traceback follows)
    try:
        train(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        a.json.write_text(json.dumps(recorder.report(cuda, code), indent=1) + "\n")
    return code or 0


if __name__ == "__main__":
    raise SystemExit(main())
