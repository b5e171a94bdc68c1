"""ultralytics' own spellings of the settings: ``key=value`` words as pasted from ``yolo train``,
``--cfg key=value``, ``--cfg settings.yaml`` (like ``yolo cfg=``) and ``--cfg model.yaml``, and the
values both they and the flags take (booleans, GPU lists, precision, freeze lists, cache).

Every ultralytics setting is either honoured (it maps to a ``TrainConfig`` field, or it is passed
to ultralytics' own dataset, loss and validator) or refused with the reason: none is accepted and
ignored. ``config.py`` turns what is collected here (a ``Given``) into a ``TrainConfig``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import TrainerError
from trainer.interface import MODEL_NAME, parse_device

FIELD_OF_SETTING = {
    "model": "model",
    "data": "data",
    "epochs": "epochs",
    "batch": "batch",
    "imgsz": "imgsz",
    "lr0": "lr",
    "lrf": "lrf",
    "momentum": "momentum",
    "weight_decay": "weight_decay",
    "warmup_epochs": "warmup_epochs",
    "workers": "workers",
    "seed": "seed",
    "device": "device",
    "amp": "amp",
    "cos_lr": "cos_lr",
    "close_mosaic": "close_mosaic",
    "optimizer": "optimizer",
    "patience": "patience",
    "cache": "cache",
    "fraction": "fraction",
    "freeze": "freeze",
    "multi_scale": "multi_scale",
    "nbs": "nbs",
    "project": "project",
    "name": "name",
    "exist_ok": "exist_ok",
    "save_period": "save_period",
    "resume": "resume",
    "val": "val",
    "deterministic": "deterministic",
    "channels_last": "channels_last",
    "cls_remap": "cls_remap",
    "pretrained": "pretrained",
    "task": "task",
    "mode": "mode",
    "plots": "plots",
}
"""ultralytics settings that map to a field of ``TrainConfig`` (lr0 is ``--lr``)."""

HYP_SETTINGS = frozenset(
    {
        "hsv_h",
        "hsv_s",
        "hsv_v",
        "degrees",
        "translate",
        "scale",
        "shear",
        "perspective",
        "flipud",
        "fliplr",
        "bgr",
        "mosaic",
        "mixup",
        "cutmix",
        "copy_paste",
        "copy_paste_mode",  # the training augmentation
        "box",
        "cls",
        "dfl",  # loss gains
        "warmup_momentum",
        "warmup_bias_lr",  # the warmup
        "overlap_mask",
        "mask_ratio",  # segmentation targets
        "conf",
        "iou",
        "max_det",  # the validator
    }
)
"""ultralytics settings passed through to its own dataset, loss and validator, which honour them."""

NO_EFFECT_SETTINGS = frozenset(
    {
        "save",
        "verbose",
        "profile",
        "save_dir",
        "dnn",
        "nms",
        "source",
        "vid_stride",
        "stream_buffer",
        "visualize",
        "augment",
        "agnostic_nms",
        "retina_masks",
        "embed",
        "show",
        "save_frames",
        "save_conf",
        "save_crop",
        "show_labels",
        "show_conf",
        "show_boxes",
        "line_width",
        "format",
        "optimize",
        "dynamic",
        "simplify",
        "opset",
        "workspace",
        "tracker",
        "half",
        "keras",
        "int8",
    }
)
"""Settings without effect on training (prediction, export, tracking, where ultralytics
saved): accepted at any value, named once on the start-up line, so an ``args.yaml`` that
``yolo train`` wrote trains as it is."""

NEUTRAL_SETTINGS: dict[str, tuple[Any, ...] | None] = {
    "rect": (False,),
    "single_cls": (False,),
    "dropout": (0.0,),
    "cls_pw": (0.0,),
    "compile": (False,),
    "time": (None,),
    "split": ("val",),
    "quantize": (None,),
    "distill_model": (None,),
    "save_json": (False,),
    "save_txt": (False,),
    "classes": (None,),
    "dis": (6.0,),
    "pose": (12.0,),
    "kobj": (1.0,),
    "rle": (1.0,),
    "angle": (1.0,),
    "dlog": (1.0,),
    "dgrad": (0.5,),
    "dlam": (1.0,),
    "auto_augment": ("randaugment",),
    "erasing": (0.4,),
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


class NotFinite(argparse.ArgumentTypeError, ValueError):
    """A number that is not one: argparse shows its message (`argument --lr0: 'nan' is not a finite
    number`), the settings' converters catch it as the ValueError it also is."""


def finite_float(value: Any) -> float:
    """A float flag's or setting's value: `nan`, `inf` and `1e999` are refused (NotFinite)."""
    number = float(value)
    if not math.isfinite(number):
        raise NotFinite(f"{value!r} is not a finite number")
    return number


def yaml_value(text: str) -> Any:
    """A ``key=value`` value as ultralytics reads it (numbers, booleans, lists, None)."""
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return text


