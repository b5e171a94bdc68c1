"""What orch and the trainer both rely on, written once: the trainer's flags that name files it
reads and folders it writes, where a run keeps its checkpoint, and the rule a global batch obeys.

Standard library only (no torch, no ultralytics), like ``trainer/logs.py``: orch imports it on the
controller through ``orchestrator/config/trainer.py`` (its preflight judges job arguments with
it, its retries look for the checkpoint), and the trainer itself refuses with the same rule.
"""

from __future__ import annotations

import re
from typing import Any

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
DEFAULT_PROJECT = "runs"
"""Where run folders go when ``--project`` is not absolute (ultralytics 8.4's ``get_save_dir``):
``runs/<task>/<project>/<name>``, e.g. ``runs/detect/train``, ``runs/segment/train2``; an absolute
``--project`` holds ``<name>`` itself."""
DEFAULT_NAME = "train"
"""The run folder's name when ``--name`` is not given (ultralytics': the mode), numbered
``train2``, ``train3``... when it exists."""


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


def parse_device(value: Any) -> str:
    """``0`` / ``0,1,2,3`` / ``cuda:0,1`` / ``[0, 1]`` / cpu / cuda / auto → ``cuda:0,1`` / cpu / cuda / auto.

    The trainer's ``--device`` (and ``device=``); orch's `gpus` check reads the indices with it too
    (they count the GPUs CUDA_VISIBLE_DEVICES leaves visible, from 0).

    Raises:
        ValueError: not a device, or a GPU listed twice.
    """
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    text = str(value).strip().lower().replace(" ", "")
    if text in ("", "none", "auto", "-1"):
        return "auto"
    if text in ("cpu", "cuda"):
        return text
    ids = text.removeprefix("cuda:").strip("[]")
    if not re.fullmatch(r"\d+(,\d+)*", ids):
        raise ValueError(f"expected auto, cpu, cuda or GPU indices like 0,1,2,3, got {value!r}")
    numbers = [int(x) for x in ids.split(",")]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"GPU {max(numbers, key=numbers.count)} is listed twice in {value!r}")
    return "cuda:" + ",".join(map(str, numbers))
