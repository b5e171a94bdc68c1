"""Command line → ``TrainConfig``: every flag, its default, and the checks that need no I/O.

Three spellings reach the same settings, and a setting given twice with different values is
refused, never silently resolved:

- this trainer's flags (``--epochs 100 --batch 256``), including those the field guides use
  (``--batch-size``, ``--gradient-accumulation``, bare ``--amp``, ``--device 0,1,2,3``,
  ``--cfg yoloe-v8l-seg.yaml``);
- ultralytics' ``key=value`` arguments as pasted from ``yolo train`` (``epochs=100 lr0=0.01``);
- ``--cfg key=value`` (or ``--cfg settings.yaml``, like ``yolo cfg=``).

A flag is written once: a field of ``TrainConfig``, its default, and the docstring under it,
which is the flag's ``--help`` text (``build_parser`` reads it). How the flag parses (a value
type other than the field's, an optional value, choices) is the field's ``flag(...)`` metadata;
a field with ``flag(None)`` has no flag. ultralytics' own spellings are ``settings.py``.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import inspect
import os
import typing
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError, refusal
from trainer.interface import DEFAULT_NAME, INPUT_FLAGS, OUTPUT_FLAGS, batch_problem
from trainer.settings import (
    Given,
    convert,
    finite_float,
    parse_amp,
    parse_bool,
    put_cfg_value,
    put_setting,
    split_settings,
    yaml_value,
)

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

NO_FLAG: dict[str, Any] = {"flag": None}
"""Field metadata of a setting without a flag (``key=value`` or ``--cfg`` only)."""


def flag(**parsing: Any) -> dict[str, Any]:
    """Field metadata: how the field's flag parses where its type does not say it (``int`` gives
    ``type=int``, ``bool`` ``--flag [BOOL]``, ``str`` a word): argparse's ``nargs``, ``const``,
    ``metavar``, ``choices``, ``action``; ``type=None`` keeps the word as typed."""
    return {"flag": parsing}


ALIASES = {
    "--batch-size": (
        "batch",
        "the same as --batch: global over all ranks, as yolov5's --batch-size and "
        "ultralytics' batch= (for 32 per GPU on 8 GPUs pass 256)",
    ),
    "--lr0": ("lr", "the same as --lr"),
    "--gradient-accumulation": ("accumulate", "the same as --accumulate"),
}
"""Second spellings of a flag (the field guides', ultralytics'): each parsed on its own, so the
same setting given both ways with different values is refused, naming both."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; built from the command line by ``parse_config``.

    Defaults are ultralytics' own (``yolo train``'s), so the same command trains the same way. The
    docstring under each field is its flag's ``--help``; a default that is a value is added to it.
    """

    model: str | None = None
    """architecture YAML, scale in the name, e.g. yolo12s.yaml, yoloe-v8l-seg.yaml (default: the --weights
    checkpoint's architecture, else yolo12n.yaml); a .pt file means --weights"""
    weights: str | None = None
    """absolute path of a .pt checkpoint to start from; its architecture and task (detect, segment, YOLOE)
    are trained unless --model names the same one, e.g. /models/yoloe-v8l-seg.pt"""
    data: str = ""
    """absolute path of the data YAML (train, val, non-empty names), e.g. /data/coco/data.yaml (required)"""
    epochs: int = 100
    """training epochs: passes over the training set"""
    batch: int = 16
    """global batch: images per micro-step over all ranks, divisible by WORLD_SIZE, e.g. 256 on 16 GPUs"""
    batch_per_device: int | None = None
    """images per GPU (per rank) instead of --batch: the global batch is N x WORLD_SIZE, e.g. 12 on 32 GPUs
    trains a global batch of 384"""
    imgsz: int = 640
    """square training and validation image size in pixels, a multiple of 32, e.g. 640"""
    lr: float | None = None
    """initial learning rate, ultralytics' lr0, e.g. 0.01 (default: chosen by --optimizer auto; giving it
    selects SGD). With SGD the step already grows with the global batch, as in ultralytics: do not
    multiply it by the GPU count"""
    lrf: float = 0.01
    """final learning rate as a fraction of the initial one, e.g. 0.01"""
    momentum: float | None = None
    """SGD momentum / Adam beta1 (default 0.937, or what --optimizer auto picks)"""
    weight_decay: float = 5e-4
    """weight decay of conv/linear weights at the nominal batch (scaled by batch x accumulate / nbs)"""
    warmup_epochs: float = 3.0
    """epochs of warmup of learning rate, momentum and accumulation, fractions allowed, e.g. 1.5"""
    accumulate: int | None = None
    """micro-steps per optimizer step, e.g. 2 (default round(nbs / batch), as ultralytics); DDP all-reduces on
    the last one only. Every epoch ends on an optimizer step, so a checkpoint holds no half-accumulated gradient"""
    nbs: int = 64
    """nominal batch size: accumulating round(nbs / batch) micro-steps reaches it; weight decay is scaled to it"""
    clip: float = 10.0
    """max gradient norm, 0 = no clipping"""
    optimizer: str = "auto"
    """one of auto, SGD, AdamW, Adam, Adamax, NAdam, RAdam, RMSProp, MuSGD; auto is ultralytics' rule
    (AdamW with a rate fitted to the class count, MuSGD for long runs: SGD lr0 0.01 momentum 0.9 instead on
    GPUs without native bfloat16, V100 and T4, where MuSGD's Newton-Schulz would run in emulated bf16 and
    --optimizer MuSGD is refused)"""
    cos_lr: bool = False
    """cosine learning-rate decay instead of linear"""
    close_mosaic: int = 10
    """turn mosaic off for the last N epochs, 0 = never"""
    patience: int = 100
    """stop after N epochs without a better validation fitness (mAP50-95)"""
    amp: str = field(default="auto", metadata=flag(nargs="?", const="on", metavar="MODE"))
    """mixed precision: bare --amp = on (fp16, CUDA only: refused on CPU); off, fp16, bf16 (compute capability
    8.0 or later: refused on V100 and T4, where torch would emulate it), auto = fp16 on CUDA and off on CPU"""
    sync_bn: bool = False
    """SyncBatchNorm across ranks (CUDA; refused on CPU with several ranks), e.g. for <= 8 images per GPU; the
    EMA and every checkpoint keep plain BatchNorm. Fewer than 4 images per rank without it: a warning. Its
    all-gathers in the forward are timed apart: sync_s on the timing lines, out of compute_s"""
    ddp_grad_dtype: str = field(default="fp32", metadata=flag(choices=("fp32", "fp16", "bf16"), metavar="DTYPE"))
    """dtype of DDP's gradient all-reduce: fp16 or bf16 halve the bytes each optimizer step sends (DDP's
    compression comm hook: gradients cast before the all-reduce, back to fp32 after it), e.g. on 10 GbE
    between nodes; bf16 needs compute capability 8.0 or later on GPUs (refused on V100 and T4); fp32 sends
    them as they are. Said at start-up with the bytes per step; no effect on one rank"""
    bucket_mb: float = 25.0
    """size in MB of DDP's gradient buckets (its bucket_cap_mb): each bucket is all-reduced as soon as its
    gradients are ready, overlapping the backward; larger buckets mean fewer, longer all-reduces. Said at
    start-up; trainer.yaml records it and --ddp-grad-dtype (args.yaml holds ultralytics' keys only)"""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK if CUDA is there), cpu, cuda, or this node's GPU indices as CUDA_VISIBLE_DEVICES
    shows them, one per process: 0,1,2,3 (or cuda:0,1,2,3, [0,1,2,3]) needs --nproc-per-node 4"""
    dist_backend: str = field(default="auto", metadata=flag(choices=("auto", "nccl", "gloo")))
    """process group backend: auto = nccl on CUDA, gloo on CPU; gloo on CUDA lets the ranks of a node share
    its GPUs (a rank whose LOCAL_RANK has no GPU of its own takes GPU LOCAL_RANK modulo their count, which
    NCCL refuses): for testing DDP with fewer GPUs than ranks, e.g. 2 ranks on one GPU"""
    workers: int = 8
    """data loader worker processes per rank, at most the node's CPUs / its ranks (a larger number is lowered,
    said at start-up and recorded as used in trainer.yaml and args.yaml), e.g. 8"""
    pin_memory: bool = True
    """page-locked host memory for the batches (CUDA only: off on a CPU, said at start-up when given and
    recorded as off)"""
    persistent_workers: bool = True
    """keep the loader workers between epochs"""
    cache: str | None = field(default=None, metadata=flag(nargs="?", const="ram", metavar="WHERE"))
    """cache decoded images: ram (bare --cache) or disk (ultralytics' cache), one builder per node: disk is
    written by each node's first rank (rank 0 first), then read by its other ranks; ram is a copy per rank,
    cached (the node's first rank first) if the node's free memory holds one for each of its ranks with
    ultralytics' 2x margin, else a warning and no RAM cache"""
    fraction: float = 1.0
    """train on this fraction of the training images, e.g. 0.1"""
    freeze: int | tuple[int | str, ...] | None = field(default=None, metadata=flag(type=None))
    """freeze the first N layers, or these layer indices / module names: e.g. 10, or 0,1,2 (their BatchNorm
    stays in eval mode)"""
    multi_scale: float = field(default=0.0, metadata=flag(nargs="?", const=0.5, metavar="FRACTION"))
    """vary the training image size per batch by +/- FRACTION of imgsz (bare: 0.5; 0 = off)"""
    seed: int = 0
    """seed of model init, sampler order and augmentation, the same on all ranks"""
    deterministic: bool = True
    """deterministic algorithms where torch has them (ultralytics' default); false also lets cuDNN pick its
    convolution algorithms by timing them (cudnn.benchmark)"""
    channels_last: bool | None = field(default=None, metadata=NO_FLAG)
    """NHWC memory format on CUDA; None: on for CUDA."""
    cls_remap: bool = field(default=True, metadata=NO_FLAG)
    """When fine-tuning, match the checkpoint's class rows to the data's classes by name."""
    out: str | None = None
    """run directory, used as is, e.g. /mnt/nfs/runs/y12m (default PROJECT/NAME, numbered if it exists)"""
    project: str = ""
    """parent of the run directory when --out is not given: an absolute path is used as is, a relative one
    (or none) lies under runs/TASK, as ultralytics 8.4 lays it out (default: runs/detect, runs/segment)"""
    name: str = DEFAULT_NAME
    """run directory name under the project (default: the orch run id when started by orch up, else train;
    train2, train3... when it exists)"""
    exist_ok: bool = False
    """reuse PROJECT/NAME instead of numbering a new one (train2, train3...)"""
    save_period: int = 0
    """also keep weights/epochN.pt every N epochs, e.g. 10 (0 = never)"""
    val_period: int = 1
    """validate every N epochs and after the last one, 0 = never"""
    plots: bool = True
    """rank 0 writes ultralytics' plots into the run directory at the end: results.png, the confusion
    matrices and the PR/F1/P/R curves of the final validation (over every rank's shard), val_batch*.jpg
    (not train_batch*.jpg or labels.jpg)"""
    resume: str | None = field(default=None, metadata=flag(nargs="?", const="", metavar="PATH"))
    """continue from PATH, or from the run directory's weights/last.pt (the latest run under --project
    without --out); auto: this run's own last.pt if it wrote one, else start it over in the same directory
    (what orch up passes to a retry)"""
    text_embeddings: str | None = None
    """YOLOE: absolute path of the class-name -> vector file from `python -m trainer.embed`, which records its
    text model: a file of another text model than the checkpoint's is refused"""
    prompt_mode: str | None = field(default=None, metadata=flag(choices=("linear", "full")))
    """YOLOE: full = train everything (the YOLOE repo's train_pe_all.py), linear = train the class-prompt
    convs only (its train_pe.py); default full. With YOLOE --weights, what you do not set follows that
    recipe: optimizer AdamW lr0 0.001 weight_decay 0.025 momentum 0.9, warmup_bias_lr 0, close_mosaic 10
    (linear: 5), mixup 0.15, copy_paste 0.3, scale 0.6 (s models) or 0.9 (m, l)"""
    task: str | None = field(default=None, metadata=NO_FLAG)
    """Task the user asserted (task=segment); checked against the model's."""
    log_every: int = 10
    """rank 0 prints a progress line every N optimizer steps, e.g. 50"""
    ref_ips: float | None = None
    """single-rank images/s for the scaling-efficiency column, e.g. 95.5"""
    timeout_min: float = 30.0
    """collective timeout in minutes: how long a collective may wait before the process group gives up
    (a lost node ends the job)"""
    startup_timeout_min: float = 120.0
    """how long a rank waits for the others at start-up (datasets built and cached; --cache ram at COCO
    scale takes minutes per rank), on torchrun's rendezvous store (no gloo group, so no GLOO_SOCKET_IFNAME);
    at least --timeout-min. The labels.cache writes take turns (rank 0, then each node's first rank), the
    builds run on every rank at once, image caching node by node"""
    progress_every_s: float = 30.0
    """start-up: each node's first rank says what it is building every N seconds (feeds orch's stall
    watchdog), e.g. 60"""
    debug_dir: str | None = None
    """testing: each rank writes DIR/rank{R}.json with samples seen per epoch, a parameter checksum and the
    bytes of its DDP gradient all-reduces (counted in the comm hook, which fp32 then uses too)"""
    debug_exit_after: int = field(default=0, metadata=flag(metavar="EPOCH"))
    """testing: exit with code 3 right after saving EPOCH, as if the job were killed (0 = never)"""
    hyp: dict[str, Any] = field(default_factory=dict, metadata=NO_FLAG)
    """ultralytics settings for its dataset, loss and validator (augmentation, loss gains...)."""
    notes: tuple[str, ...] = field(default=(), metadata=NO_FLAG)
    """Decisions taken from the command line that the start-up line explains."""
    given: tuple[str, ...] = field(default=(), metadata=NO_FLAG)
    """The fields the user set (by flag, key=value or --cfg): defaults chosen later, such as YOLOE's
    recipe, never override them."""

    @property
    def device_ids(self) -> tuple[int, ...] | None:
        """The GPU indices of ``--device 0,1,2,3`` (None for auto, cpu, cuda)."""
        if not self.device.startswith("cuda:"):
            return None
        return tuple(int(x) for x in self.device[5:].split(","))


# --- the parser ----------------------------------------------------------------------------------


@cache
def field_docs() -> dict[str, str]:
    """Each ``TrainConfig`` field's docstring (the string under it), whitespace folded."""
    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _show_default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag_kwargs(f: Any, hint: Any) -> dict[str, Any] | None:
    """argparse's keywords for one field's flag (None: it has none), help from its docstring."""
    override = f.metadata.get("flag", {})
    if override is None:
        return None
    kinds = {a for a in typing.get_args(hint) if a is not type(None)} or {hint}
    kw: dict[str, Any] = {}
    if kinds == {bool}:
        kw = {"nargs": "?", "const": True, "type": parse_bool, "metavar": "BOOL"}
    elif kinds in ({int}, {float}):
        kw = {"type": int if kinds == {int} else finite_float}
    kw.update(override)
    if kw.get("type", _UNSET) is None:
        del kw["type"]
    if kw.get("action") == "store_true":
        kw = {"action": "store_true"}
    doc = field_docs()[f.name]
    if f.default is not MISSING and f.default not in (None, "") and "default" not in doc:
        doc += f" (default {_show_default(f.default)})"
    kw["help"] = doc
    return kw


_UNSET = object()


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors name the flag a typo most likely meant (`--epocs` →
    `--epochs`); with ``raise_errors`` they are a TrainerError (the message alone, as `--check`
    answers it) instead of usage text on stderr and exit 2."""

    raise_errors = False

    def error(self, message: str) -> typing.NoReturn:
        message += self._suggestion(message)
        if self.raise_errors:
            raise TrainerError(f"{self.prog}: error: {message}")
        super().error(message)

    def _suggestion(self, message: str) -> str:
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [s for act in self._actions for s in act.option_strings if s.startswith("--")]
        meant = []
        for word in message.split(":", 1)[1].split():
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75)
                meant += [(close[0], flag)] if close else []
        if len(meant) == 1:
            return f" (did you mean {meant[0][0]}?)"
        return f" (did you mean {', '.join(f'{m} for {f}' for m, f in meant)}?)" if meant else ""


CHECK_HELP = (
    "check the arguments as a start would and answer in one JSON line, without training: parse, the "
    "topology from torchrun's environment, the data YAML, --weights, the model, the run directory "
    "(--out / --resume); no process group, nothing written. Exit 0 accepted, 2 refused (the message "
    "a start would print)"
)


def build_parser() -> Parser:
    """The ``python -m trainer`` argument parser, generated from ``TrainConfig``: a flag per field
    (``--weight-decay`` for ``weight_decay``), its help the field's docstring, then ``ALIASES``;
    and ``--check`` (`trainer/check.py`), which is not a setting."""
    p = Parser(
        prog="python -m trainer",
        description="DDP training of ultralytics YOLO12 / YOLOE models; run it under torchrun on every node. "
        "Defaults are ultralytics' (yolo train); its key=value arguments are accepted too.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "settings",
        nargs="*",
        metavar="KEY=VALUE",
        help="ultralytics settings as `yolo train` takes them, e.g. epochs=100 lr0=0.01 cos_lr=True",
    )
    hints = typing.get_type_hints(TrainConfig)
    aliases = {name: (alias, text) for alias, (name, text) in ALIASES.items()}
    for f in fields(TrainConfig):
        kw = _flag_kwargs(f, hints[f.name])
        if kw is None:
            continue
        p.add_argument("--" + f.name.replace("_", "-"), **kw)
        if f.name in aliases:
            alias, text = aliases[f.name]
            p.add_argument(alias, **dict(kw, help=text))
    p.add_argument(
        "--cfg",
        action="append",
        default=[],
        metavar="KEY=VALUE|FILE",
        help="an ultralytics setting (repeatable), e.g. --cfg mosaic=0; a settings YAML (like yolo cfg=); "
        "or a model YAML (--cfg yoloe-v8l-seg.yaml means --model)",
    )
    p.add_argument("--check", action="store_true", help=CHECK_HELP)
    return p


FLAG_FIELD = {alias[2:].replace("-", "_"): name for alias, (name, _text) in ALIASES.items()}
"""Flag destinations that are another flag's field (aliases); every other destination is the field itself."""
_NOT_FIELDS = ("settings", "cfg", "check")


def _from_flags(ns: argparse.Namespace, given: Given) -> None:
    """The flags the user typed (argparse's None means not typed)."""
    for dest, value in vars(ns).items():
        if dest in _NOT_FIELDS or value is None:
            continue
        name = FLAG_FIELD.get(dest, dest)
        flag_text = "--" + dest.replace("_", "-")
        if dest == "model" and str(value).endswith(".pt"):
            given.put("weights", value, f"{flag_text} {value}")
            continue
        if dest == "amp":
            value = parse_amp(value, from_flag=True)
        elif dest in ("cache", "freeze", "device", "optimizer"):
            value = convert(dest, value)
        given.put(name, value, f"{flag_text} {value}" if not isinstance(value, bool) else flag_text)


def parse_config(
    argv: list[str] | None = None, usage_errors: bool = False, problems: list[str] | None = None
) -> TrainConfig:
    """Parse the command line into a checked ``TrainConfig``.

    With ``usage_errors`` an argument argparse refuses (an unknown flag, a value of the wrong
    type) raises a TrainerError with argparse's message, instead of printing the usage and
    exiting 2. With ``problems`` the rules that tie settings together (ranges, both batches)
    are appended there instead of raised, so the start can name them with what the topology and
    the device refuse (``dist.start_device``), all at once.

    Raises:
        TrainerError: a value no run could use, an unknown or unhonoured setting, or one setting
            given twice with different values.
    """
    import sys

    parser = build_parser()
    parser.raise_errors = usage_errors
    flags, words = split_settings(parser, list(sys.argv[1:] if argv is None else argv))
    ns = parser.parse_intermixed_args(flags)
    given, hyp = Given(), dict[str, Any]()
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
        put_setting(given, key, yaml_value(raw), word, hyp)
    for item in ns.cfg:
        put_cfg_value(given, item, f"--cfg {item}", hyp)
    return resolve(given, hyp, problems)


def resolve(given: Given, hyp: dict[str, Any], found: list[str] | None = None) -> TrainConfig:
    """Defaults, home expansion and the rules that tie settings together."""
    v = dict(given.values)
    notes: list[str] = []
    if not v.get("data"):
        raise TrainerError("--data is required: the absolute path of the data YAML (train, val, names)")
    # A leading `~/` means this node's home: no shell expands it (orch quotes every argument),
    # and it is how one inventory names per-node paths that are absolute on every node.
    for name in (*INPUT_FLAGS, *OUTPUT_FLAGS):
        if isinstance(v.get(name), str) and v[name].startswith("~"):
            v[name] = os.path.expanduser(v[name])
    if v.pop("pretrained", True) is False and v.get("weights"):
        raise TrainerError(f"pretrained=False contradicts the weights {v['weights']}: drop one of them")
    optimizer = v.get("optimizer", "auto")
    chosen = [k for k in ("lr", "momentum") if k in v]
    auto_named = "optimizer" in v and "optimizer" not in given.weak
    if chosen and optimizer == "auto" and (auto_named or all(k in given.weak for k in chosen)):
        # ultralytics' rule: optimizer=auto picks its own rate and momentum (every args.yaml has both)
        unused = " and ".join(f"{'lr0' if k == 'lr' else k} {v.pop(k):g}" for k in chosen)
        notes.append(
            f"{unused} unused: optimizer auto picks its own (ultralytics' rule; name an optimizer, "
            "e.g. optimizer=SGD, to use them)"
        )
    elif chosen and optimizer == "auto":
        v["optimizer"] = "SGD"
        notes.append(f"optimizer SGD because {given.sources[chosen[0]]} was given (auto would choose its own rate)")
    if given.no_effect:
        keys = list(dict.fromkeys(given.no_effect))
        notes.append(f"accepted without effect on training (prediction, export, tracking): {', '.join(keys)}")
    if given.overridden:
        notes.append(f"the command line overrides the settings file's {', '.join(given.overridden)}")
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
    cfg = replace(
        TrainConfig(),
        **{k: val for k, val in v.items() if k in known},
        hyp=dict(hyp),
        notes=tuple(notes),
        given=tuple(sorted({*given.values, *hyp})),
    )
    problems = []
    if cfg.batch_per_device is not None:
        if "batch" in v:
            problems.append(
                f"{given.sources['batch']} and {given.sources['batch_per_device']} both set the batch: "
                "give the global batch or the batch per GPU, not both"
            )
        if cfg.batch_per_device < 1:
            problems.append(f"--batch-per-device must be >= 1, got {cfg.batch_per_device}")
    for name in ("epochs", "batch", "imgsz", "log_every", "nbs"):
        if getattr(cfg, name) < 1:
            extra = " (no auto-batch: give the global batch)" if name == "batch" else ""
            problems.append(f"--{name.replace('_', '-')} must be >= 1{extra}, got {getattr(cfg, name)}")
    if cfg.accumulate is not None and cfg.accumulate < 1:
        problems.append(f"--accumulate must be >= 1, got {cfg.accumulate}")
    for name in ("timeout_min", "startup_timeout_min", "progress_every_s", "bucket_mb"):
        if getattr(cfg, name) <= 0:
            problems.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(cfg, name):g}")
    if cfg.workers < 0:
        problems.append(f"--workers must be >= 0, got {cfg.workers}")
    if not 0 < cfg.fraction <= 1:
        problems.append(f"--fraction must be in (0, 1], got {cfg.fraction:g}")
    if not 0 <= cfg.multi_scale < 1:
        problems.append(f"--multi-scale must be in [0, 1), got {cfg.multi_scale:g}")
    if cfg.task is not None and cfg.task not in ("detect", "segment"):
        problems.append(f"task={cfg.task}: this trainer trains detect and segment models")
    if found is not None:
        found += problems
    elif problems:  # every one at once: one edit, not one launch per problem
        raise refusal(problems)
    return cfg


def with_world_size(cfg: TrainConfig, world_size: int) -> TrainConfig:
    """``cfg`` with its global batch for ``world_size`` ranks: ``--batch-per-device N`` is N x
    world size (said on the start-up line); a config without it is returned as it is."""
    if cfg.batch_per_device is None:
        return cfg
    batch = cfg.batch_per_device * world_size
    note = f"global batch {batch} = --batch-per-device {cfg.batch_per_device} x {world_size} rank(s)"
    return replace(cfg, batch=batch, notes=(*cfg.notes, note))


def for_node(cfg: TrainConfig, device_type: str, cpus: int, local_world_size: int) -> TrainConfig:
    """``cfg`` as this rank will use it on its node: the loader workers at most the node's CPUs
    shared by its ranks, page-locked memory only on CUDA. Each change is a note (said once, on
    rank 0's start-up lines) and the run records the value used (trainer.yaml, args.yaml);
    ``--pin-memory`` on a CPU is said only when it was given (its default is on)."""
    notes = []
    cap = max(cpus // max(local_world_size, 1), 0)
    workers = min(cfg.workers, cap)
    if workers != cfg.workers:
        notes.append(
            f"--workers {cfg.workers} -> {workers}: this node's {cpus} CPUs shared by its {local_world_size} rank(s)"
        )
    pin = cfg.pin_memory and device_type == "cuda"
    if cfg.pin_memory and not pin and "pin_memory" in cfg.given:
        notes.append("--pin-memory off: page-locked memory is for copies to a GPU, and this rank trains on the CPU")
    if workers == cfg.workers and pin == cfg.pin_memory:
        return cfg
    return replace(cfg, workers=workers, pin_memory=pin, notes=(*cfg.notes, *notes))


def accumulation(cfg: TrainConfig) -> int:
    """Micro-steps per optimizer step: ``--accumulate``, else ultralytics' round(nbs / batch)."""
    return cfg.accumulate if cfg.accumulate is not None else max(round(cfg.nbs / cfg.batch), 1)


def nproc_fix(n: int) -> str:
    """How to start `n` processes per node, in the words of what launched this one: orch's
    inventory key under orch (`ORCH_RUN_ID` is set), else torchrun's flag."""
    if os.environ.get("ORCH_RUN_ID"):
        return f"set job.nproc_per_node: {n} in the inventory"
    return f"use --nproc-per-node {n}"


def check_topology(cfg: TrainConfig, world_size: int, launched: bool, local_world_size: int = 1) -> None:
    """Checks that depend on the job's shape, made identically on every rank.

    Raises:
        TrainerError: every problem of ``topology_problems`` at once.
    """
    problems = topology_problems(cfg, world_size, launched, local_world_size)
    if problems:
        raise refusal(problems)


def topology_problems(cfg: TrainConfig, world_size: int, launched: bool, local_world_size: int = 1) -> list[str]:
    """Global batch not divisible by the world size; a relative weights, data or text-embeddings
    path under torchrun (each node may start in another directory); a ``--device`` list whose
    length is not this node's number of processes."""
    cfg = with_world_size(cfg, world_size)
    problems = []
    problem = batch_problem(cfg.batch, world_size)
    if problem:
        problems.append(f"--batch {cfg.batch}: {problem}")
    if launched:
        for flag, value in (
            ("--data", cfg.data),
            ("--weights", cfg.weights),
            ("--text-embeddings", cfg.text_embeddings),
        ):
            if value and not Path(value).is_absolute():
                problems.append(
                    f"{flag} {value} is relative; under torchrun every node must see the same absolute path "
                    f"(here it would be {Path(value).absolute()})"
                )
    ids = cfg.device_ids
    if ids is not None and len(ids) != local_world_size:
        listed = ",".join(map(str, ids))
        if not launched and len(ids) > 1:
            problems.append(
                f"--device {listed} names {len(ids)} GPUs but this is one process: start it with "
                f"torchrun --nproc-per-node {len(ids)} -m trainer ..."
            )
        else:
            problems.append(
                f"--device {listed} names {len(ids)} GPUs but torchrun started {local_world_size} "
                f"process(es) on this node: {nproc_fix(len(ids))}, or list {local_world_size} GPU(s)"
            )
    return problems


def precision_problems(cfg: TrainConfig, device_type: str, distributed: bool) -> list[str]:
    """What ``--amp``, ``--sync-bn`` and ``--dist-backend`` cannot do on this rank's device (``cpu``/``cuda``)."""
    problems = []
    if cfg.amp in ("on", "fp16") and device_type != "cuda":
        problems.append(
            f"--amp {cfg.amp}: fp16 mixed precision needs CUDA (GradScaler); on CPU use --amp off or --amp bf16"
        )
    if cfg.sync_bn and distributed and device_type != "cuda":
        problems.append("--sync-bn needs CUDA: torch's SyncBatchNorm has no CPU implementation (drop --sync-bn on CPU)")
    if cfg.dist_backend == "nccl" and device_type != "cuda":
        problems.append("--dist-backend nccl needs CUDA: on CPU use --dist-backend gloo (or auto)")
    return problems