def split_settings(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``key=value`` words from the flags, so an optional-value flag (bare ``--amp``)
    never swallows the setting that follows it."""
    takes_value = {
        s
        for act in parser._actions
        if act.option_strings
        and act.nargs is None
        and not isinstance(act, (argparse._StoreTrueAction, argparse._HelpAction))
        for s in act.option_strings
    }
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


class Given:
    """Settings collected from flags and key=value words, each with where it came from."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.weak: set[str] = set()
        """Settings that came from a settings file (``--cfg args.yaml``): a flag or key=value wins."""
        self.no_effect: list[str] = []
        """Settings accepted without effect on training, for the one line that names them."""
        self.overridden: list[str] = []
        """A settings file's values the command line replaced."""
        self.file: str | None = None
        """The settings file being read (its values are weak), if any."""

    def put(self, name: str, value: Any, source: str) -> None:
        weak = self.file is not None
        if name in self.values and self.values[name] != value:
            if weak:  # like `yolo cfg=args.yaml data=...`: the command line overrides the file
                self.overridden.append(f"{source.split(': ', 1)[-1]} (by {self.sources[name]})")
                return
            raise TrainerError(
                f"{name.replace('_', '-')} is given twice with different values: {self.sources[name]} and {source}"
            )
        if name not in self.values and weak:
            self.weak.add(name)
        self.values[name] = value
        self.sources.setdefault(name, source)


def _is_model_yaml(path: str) -> bool:
    """Whether ``--cfg FILE`` names an architecture (a model YAML) rather than settings."""
    file = Path(path)
    if file.is_file():
        doc = yaml.safe_load(file.read_text())
        return isinstance(doc, dict) and "backbone" in doc and "head" in doc
    return bool(MODEL_NAME.match(file.name)) and file.name == path


def put_setting(given: Given, key: str, raw: Any, source: str, hyp: dict[str, Any]) -> None:
    """One ultralytics setting: into a config field, into ``hyp``, or refused with the reason."""
    defaults = ultralytics_defaults()
    if key == "cfg":
        put_cfg_value(given, str(raw), source, hyp)
        return
    if key not in defaults and key not in NO_EFFECT_SETTINGS:
        raise TrainerError(f"{source}: unknown ultralytics setting {key!r}")
    if raw is None and key in FIELD_OF_SETTING:  # `project: null` in an args.yaml: unset, the default
        return
    if isinstance(raw, float) and not math.isfinite(raw):
        raise TrainerError(f"{source}: {key}={raw!r} is not a finite number")
    try:
        if key in FIELD_OF_SETTING:
            _put_field_setting(given, key, raw, source)
        elif key in HYP_SETTINGS:
            if key in hyp and hyp[key] != raw:
                if given.file is not None:
                    given.overridden.append(f"{key} (by {hyp[key]!r})")
                    return
                raise TrainerError(f"{key} is given twice with different values ({hyp[key]!r} and {raw!r})")
            hyp[key] = raw
        elif key in NO_EFFECT_SETTINGS:
            given.no_effect.append(key)
        elif key in NEUTRAL_SETTINGS:
            allowed = NEUTRAL_SETTINGS[key]
            if allowed is not None and raw not in allowed:
                raise TrainerError(
                    f"{source}: {key}={raw!r} is not honoured by this trainer (it trains with "
                    f"{key}={allowed[0]!r}); drop it"
                )
        else:
            raise TrainerError(f"{source}: {key} is not a training setting this trainer honours; drop it")
    except ValueError as e:
        raise TrainerError(f"{source}: {e}") from None


def _put_field_setting(given: Given, key: str, raw: Any, source: str) -> None:
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
        given.put(name, convert(name, raw), source)


def put_cfg_value(given: Given, value: str, source: str, hyp: dict[str, Any]) -> None:
    """``--cfg KEY=VALUE``, ``--cfg settings.yaml`` or ``--cfg model.yaml``."""
    key, sep, raw = value.partition("=")
    if sep:
        if not key.strip():
            raise TrainerError(f"{source}: expected KEY=VALUE, got {value!r}")
        put_setting(given, key.strip(), yaml_value(raw.strip()), source, hyp)
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
    problems = []
    given.file = value
    try:
        for k, v in doc.items():
            try:
                if str(k) == "cfg" and v is None:
                    continue
                put_setting(given, str(k), v, f"{value}: {k}", hyp)
            except TrainerError as e:
                problems.append(str(e).removeprefix(f"{value}: {k}: ").removeprefix(f"{value}: "))
    finally:
        given.file = None
    if problems:  # every one at once: an args.yaml is fixed in one edit, not one rerun per key
        raise TrainerError(
            f"--cfg {value}: {len(problems)} setting(s) this trainer cannot train with: " + "; ".join(problems)
        )


_CONVERTERS: dict[str, Any] = {
    "epochs": int,
    "batch": int,
    "batch_per_device": int,
    "imgsz": int,
    "lr": finite_float,
    "lrf": finite_float,
    "momentum": finite_float,
    "weight_decay": finite_float,
    "warmup_epochs": finite_float,
    "workers": int,
    "seed": int,
    "close_mosaic": int,
    "patience": int,
    "fraction": finite_float,
    "multi_scale": finite_float,
    "nbs": int,
    "save_period": int,
    "accumulate": int,
    "clip": finite_float,
    "log_every": int,
    "val_period": int,
    "debug_exit_after": int,
    "timeout_min": finite_float,
    "ref_ips": finite_float,
    "startup_timeout_min": finite_float,
    "progress_every_s": finite_float,
    "cos_lr": parse_bool,
    "exist_ok": parse_bool,
    "plots": parse_bool,
    "deterministic": parse_bool,
    "cls_remap": parse_bool,
    "pin_memory": parse_bool,
    "persistent_workers": parse_bool,
    "sync_bn": parse_bool,
    "device": parse_device,
    "cache": parse_cache,
    "freeze": parse_freeze,
    "channels_last": lambda v: None if v is None else parse_bool(v),
    "optimizer": lambda v: _optimizer_name(str(v)),
}


def _optimizer_name(text: str) -> str:
    names = {o.lower(): o for o in OPTIMIZERS}
    if text.lower() not in names:
        raise ValueError(f"unknown optimizer {text!r}; use one of {', '.join(OPTIMIZERS)}")
    return names[text.lower()]


def convert(name: str, value: Any) -> Any:
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
