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
PREEMPTED_EXIT = 75
"""Every rank's exit code when a warning signal (SIGUSR2: Slurm's `--signal` before a time limit or
a preemption) made the trainer write its checkpoint and stop (``trainer/preempt.py``): orch reads it
as "preempted", not as a failure of the job, and its retry continues with ``--resume auto``."""
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
    return (
        f"global batch {batch} does not divide by world size {world_size} ({batch / world_size:.2f} images "
        f"per rank): use {near}; for {batch} images per GPU use {batch * world_size} (or --batch-per-device {batch})"
    )


SMALL_RANK_BATCH = 4
"""Images per rank below which BatchNorm statistics from one rank's batch are too few to train on
(without SyncBatchNorm, each rank normalises over its own images only)."""


def small_batch_warning(
    batch: int, world_size: int, sync_bn: bool, cuda: bool = True, per_device: bool = False
) -> str | None:
    """The warning for a global batch that leaves each rank fewer than ``SMALL_RANK_BATCH`` images
    without SyncBatchNorm (a per-GPU number read as the global batch: ``--batch-size 32`` on 32
    GPUs is 1 image per GPU), with both fixes; None when it is not the case. ``cuda``: whether
    ``--sync-bn`` is a fix (torch's SyncBatchNorm needs CUDA); ``per_device``: the batch came from
    ``--batch-per-device`` (so it was not a per-GPU number misread)."""
    per_rank = batch // world_size if world_size > 0 else batch
    if world_size < 2 or sync_bn or batch < 1 or per_rank >= SMALL_RANK_BATCH:
        return None
    meant = "" if per_device else f" (--batch-per-device {batch}: {batch} per GPU, global {batch * world_size})"
    fixes = f"--batch-per-device N for N images per GPU, N >= {SMALL_RANK_BATCH}{meant}"
    if cuda:
        fixes += f", or --sync-bn (BatchNorm statistics over the {batch} images of all {world_size} ranks)"
    return (
        f"warning: global batch {batch} on {world_size} ranks is {per_rank} image(s) per rank without SyncBN: "
        f"each GPU's BatchNorm normalises over {per_rank} image(s) (--batch is global); use {fixes}"
    )


SAME_SETTING = {"batch_size": "batch", "lr0": "lr", "gradient_accumulation": "accumulate"}
"""Second spellings of one setting (flags `--batch-size`, `--lr0`, `--gradient-accumulation`;
ultralytics' `lr0=`), by the name with dashes as underscores: `--batch`, `--batch-size` and
`batch=` are one setting. `trainer/config.py`'s ALIASES and `trainer/settings.py`'s
FIELD_OF_SETTING define them; a test holds this table to both."""
ONE_OF = (frozenset({"batch", "batch_per_device"}),)
"""Settings that set one thing two ways, which the trainer refuses together (`--batch` and
`--batch-per-device` both set the batch): one given replaces the others."""
MODEL_NAME = re.compile(r"^(yolo|yoloe|yolov|rtdetr)[\w.-]*\.ya?ml$")
"""A model YAML that ultralytics ships, by its bare name (`yolo12s.yaml`, `yoloe-v8l-seg.yaml`):
what `--cfg NAME` means when no file of that name is there (`--cfg` then is `--model`)."""


def cfg_setting(value: str) -> str:
    """The setting `--cfg VALUE` (or `cfg=VALUE`) gives: `KEY=VALUE` -> KEY's setting, a shipped
    model's name -> `model`, anything else (a settings YAML) -> `cfg`."""
    key, eq, raw = value.partition("=")
    if eq and key.strip():
        return value_setting(SAME_SETTING.get(key.strip(), key.strip()), raw.strip())
    return "model" if MODEL_NAME.match(value) else "cfg"


def value_setting(name: str, value: object) -> str:
    """The setting a flag (or key) `name` with `value` sets: `--cfg` per `cfg_setting`, a
    `--model`/`model=` that names a checkpoint (`.pt`) is the weights (the trainer's rule)."""
    if name == "cfg" and isinstance(value, str):
        return cfg_setting(value)
    if name == "model" and isinstance(value, str) and value.endswith(".pt"):
        return "weights"
    return name


