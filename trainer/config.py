"""Command line → ``TrainConfig``: every flag, its default, and the checks that need no I/O.

Three spellings reach the same settings, and a setting given twice with different values is
refused, never silently resolved:

- this trainer's flags (``--epochs 100 --batch 256``), including those the field guides use
  (``--batch-size``, ``--gradient-accumulation``, bare ``--amp``, ``--device 0,1,2,3``,
  ``--cfg yoloe-v8l-seg.yaml``);
- ultralytics' ``key=value`` arguments as pasted from ``yolo train`` (``epochs=100 lr0=0.01``);
- ``--cfg key=value`` (or ``--cfg settings.yaml``, like ``yolo cfg=``).

Every ultralytics setting is either honoured (it changes what the loop, the data pipeline, the
loss or the validator do) or refused with the reason: none is accepted and ignored.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import TrainerError

EXAMPLES = """\
examples:
  # one process, CPU or one GPU
  python -m trainer --model yolo12n.yaml --data /data/coco8/data.yaml --epochs 3 --batch 16 --imgsz 320

  # 2 nodes x 8 GPUs, global batch 256 (16 per GPU), started by torchrun on every node
  torchrun --nnodes 2 --nproc-per-node 8 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 \\
      -m trainer --model yolo12m.yaml --data /mnt/nfs/coco/data.yaml --batch 256 --epochs 100 --out /mnt/nfs/runs/y12m

  # fine-tune a checkpoint: its architecture and task (detect, segment, YOLOE) come with it
  torchrun --nproc-per-node 4 -m trainer --weights /models/yolo12s-seg.pt --data /data/mine/data.yaml \\
      --device 0,1,2,3 --batch-size 64 --amp --sync-bn --gradient-accumulation 2 --cos-lr --close-mosaic 5

  # the same settings as ultralytics' `yolo train` arguments
  torchrun --nproc-per-node 4 -m trainer model=/models/yolo12s-seg.pt data=/data/mine/data.yaml batch=64 cos_lr=True

  # YOLOE linear probing from a checkpoint, text prompts from a precomputed file
  python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt   # once, where the text model is
  torchrun --nproc-per-node 8 -m trainer --weights /models/yoloe-11s-seg.pt \\
      --data /data/mine/data.yaml --text-embeddings /data/mine/text_pe.pt --prompt-mode linear

  # continue a run that stopped (same command plus --resume)
  torchrun ... -m trainer ... --out /mnt/nfs/runs/y12m --resume
