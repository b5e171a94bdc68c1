"""What orch and the trainer both rely on, written once: the trainer's flags that name files it
reads and folders it writes, where a run keeps its checkpoint, and the rule a global batch obeys.

Standard library only (no torch, no ultralytics), like ``trainer/logs.py``: orch imports it on the
controller through ``orchestrator/config/trainer.py`` (its preflight judges job arguments with
it, its retries look for the checkpoint), and the trainer itself refuses with the same rule.
"""

from __future__ import annotations

INPUT_FLAGS = ("weights", "data", "model", "cfg", "resume", "pretrained", "text_embeddings")
"""Settings (flags, ``key=value`` keys) whose value is a file the trainer reads: on every node the
same absolute path (``~/`` is that node's home)."""
OUTPUT_FLAGS = ("out", "project", "debug_dir")
"""Settings whose value is a folder the trainer writes: it need not exist, only be creatable."""
LAST = "weights/last.pt"
"""A run folder's checkpoint of its last finished epoch (what ``--resume`` continues from)."""
BEST = "weights/best.pt"
"""A run folder's checkpoint of its best validation fitness."""
AUTO = "auto"
"""``--resume auto``: continue this run's own ``weights/last.pt`` when it wrote one, else start it
over in the same directory. What ``orch up`` passes to a retry of the trainer: where the run
directory is, the trainer alone decides (``--out``, ``--project``, ``--name``, numbering)."""
DEFAULT_PROJECT = "runs/train"
"""The folder a run folder is made in when neither ``--out`` nor ``--project`` says where."""


def batch_choices(batch: int, world_size: int) -> tuple[int, ...]:
    """The global batches nearest `batch` that `world_size` ranks can share (one when batch is
    below world_size)."""
    lower = batch // world_size * world_size
    return tuple(b for b in dict.fromkeys((lower, lower + world_size)) if b > 0)


def batch_problem(batch: int, world_size: int) -> str | None:
    """Why a global batch of `batch` images cannot be split over `world_size` ranks, with the
    nearest batches that can and the other reading of the number (per GPU); None when it can.

    A batch here is global, ultralytics' meaning (``batch=``, yolov5's ``--batch-size``); a
    launcher script that means images per GPU needs the product."""
    if batch < 1 or batch % world_size == 0:
        return None
    near = " or ".join(str(b) for b in batch_choices(batch, world_size))
    return (f"global batch {batch} does not divide by world size {world_size} ({batch / world_size:.2f} images "
            f"per rank): use {near}; for {batch} images per GPU use {batch * world_size} (or --batch-per-device {batch})")