def replaced(name: str) -> frozenset[str]:
    """Every setting that `name`, given on the command line, replaces: itself and those of `ONE_OF`."""
    return next((group for group in ONE_OF if name in group), frozenset({name}))


def is_builtin_model(name: str, value: str) -> bool:
    """`model: yolo12m.yaml` / `cfg: yoloe-v8l-seg.yaml` name a model config shipped with
    ultralytics, not a file: no node's copy to check, never "a relative path"."""
    if "/" in value:
        return False
    return value.endswith((".yaml", ".yml")) if name == "model" else name == "cfg" and bool(MODEL_NAME.match(value))


def file_setting(name: str, value: str) -> bool:
    """Whether a setting's value names a file the trainer reads (INPUT_FLAGS), as opposed to a
    shipped model's name or `--cfg KEY=VALUE`."""
    if name == "cfg" and "=" in value:
        return False
    return name in INPUT_FLAGS and not is_builtin_model(name, value)


OFF_WORD = {
    "amp": "off",
    "sync_bn": "false",
    "cos_lr": "false",
    "pin_memory": "false",
    "persistent_workers": "false",
    "deterministic": "false",
    "exist_ok": "false",
    "plots": "false",
    "cache": "false",
    "multi_scale": "0",
    "freeze": "none",
}
"""The word after a flag (dashes as underscores) that turns its setting off (`--amp off`,
`--plots false`): how an inventory's `amp: false` reaches the trainer. A flag not listed has no
off (`--resume`, `--epochs`): `false` there is refused, `null` leaves the flag out. A test holds
the table to the trainer's parser (each word parses to off; every boolean flag is listed)."""


def setting_name(word: str) -> str | None:
    """The setting a command-line word starts (`--batch-size` / `--batch=64` / `batch=64` ->
    `batch`), or None for a word that starts none (a value, `detect`, `train`)."""
    if word.startswith("--") and len(word) > 2:
        name = word[2:].split("=", 1)[0].replace("-", "_")
    elif "=" in word and not word.startswith("-") and word.split("=", 1)[0].isidentifier():
        name = word.split("=", 1)[0]
    else:
        return None
    return SAME_SETTING.get(name, name)


def setting_value(words: list[str]) -> str | bool:
    """The value of one setting's words from `settings_of` (`--batch 8`, `--batch=8`, `batch=8`:
    `8`; a bare `--amp`: True)."""
    if "=" in words[0]:
        return words[0].split("=", 1)[1]
    return words[1] if len(words) > 1 else True


def settings_of(words: list[str] | tuple[str, ...]) -> list[tuple[str | None, list[str]]]:
    """The words cut into settings: `(name, words)` for each flag with its value (a flag takes
    the next word unless that word starts a setting itself, so `--amp --batch 8` is two; `--cfg`
    always takes it, `--cfg mosaic=0` is one) and
    each `key=value`, named by what they set (`--cfg yolo12s.yaml` is `model`, `--cfg lr0=0.1`
    `lr`, `--model x.pt` `weights`: `value_setting`); `(None, [word])` for a word that belongs
    to none."""
    out: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(words):
        word = words[i]
        name = setting_name(word)
        takes = (
            name is not None
            and word.startswith("--")
            and "=" not in word
            and i + 1 < len(words)
            and (
                name == "cfg"
                and not words[i + 1].startswith("-")  # --cfg KEY=VALUE: one setting
                or setting_name(words[i + 1]) is None
                and words[i + 1] not in ("detect", "segment", "train")
            )
        )
        ws = list(words[i : i + 2]) if takes else [word]
        out.append((value_setting(name, setting_value(ws)) if name is not None else None, ws))
        i += 2 if takes else 1
    return out


def override_args(base: tuple[str, ...], extra: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """`base` (the inventory's job args) with `extra` (the command line's) after them, where a
    setting `extra` gives replaces every spelling of it in `base` (and the settings of `ONE_OF`
    that set the same thing): the command line wins, as argparse's last value does, and the
    trainer, which refuses one setting given twice with two values, sees it once."""
    gone = {other for name, _ in settings_of(list(extra)) if name is not None for other in replaced(name)}
    kept = [w for name, ws in settings_of(list(base)) if name not in gone for w in ws]
    return (*kept, *extra)


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