"""

FIELD_OF_SETTING = {
    "model": "model", "data": "data", "epochs": "epochs", "batch": "batch", "imgsz": "imgsz", "lr0": "lr",
    "lrf": "lrf", "momentum": "momentum", "weight_decay": "weight_decay", "warmup_epochs": "warmup_epochs",
    "workers": "workers", "seed": "seed", "device": "device", "amp": "amp", "cos_lr": "cos_lr",
    "close_mosaic": "close_mosaic", "optimizer": "optimizer", "patience": "patience", "cache": "cache",
    "fraction": "fraction", "freeze": "freeze", "multi_scale": "multi_scale", "nbs": "nbs", "project": "project",
    "name": "name", "exist_ok": "exist_ok", "save_period": "save_period", "resume": "resume", "val": "val",
    "deterministic": "deterministic", "channels_last": "channels_last", "cls_remap": "cls_remap",
    "pretrained": "pretrained", "task": "task", "mode": "mode",
}
"""ultralytics settings that map to a field of ``TrainConfig`` (lr0 is ``--lr``)."""

HYP_SETTINGS = frozenset({
    "hsv_h", "hsv_s", "hsv_v", "degrees", "translate", "scale", "shear", "perspective", "flipud", "fliplr", "bgr",
    "mosaic", "mixup", "cutmix", "copy_paste", "copy_paste_mode",  # the training augmentation
    "box", "cls", "dfl",  # loss gains
    "warmup_momentum", "warmup_bias_lr",  # the warmup
    "overlap_mask", "mask_ratio",  # segmentation targets
    "conf", "iou", "max_det",  # the validator
})
"""ultralytics settings passed through to its own dataset, loss and validator, which honour them."""

NEUTRAL_SETTINGS: dict[str, tuple[Any, ...] | None] = {
    "save": (True,), "plots": (False,), "verbose": None, "rect": (False,), "single_cls": (False,),
    "dropout": (0.0,), "cls_pw": (0.0,), "compile": (False,), "time": (None,), "split": ("val",),
    "quantize": (None,), "profile": (False,), "distill_model": (None,), "save_json": (False,), "save_txt": (False,),
    "classes": (None,), "dis": (6.0,), "pose": (12.0,), "kobj": (1.0,), "rle": (1.0,), "angle": (1.0,),
    "dlog": (1.0,), "dgrad": (0.5,), "dlam": (1.0,), "auto_augment": ("randaugment",), "erasing": (0.4,),
}
"""Settings accepted only at the value this trainer implements (None: any value, it changes no result)."""

OPTIMIZERS = ("auto", "SGD", "AdamW", "Adam", "Adamax", "NAdam", "RAdam", "RMSProp", "MuSGD")


@cache
def ultralytics_defaults() -> dict[str, Any]:
    """ultralytics' default settings, read from its cfg/default.yaml without importing it (fast)."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        raise TrainerError("ultralytics is not installed (pip install -e '.[trainer]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "cfg" / "default.yaml"
    return dict(yaml.safe_load(path.read_text()))


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; built from the command line by ``parse_config``.

    Defaults are ultralytics' own (``yolo train``'s), so the same command trains the same way.
    """

    model: str | None = None
    """Architecture YAML, scale in the name (yolo12s.yaml, yoloe-v8l-seg.yaml); None: the checkpoint's, else yolo12n.yaml."""
    weights: str | None = None
    """Checkpoint (.pt) to start from; its architecture and task are trained unless ``model`` names the same one."""
    data: str = ""
    """Absolute path of a YOLO-format data YAML with ``train``, ``val`` and non-empty ``names``."""
    epochs: int = 100
    """Number of passes over the training set."""
    batch: int = 16
    """Global batch: images per micro-step over all ranks; must divide by WORLD_SIZE."""
    imgsz: int = 640
    """Square training and validation image size in pixels (multiple of 32)."""
    lr: float | None = None
    """Initial learning rate, ultralytics' lr0; None: 0.01, or what ``optimizer=auto`` picks."""
    lrf: float = 0.01
    """Final learning rate as a fraction of the initial one."""
    momentum: float | None = None
    """SGD momentum / Adam beta1; None: 0.937, or what ``optimizer=auto`` picks."""
    weight_decay: float = 5e-4
    """Weight decay of conv/linear weights at the nominal batch (scaled by batch x accumulate / nbs)."""
    warmup_epochs: float = 3.0
    """Epochs of warmup of learning rate, momentum and accumulation (fractions allowed)."""
    accumulate: int | None = None
    """Micro-steps per optimizer step; None: round(nbs / batch), as ultralytics."""
    nbs: int = 64
    """Nominal batch size: the default accumulation reaches it, weight decay is scaled to it."""
    clip: float = 10.0
    """Max gradient norm (0 disables clipping)."""
    optimizer: str = "auto"
    """SGD, AdamW, ... or auto (ultralytics' rule: AdamW with a rate fitted to the class count, MuSGD for long runs)."""
    cos_lr: bool = False
    """Cosine learning-rate decay instead of linear."""
    close_mosaic: int = 10
    """Turn mosaic off for the last N epochs (0: never)."""
    patience: int = 100
    """Stop after N epochs without a better validation fitness."""
    amp: str = "auto"
    """Mixed precision: auto (fp16 on CUDA, off on CPU), on (fp16, CUDA only), off, fp16, bf16."""
    sync_bn: bool = False
    """Convert BatchNorm to SyncBatchNorm (CUDA, several ranks; helps at <= 8 images per GPU)."""
    device: str = "auto"
    """auto, cpu, cuda, or a list of local GPU indices (0,1,2,3): one per process of the node."""
    workers: int = 8
    """Data loader worker processes per rank (at most the node's CPUs / its ranks)."""
    pin_memory: bool = True
    """Page-locked host memory for the batches (CUDA only)."""
    persistent_workers: bool = True
    """Keep the loader workers between epochs."""
    cache: str | None = None
    """Cache decoded images: ram or disk (ultralytics' cache)."""
    fraction: float = 1.0
    """Train on this fraction of the training images."""
    freeze: int | tuple[int | str, ...] | None = None
    """Freeze the first N layers, or these layer indices / module names (BatchNorm there stays in eval mode)."""
    multi_scale: float = 0.0
    """Vary the training image size per batch by +/- this fraction of imgsz."""
    seed: int = 0
    """Seed of model init, sampler order and augmentation."""
    deterministic: bool = True
    """Deterministic algorithms where torch has them (ultralytics' default)."""
    channels_last: bool | None = None
    """NHWC memory format on CUDA; None: on for CUDA."""
    cls_remap: bool = True
    """When fine-tuning, match the checkpoint's class rows to the data's classes by name."""
    out: str | None = None
    """Run directory given with --out (used as is); None: PROJECT/NAME, numbered if it exists."""
    project: str = "runs/train"
    """Parent of the run directory when ``out`` is not given."""
    name: str = "exp"
    """Run directory name under ``project`` (the orch run id when started by orch up)."""
    exist_ok: bool = False
    """Reuse PROJECT/NAME instead of numbering a new one (exp2, exp3...)."""
    save_period: int = 0
    """Also keep weights/epoch{N}.pt every N epochs (0: never)."""
    val_period: int = 1
    """Validate every N epochs (and always after the last one); 0 disables validation."""
    resume: str | None = None
    """Checkpoint to continue from ('' means the run directory's weights/last.pt)."""
    text_embeddings: str | None = None
    """YOLOE: file mapping class name → text embedding (from ``python -m trainer.embed``)."""
    prompt_mode: str = "linear"
    """YOLOE: linear (only the prompt convs train, like train_pe) or full (everything, like train_pe_all)."""
    task: str | None = None
    """Task the user asserted (task=segment); checked against the model's."""
    log_every: int = 10
    """Rank 0 prints one progress line every N optimizer steps."""
    ref_ips: float | None = None
    """Single-rank images/s to report scaling efficiency against."""
    timeout_min: float = 30.0
    """Minutes a collective may wait before the process group gives up (a lost node ends the job)."""
    debug_dir: str | None = None
    """Testing aid: each rank writes rank{R}.json (samples seen per epoch, parameter checksum)."""
    debug_exit_after: int = 0
    """Testing aid: exit abruptly (code 3) after saving this epoch, as if the job were killed."""
    hyp: dict[str, Any] = field(default_factory=dict)
    """ultralytics settings for its dataset, loss and validator (augmentation, loss gains...)."""
    notes: tuple[str, ...] = ()
    """Decisions taken from the command line that the start-up line explains."""

    @property
    def device_ids(self) -> tuple[int, ...] | None:
        """The GPU indices of ``--device 0,1,2,3`` (None for auto, cpu, cuda)."""
        if not self.device.startswith("cuda:"):
            return None
        return tuple(int(x) for x in self.device[5:].split(","))


# --- values ------------------------------------------------------------------------------------------

def parse_bool(text: str | bool) -> bool:
    """``true``/``false`` and friends (what ``--flag VALUE`` and ``key=value`` accept)."""
    if isinstance(text, bool):
        return text
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "on", "y"):
        return True
    if low in ("0", "false", "no", "off", "n"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_device(value: Any) -> str:
    """``0`` / ``0,1,2,3`` / ``cuda:0,1`` / ``[0, 1]`` / cpu / cuda / auto → ``cuda:0,1`` / cpu / cuda / auto."""
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


def parse_amp(value: Any, from_flag: bool) -> str:
    """Precision from ``--amp [MODE]`` or ``amp=``.

    A bare ``--amp`` (or ``--amp true``) asks for mixed precision: ``on``. ultralytics' ``amp=True``
    is its default, "mixed precision where the device supports it": ``auto``.
    """
    if isinstance(value, bool) or str(value).lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        on = parse_bool(value)
        return ("on" if from_flag else "auto") if on else "off"
    text = str(value).lower()
    if text == "fp32":
        return "off"
    if text in ("auto", "fp16", "bf16"):
        return text
    raise ValueError(f"expected on, off, auto, fp16 or bf16, got {value!r}")


def parse_freeze(value: Any) -> int | tuple[int | str, ...] | None:
    """``10`` (the first ten layers), ``0,1,2`` / ``[0, 1, 2]`` / ``[23.cv2]`` (these layers) or none."""
    if value is None or value == "" or str(value).lower() == "none":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip("[] ")
        if text.isdigit():
            return int(text)
        value = [v.strip() for v in text.split(",") if v.strip()]
    if isinstance(value, (list, tuple)):
        return tuple(int(v) if str(v).isdigit() else str(v) for v in value)
    raise ValueError(f"expected a number of layers or a list of layers, got {value!r}")


def parse_cache(value: Any) -> str | None:
    """``ram`` / ``disk`` / ``true`` (ram) / ``false`` (none)."""
    if value is None:
        return None
    text = str(value).lower()
    if text in ("ram", "disk"):
        return text
    return "ram" if parse_bool(value) else None


def _yaml_value(text: str) -> Any:
    """A ``key=value`` value as ultralytics reads it (numbers, booleans, lists, None)."""
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


# --- the parser ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The ``python -m trainer`` argument parser; ``--help`` shows every flag and examples."""
    d = TrainConfig()
    p = argparse.ArgumentParser(
        prog="python -m trainer",
        description="DDP training of ultralytics YOLO12 / YOLOE models; run it under torchrun on every node. "
                    "Defaults are ultralytics' (yolo train); its key=value arguments are accepted too.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument
    a("settings", nargs="*", metavar="KEY=VALUE", help="ultralytics settings as `yolo train` takes them, e.g. epochs=100 lr0=0.01 cos_lr=True")
    a("--model", help="architecture YAML, scale in the name, e.g. yolo12s.yaml, yoloe-v8l-seg.yaml (default: the --weights "
                      "checkpoint's architecture, else yolo12n.yaml); a .pt file means --weights")
    a("--weights", help="absolute path of a .pt checkpoint to start from; its architecture and task (detect, segment, YOLOE) "
                        "are trained, e.g. /models/yoloe-v8l-seg.pt")
    a("--data", help="absolute path of the data YAML (train, val, names), e.g. /data/coco/data.yaml (required)")
    a("--epochs", type=int, help=f"training epochs (default {d.epochs})")
    a("--batch", type=int, help=f"global batch over all ranks, divisible by WORLD_SIZE, e.g. 256 on 16 GPUs (default {d.batch})")
    a("--batch-size", type=int, help="the same as --batch: global over all ranks, as yolov5's --batch-size and ultralytics' "
                                     "batch= (for 32 per GPU on 8 GPUs pass 256)")
    a("--imgsz", type=int, help=f"image size, e.g. 640 (default {d.imgsz})")
    a("--lr", type=float, help="initial learning rate, ultralytics' lr0, e.g. 0.01 (default: chosen by --optimizer auto; "
                               "giving it selects SGD). With SGD the step already grows with the global batch, as in "
                               "ultralytics: do not multiply it by the GPU count")
    a("--lr0", type=float, help="the same as --lr")
    a("--lrf", type=float, help=f"final lr as a fraction of the initial one, e.g. 0.01 (default {d.lrf})")
    a("--momentum", type=float, help="SGD momentum / Adam beta1 (default 0.937, or auto's 0.9)")
    a("--weight-decay", type=float, help=f"weight decay at the nominal batch (default {d.weight_decay})")
    a("--warmup-epochs", type=float, help=f"warmup epochs, e.g. 1.5 (default {d.warmup_epochs:g})")
    a("--accumulate", type=int, help="micro-steps per optimizer step, e.g. 2 (default round(nbs / batch), as ultralytics)")
    a("--gradient-accumulation", type=int, help="the same as --accumulate")
    a("--optimizer", help=f"one of {', '.join(OPTIMIZERS)} (default auto: ultralytics' rule)")
    a("--cos-lr", nargs="?", const=True, type=parse_bool, metavar="BOOL", help="cosine learning-rate decay instead of linear")
    a("--close-mosaic", type=int, help=f"turn mosaic off for the last N epochs, 0 = never (default {d.close_mosaic})")
    a("--patience", type=int, help=f"stop after N epochs without a better mAP50-95 (default {d.patience})")
    a("--clip", type=float, help=f"max gradient norm, 0 = off (default {d.clip:g})")
    a("--amp", nargs="?", const="on", metavar="MODE", help="mixed precision: bare --amp = on (fp16, CUDA only); off, bf16, "
                                                           "auto = fp16 on CUDA and off on CPU (default auto)")
    a("--sync-bn", action="store_true", help="SyncBatchNorm across ranks (CUDA), e.g. for <= 8 images per GPU")
    a("--device", help="auto (cuda:LOCAL_RANK if CUDA is there), cpu, cuda, or this node's GPU indices, one per "
                       "process, e.g. 0,1,2,3 with --nproc-per-node 4 (default auto)")
    a("--workers", type=int, help=f"data loader workers per rank, at most the CPUs / local ranks, e.g. 8 (default {d.workers})")
    a("--pin-memory", nargs="?", const=True, type=parse_bool, metavar="BOOL", help="page-locked batches on CUDA (default on)")
    a("--persistent-workers", nargs="?", const=True, type=parse_bool, metavar="BOOL",
      help="keep loader workers between epochs (default on)")
    a("--cache", nargs="?", const="ram", metavar="WHERE", help="cache decoded images: ram (bare --cache) or disk")
    a("--fraction", type=float, help="train on this fraction of the training images, e.g. 0.1 (default 1.0)")
    a("--freeze", help="freeze the first N layers, or these layers: e.g. 10, or 0,1,2 (their BatchNorm stays in eval mode)")
    a("--multi-scale", nargs="?", const=0.5, type=float, metavar="FRACTION",
      help="vary the image size per batch by +/- FRACTION of imgsz (bare: 0.5; default 0 = off)")
    a("--nbs", type=int, help=f"nominal batch size for the default accumulation and weight decay (default {d.nbs})")
    a("--seed", type=int, help=f"random seed, same on all ranks (default {d.seed})")
    a("--deterministic", nargs="?", const=True, type=parse_bool, metavar="BOOL",
      help="deterministic algorithms where torch has them (default true, as ultralytics)")
    a("--out", help="run directory, used as is, e.g. /mnt/nfs/runs/y12m (default PROJECT/NAME, numbered if it exists)")
    a("--project", help=f"parent of the run directory when --out is not given (default {d.project})")
    a("--name", help="run directory name under --project (default: the orch run id when started by orch up, "
                     "else exp; exp2, exp3... when it exists)")
    a("--exist-ok", nargs="?", const=True, type=parse_bool, metavar="BOOL", help="reuse PROJECT/NAME instead of numbering a new one")
    a("--save-period", type=int, help="also keep weights/epochN.pt every N epochs, e.g. 10 (default 0 = never)")
    a("--val-period", type=int, help="validate every N epochs and after the last, 0 = never (default 1)")
    a("--resume", nargs="?", const="", default=None, metavar="PATH",
      help="continue from PATH, or from the run directory's weights/last.pt (the latest run under --project without --out)")
    a("--text-embeddings", help="YOLOE: absolute path of the class-name -> vector file from `python -m trainer.embed`")
    a("--prompt-mode", choices=["linear", "full"], help="YOLOE: linear = train the class-prompt convs only, full = train "
                                                        "everything (default linear)")
    a("--log-every", type=int, help=f"rank 0 prints a progress line every N optimizer steps, e.g. 50 (default {d.log_every})")
    a("--ref-ips", type=float, help="single-rank images/s for the scaling-efficiency column, e.g. 95.5")
    a("--cfg", action="append", default=[], metavar="KEY=VALUE|FILE",
      help="an ultralytics setting (repeatable), e.g. --cfg mosaic=0; a settings YAML (like yolo cfg=); or a model YAML "
           "(--cfg yoloe-v8l-seg.yaml means --model)")
    a("--timeout-min", type=float, help=f"collective timeout in minutes (default {d.timeout_min:g})")
    a("--debug-dir", help="testing: each rank writes DIR/rank{R}.json with samples seen and a parameter checksum")
    a("--debug-exit-after", type=int, metavar="EPOCH", help="testing: exit with code 3 right after saving EPOCH, as if killed")
    return p


FLAG_FIELD = {"batch_size": "batch", "lr0": "lr", "gradient_accumulation": "accumulate", "val_period": "val_period"}
"""Flag destinations that are another flag's field (aliases); every other destination is the field itself."""
_NOT_FIELDS = ("settings", "cfg")


def split_settings(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``key=value`` words from the flags, so an optional-value flag (bare ``--amp``)
    never swallows the setting that follows it."""
    takes_value = {s for act in parser._actions if act.option_strings and act.nargs is None
                   and not isinstance(act, (argparse._StoreTrueAction, argparse._HelpAction)) for s in act.option_strings}
    flags: list[str] = []
    settings: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in takes_value and i + 1 < len(argv):
            flags += [word, argv[i + 1]]
            i += 2
            continue
        if not word.startswith("-") and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word):
            settings.append(word)
        else:
            flags.append(word)
        i += 1
    return flags, settings


class _Given:
    """Settings collected from flags and key=value words, each with where it came from."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def put(self, name: str, value: Any, source: str) -> None:
        if name in self.values and self.values[name] != value:
            raise TrainerError(f"{name.replace('_', '-')} is given twice with different values: "
                               f"{self.sources[name]} and {source}")
        self.values[name] = value
        self.sources.setdefault(name, source)


def _is_model_yaml(path: str) -> bool:
    """Whether ``--cfg FILE`` names an architecture (a model YAML) rather than settings."""
    file = Path(path)
    if file.is_file():
        doc = yaml.safe_load(file.read_text())
        return isinstance(doc, dict) and "backbone" in doc and "head" in doc
    return bool(re.match(r"^(yolo|yoloe|yolov|rtdetr)[\w.-]*\.ya?ml$", file.name)) and file.name == path


def _put_setting(given: _Given, key: str, raw: Any, source: str, hyp: dict[str, Any]) -> None:
    """One ultralytics setting: into a config field, into ``hyp``, or refused with the reason."""
    defaults = ultralytics_defaults()
    if key == "cfg":
        _put_cfg_value(given, str(raw), source, hyp)
        return
    if key not in defaults:
        raise TrainerError(f"{source}: unknown ultralytics setting {key!r}")
    try:
        if key in FIELD_OF_SETTING:
            _put_field_setting(given, key, raw, source)
        elif key in HYP_SETTINGS:
            if key in hyp and hyp[key] != raw:
                raise TrainerError(f"{key} is given twice with different values ({hyp[key]!r} and {raw!r})")
            hyp[key] = raw
        elif key in NEUTRAL_SETTINGS:
            allowed = NEUTRAL_SETTINGS[key]
            if allowed is not None and raw not in allowed:
                raise TrainerError(f"{source}: {key}={raw!r} is not honoured by this trainer (it trains with "
                                   f"{key}={allowed[0]!r}); drop it")
        else:
            raise TrainerError(f"{source}: {key} is not a training setting this trainer honours; drop it")
    except ValueError as e:
        raise TrainerError(f"{source}: {e}") from None


def _put_field_setting(given: _Given, key: str, raw: Any, source: str) -> None:
    """A setting that maps onto a ``TrainConfig`` field, converted to the field's type."""
    name = FIELD_OF_SETTING[key]
    if key == "model" and str(raw).endswith(".pt"):
        given.put("weights", str(raw), source)
    elif key == "pretrained":
        if isinstance(raw, str) and raw.lower() not in ("true", "false"):
            given.put("weights", raw, source)
        elif not parse_bool(raw):
            given.put("pretrained", False, source)
    elif key == "mode":
        if raw != "train":
            raise ValueError(f"mode={raw} is not training; this program only trains")
    elif key == "resume":
        if isinstance(raw, bool) or str(raw).lower() in ("true", "false"):
            if parse_bool(raw):
                given.put("resume", "", source)
        elif raw:
            given.put("resume", str(raw), source)
    elif key == "val":
        given.put("val", parse_bool(raw), source)
    else:
        given.put(name, _convert(name, raw), source)


def _put_cfg_value(given: _Given, value: str, source: str, hyp: dict[str, Any]) -> None:
    """``--cfg KEY=VALUE``, ``--cfg settings.yaml`` or ``--cfg model.yaml``."""
    key, sep, raw = value.partition("=")
    if sep:
        if not key.strip():
            raise TrainerError(f"{source}: expected KEY=VALUE, got {value!r}")
        _put_setting(given, key.strip(), _yaml_value(raw.strip()), source, hyp)
        return
    if not value.endswith((".yaml", ".yml")):
        raise TrainerError(f"{source}: expected KEY=VALUE, a settings YAML or a model YAML, got {value!r}")
    if _is_model_yaml(value):
        given.put("model", value, source)
        return
    file = Path(value)
    if not file.is_file():
        raise TrainerError(f"{source}: no such file {value}")
    doc = yaml.safe_load(file.read_text()) or {}
    if not isinstance(doc, dict):
        raise TrainerError(f"{source}: expected a mapping of ultralytics settings in {value}")
    for k, v in doc.items():
        _put_setting(given, str(k), v, f"{value}: {k}", hyp)


_CONVERTERS: dict[str, Any] = {
    "epochs": int, "batch": int, "imgsz": int, "lr": float, "lrf": float, "momentum": float, "weight_decay": float,
    "warmup_epochs": float, "workers": int, "seed": int, "close_mosaic": int, "patience": int, "fraction": float,
    "multi_scale": float, "nbs": int, "save_period": int, "accumulate": int, "clip": float, "log_every": int,
    "val_period": int, "debug_exit_after": int, "timeout_min": float, "ref_ips": float,
    "cos_lr": parse_bool, "exist_ok": parse_bool, "deterministic": parse_bool, "cls_remap": parse_bool,
    "pin_memory": parse_bool, "persistent_workers": parse_bool, "sync_bn": parse_bool,
    "device": parse_device, "cache": parse_cache, "freeze": parse_freeze,
    "channels_last": lambda v: None if v is None else parse_bool(v),
    "optimizer": lambda v: _optimizer_name(str(v)),
}


def _optimizer_name(text: str) -> str:
    names = {o.lower(): o for o in OPTIMIZERS}
    if text.lower() not in names:
        raise ValueError(f"unknown optimizer {text!r}; use one of {', '.join(OPTIMIZERS)}")
    return names[text.lower()]


def _convert(name: str, value: Any) -> Any:
    """A raw value (a flag's string or a YAML value) as the field's type."""
    if name == "amp":
        return parse_amp(value, from_flag=False)
    integer = isinstance(value, int) and not isinstance(value, bool)
    if name in ("batch", "imgsz") and not integer and (isinstance(value, (float, list)) or str(value).startswith("[")):
        raise ValueError(f"{name}={value!r}: this trainer takes one integer (no auto-batch, no rectangular size)")
    if name == "save_period" and int(value) < 0:
        return 0
    convert = _CONVERTERS.get(name)
    if convert is None:
        return None if value is None else str(value)
    try:
        return convert(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name.replace('_', '-')}: {e}") from None


def _from_flags(ns: argparse.Namespace, given: _Given) -> None:
    """The flags the user typed (argparse's None means not typed)."""
    for dest, value in vars(ns).items():
        if dest in _NOT_FIELDS or value is None or (dest == "sync_bn" and value is False):
            continue
        name = FLAG_FIELD.get(dest, dest)
        flag = "--" + dest.replace("_", "-")
        if dest == "model" and str(value).endswith(".pt"):
            given.put("weights", value, f"{flag} {value}")
            continue
        if dest == "amp":
            value = parse_amp(value, from_flag=True)
        elif dest in ("cache", "freeze", "device", "optimizer"):
            value = _convert(dest, value)
        given.put(name, value, f"{flag} {value}" if not isinstance(value, bool) else flag)


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse the command line into a checked ``TrainConfig``.

    Raises:
        TrainerError: a value no run could use, an unknown or unhonoured setting, or one setting
            given twice with different values.
    """
    import sys

    parser = build_parser()
    flags, words = split_settings(parser, list(sys.argv[1:] if argv is None else argv))
    ns = parser.parse_intermixed_args(flags)
    given, hyp = _Given(), dict[str, Any]()
    try:
        _from_flags(ns, given)
    except ValueError as e:
        raise TrainerError(str(e)) from None
    for word in ns.settings:  # `yolo detect train ...` pasted with its task and mode words
        if word in ("detect", "segment"):
            given.put("task", word, word)
        elif word != "train":
            raise TrainerError(f"unexpected argument {word!r} (settings are KEY=VALUE, flags start with --)")
    for word in words:
        key, _, raw = word.partition("=")
        _put_setting(given, key, _yaml_value(raw), word, hyp)
    for item in ns.cfg:
        _put_cfg_value(given, item, f"--cfg {item}", hyp)
    return resolve(given, hyp)


def resolve(given: _Given, hyp: dict[str, Any]) -> TrainConfig:
    """Defaults, home expansion and the rules that tie settings together."""
    v = dict(given.values)
    notes: list[str] = []
    if not v.get("data"):
        raise TrainerError("--data is required: the absolute path of the data YAML (train, val, names)")
    # A leading `~/` means this node's home: no shell expands it (orch quotes every argument),
    # and it is how one inventory names per-node paths that are absolute on every node.
    for name in ("weights", "data", "out", "project", "text_embeddings", "debug_dir", "resume", "model"):
        if isinstance(v.get(name), str) and v[name].startswith("~"):
            v[name] = os.path.expanduser(v[name])
    if v.pop("pretrained", True) is False and v.get("weights"):
        raise TrainerError(f"pretrained=False contradicts the weights {v['weights']}: drop one of them")
    optimizer = v.get("optimizer", "auto")
    chosen = [k for k in ("lr", "momentum") if k in v]
    if chosen and optimizer == "auto":
        if "optimizer" in v:
            raise TrainerError(f"--optimizer auto picks its own {' and '.join(chosen)}; {given.sources[chosen[0]]} "
                               "contradicts it: name an optimizer (e.g. --optimizer SGD) or drop the rate")
        v["optimizer"] = "SGD"
        notes.append(f"optimizer SGD because {given.sources[chosen[0]]} was given (auto would choose its own rate)")
    if "val" in v:
        val = v.pop("val")
        if not val:
            if v.get("val_period") not in (None, v.get("epochs", TrainConfig.epochs)):
                raise TrainerError(f"val=False contradicts {given.sources['val_period']}")
            v["val_period"] = v.get("epochs", TrainConfig.epochs)  # ultralytics' val=False: only after the last epoch
    if "name" not in v and os.environ.get("ORCH_RUN_ID"):
        # Started by `orch up`: one directory per orch run, so running the same inventory twice never
        # collides with (or silently resumes) the previous run's weights.
        v["name"] = os.environ["ORCH_RUN_ID"]
    known = {f.name for f in fields(TrainConfig)}
    cfg = replace(TrainConfig(), **{k: val for k, val in v.items() if k in known}, hyp=dict(hyp), notes=tuple(notes))
    for name in ("epochs", "batch", "imgsz", "log_every", "nbs"):
        if getattr(cfg, name) < 1:
            extra = " (no auto-batch: give the global batch)" if name == "batch" else ""
            raise TrainerError(f"--{name.replace('_', '-')} must be >= 1{extra}, got {getattr(cfg, name)}")
    if cfg.accumulate is not None and cfg.accumulate < 1:
        raise TrainerError(f"--accumulate must be >= 1, got {cfg.accumulate}")
    if cfg.workers < 0:
        raise TrainerError(f"--workers must be >= 0, got {cfg.workers}")
    if not 0 < cfg.fraction <= 1:
        raise TrainerError(f"--fraction must be in (0, 1], got {cfg.fraction:g}")
    if not 0 <= cfg.multi_scale < 1:
        raise TrainerError(f"--multi-scale must be in [0, 1), got {cfg.multi_scale:g}")
    if cfg.task is not None and cfg.task not in ("detect", "segment"):
        raise TrainerError(f"task={cfg.task}: this trainer trains detect and segment models")
    return cfg


def accumulation(cfg: TrainConfig) -> int:
    """Micro-steps per optimizer step: ``--accumulate``, else ultralytics' round(nbs / batch)."""
    return cfg.accumulate if cfg.accumulate is not None else max(round(cfg.nbs / cfg.batch), 1)


def check_topology(cfg: TrainConfig, world_size: int, launched: bool, local_world_size: int = 1) -> None:
    """Checks that depend on the job's shape, made identically on every rank.

    Raises:
        TrainerError: global batch not divisible by the world size; a relative weights, data or
            text-embeddings path under torchrun (each node may start in another directory); a
            ``--device`` list whose length is not this node's number of processes.
    """
    if cfg.batch % world_size:
        lo = cfg.batch // world_size * world_size
        raise TrainerError(
            f"--batch {cfg.batch} is not divisible by WORLD_SIZE {world_size}: "
            f"use {lo or world_size} or {lo + world_size} ({cfg.batch / world_size:.2f} images per rank is not possible)"
        )
    if launched:
        for flag, value in (("--data", cfg.data), ("--weights", cfg.weights), ("--text-embeddings", cfg.text_embeddings)):
            if value and not Path(value).is_absolute():
                raise TrainerError(
                    f"{flag} {value} is relative; under torchrun every node must see the same absolute path "
                    f"(here it would be {Path(value).absolute()})"
                )
    ids = cfg.device_ids
    if ids is not None and len(ids) != local_world_size:
        listed = ",".join(map(str, ids))
        if not launched and len(ids) > 1:
            raise TrainerError(f"--device {listed} names {len(ids)} GPUs but this is one process: start it with "
                               f"torchrun --nproc-per-node {len(ids)} -m trainer ...")
        raise TrainerError(f"--device {listed} names {len(ids)} GPUs but torchrun started {local_world_size} "
                           f"process(es) on this node: use --nproc-per-node {len(ids)}, or list {local_world_size} GPU(s)")
