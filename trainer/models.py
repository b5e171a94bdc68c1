"""Build the network: YOLO12 or YOLOE, detect or segment, from a YAML or a checkpoint, with YOLOE
text prompts from a file; and decide what trains (freeze, linear probe) and how (frozen BatchNorm).
"""

from __future__ import annotations

import difflib
import re
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from trainer.errors import TrainerError

YoloModel = Any
"""An ultralytics DetectionModel / SegmentationModel / YOLOE model: its attributes (``model``,
``names``, ``set_classes``...) are dynamic, so it is typed as Any."""

DEFAULT_MODEL = "yolo12n.yaml"
TASKS = ("detect", "segment")


@dataclass(frozen=True)
class Arch:
    """The architecture a run trains."""

    yaml: dict[str, Any]
    """ultralytics' model dictionary (backbone, head, scale...)."""
    name: str
    """Its YAML file name (yolo12n.yaml, yoloe-v8l-seg.yaml), or the checkpoint's."""
    task: str
    """detect or segment."""
    yoloe: bool
    """A YOLOE (prompted) head."""
    source: str
    """Where it came from, for messages: ``--model X`` or ``the checkpoint W``."""


def load_weights(path: str) -> tuple[YoloModel, dict[str, Any]]:
    """Load a checkpoint: its (EMA) model in fp32 and the raw dict.

    Raises:
        TrainerError: the file does not exist (named, never downloaded) or is not a checkpoint.
    """
    from ultralytics.nn.tasks import load_checkpoint

    if not Path(path).is_file():
        raise TrainerError(
            f"--weights {path}: no such file (the trainer never downloads weights; copy it to every node)"
        )
    try:
        return load_checkpoint(path)
    except (TypeError, RuntimeError, KeyError, AttributeError, ValueError) as e:
        raise TrainerError(f"--weights {path}: not an ultralytics checkpoint ({str(e).splitlines()[0]})") from None


def _yaml_of(name: str) -> dict[str, Any]:
    """ultralytics' dictionary for a model YAML (the scale is read from the file name)."""
    from ultralytics.nn.tasks import yaml_model_load

    try:
        return dict(yaml_model_load(name))
    except (FileNotFoundError, OSError):
        close = difflib.get_close_matches(Path(name).name, known_architectures(), n=1, cutoff=0.8)
        meant = f" (did you mean {close[0]}?)" if close else ""
        raise TrainerError(
            f"--model {name}: unknown architecture{meant} (e.g. yolo12s.yaml, yolo12n-seg.yaml, "
            "yoloe-11m.yaml, yoloe-v8l-seg.yaml; the scale letter is part of the name)"
        ) from None


def known_architectures() -> list[str]:
    """Every model YAML name ultralytics builds, each with every scale letter (`yolo12s.yaml` from
    its `yolo12.yaml`, `yoloe-v8l-seg.yaml` from `yoloe-v8-seg.yaml`): what `--model` may name."""
    import ultralytics

    root = Path(ultralytics.__file__).parent / "cfg" / "models"
    out = []
    for f in sorted(root.rglob("*.yaml")):
        out.append(f.name)
        m = re.match(r"^(.*\d)(\D.*)$", f.name)
        if m:
            out += [f"{m.group(1)}{scale}{m.group(2)}" for scale in "nsmlx"]
    return out


def _describe(d: dict[str, Any], source: str) -> Arch:
    """Task and family of a model dictionary."""
    from ultralytics.nn.tasks import guess_model_task

    task = guess_model_task(d)
    name = Path(str(d.get("yaml_file", "checkpoint"))).name
    if task not in TASKS:
        raise TrainerError(f"{source}: a {task} model ({name}); this trainer trains detect and segment models")
    head = str(d["head"][-1][-2])
    return Arch(yaml=d, name=name, task=task, yoloe=head.startswith("YOLOE"), source=source)


def scale_of(d: dict[str, Any]) -> str | None:
    """The model scale (n, s, m, l, x) of a model dictionary, as ultralytics builds it."""
    scale = d.get("scale")
    if not scale and isinstance(d.get("scales"), dict):
        scale = next(iter(d["scales"]))  # ultralytics' fallback when the name has no scale letter
    return scale


def same_architecture(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two model dictionaries build the same network (the class count aside)."""
    return a.get("backbone") == b.get("backbone") and a.get("head") == b.get("head") and scale_of(a) == scale_of(b)


def resolve_architecture(model: str | None, weights_model: YoloModel | None, weights: str | None) -> Arch:
    """What to train: the checkpoint's architecture and task when ``--weights`` is given, the
    ``--model`` YAML otherwise (yolo12n.yaml by default).

    Raises:
        TrainerError: ``--model`` and ``--weights`` name different architectures, an unknown YAML, or
            a task other than detect and segment.
    """
    if weights_model is not None:
        ckpt = _describe(dict(weights_model.yaml), f"--weights {weights}")
        ckpt = Arch(ckpt.yaml, ckpt.name, ckpt.task, ckpt.yoloe, f"the checkpoint {weights}")
        if model is None:
            return ckpt
        wanted = _describe(_yaml_of(model), f"--model {model}")
        if not same_architecture(wanted.yaml, ckpt.yaml):
            raise TrainerError(
                f"--model {model} contradicts --weights {weights}, a {ckpt.name} {ckpt.task} model: drop --model to "
                f"fine-tune the checkpoint's architecture, or drop --weights to train {model} from scratch"
            )
        return ckpt
    name = model or DEFAULT_MODEL
    return _describe(_yaml_of(name), f"--model {name}")


def build_model(
    arch: Arch,
    names: dict[int, str],
    hyp: SimpleNamespace,
    weights_model: YoloModel | None,
    channels: int = 3,
    cls_remap: bool = True,
) -> YoloModel:
    """The ultralytics model for ``arch`` with ``len(names)`` classes, pretrained weights transferred.

    ``names`` is set before the weights are loaded, so ultralytics matches the checkpoint's class
    rows to the data's classes by name (a fine-tune whose classes are reordered or a subset keeps
    what each class learnt), as its own trainer does with ``cls_remap``.
    """
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel, YOLOEModel, YOLOESegModel

    seg = arch.task == "segment"
    cls = (YOLOESegModel if seg else YOLOEModel) if arch.yoloe else (SegmentationModel if seg else DetectionModel)
    model: YoloModel = cls(deepcopy(arch.yaml), ch=channels, nc=len(names), verbose=False)
    if weights_model is not None and not (arch.yoloe and is_fused(weights_model)):
        if cls_remap:
            model.names = dict(names)
        model.load(weights_model, verbose=False)
    model.nc, model.names, model.args = len(names), dict(names), hyp
    return model


def is_fused(model: YoloModel) -> bool:
    """Whether a YOLOE model's text prompts are already folded into its classification convs."""
    return bool(getattr(model.model[-1], "is_fused", False))


DEFAULT_TEXT_MODEL = "mobileclip:blt"
"""The text model of a YOLOE whose YAML names none (v8, 11); YOLOE-26's says mobileclip2:b."""


def text_model(arch: Arch) -> str:
    """The text model whose embeddings ``arch``'s prompt head was trained on (ultralytics'
    ``YOLOEModel.text_model``: the YAML's ``text_model``, else mobileclip:blt)."""
    return str(arch.yaml.get("text_model") or DEFAULT_TEXT_MODEL)


def load_text_embeddings(path: str, names: list[str], expected_text_model: str | None = None) -> torch.Tensor:
    """The raw text embeddings of ``names`` (in order) from a ``python -m trainer.embed`` file.

    Accepted formats: ``{"names": [...], "embeddings": (N, D), "text_model": "mobileclip:blt"}``
    (what ``trainer.embed`` writes), or a plain ``{name: vector}``.

    Returns:
        A (1, N, D) float tensor.

    Raises:
        TrainerError: missing file, unreadable content, a class with no vector, or a file made
            with another text model than ``expected_text_model`` (the vectors would be the same
            size and silently wrong prompts).
    """
    if not Path(path).is_file():
        raise TrainerError(
            f"--text-embeddings {path}: no such file (make it with: python -m trainer.embed --data DATA --out {path})"
        )
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "names" in obj and "embeddings" in obj:
        made_with = obj.get("text_model")
        if expected_text_model and made_with and made_with != expected_text_model:
            raise TrainerError(
                f"--text-embeddings {path} was made with the text model {made_with}, but this model's "
                f"prompts come from {expected_text_model}: remake it with python -m trainer.embed "
                f"--variant {expected_text_model} --text-encoder FILE"
            )
        obj = dict(zip(obj["names"], obj["embeddings"]))
    if not isinstance(obj, dict):
        raise TrainerError(f"--text-embeddings {path}: expected a mapping of class name -> vector")
    missing = [n for n in names if n not in obj]
    if missing:
        raise TrainerError(
            f"--text-embeddings {path}: no vector for {len(missing)} class(es) of the data YAML, e.g. {missing[:5]} "
            "(regenerate it with python -m trainer.embed for these names)"
        )
    vectors = torch.stack([torch.as_tensor(obj[n], dtype=torch.float32).reshape(-1) for n in names])
    return vectors.unsqueeze(0)


def to_device(model: YoloModel, device: torch.device) -> YoloModel:
    """``model.to(device)``, its YOLOE prompt embeddings ``model.pe`` too: a plain attribute, not a
    buffer, which ``.to`` leaves on the host (one blocking copy to the device per forward)."""
    model = model.to(device)
    if isinstance(getattr(model, "pe", None), torch.Tensor):
        model.pe = model.pe.to(device)
    return model


def prompt_convs(model: YoloModel) -> list[tuple[str, int]]:
    """(branch, scale) of each class-prompt conv, ``cv3[i][2]`` (and ``one2one_cv3[i][2]``)."""
    head = model.model[-1]
    return [(branch, i) for branch in ("cv3", "one2one_cv3") for i in range(len(getattr(head, branch, None) or []))]


def setup_yoloe_prompts(
    model: YoloModel, names: dict[int, str], raw_pe: torch.Tensor | None, weights_model: YoloModel | None, mode: str
) -> None:
    """Turn a YOLOE model into a closed-set detector for ``names`` and choose what trains.

    The offline form of ultralytics' YOLOEPETrainer: text embeddings come from a file instead of
    the CLIP model; they pass through the head's own text projection (``get_tpe``) and are folded
    into the class-prompt convs ``cv3[i][2]`` (``fuse``), which then train in both modes, as in
    YOLOEPETrainer (``fuse`` builds them without gradients). The visual-prompt branch (``savpe``)
    is dropped: it gets no gradient. ``linear`` trains only the prompt convs (YOLOE's train_pe);
    ``full`` trains everything (train_pe_all).

    Raises:
        TrainerError: no embeddings given for a model whose head is not already fused.
    """
    head = model.model[-1]
    if hasattr(head, "savpe"):
        del head.savpe
    class_names = list(names.values())
    model.eval()
    if weights_model is not None and is_fused(weights_model):
        # A YOLOE checkpoint we trained before: rebuild the fused head shape, then load into it.
        model.set_classes(class_names, torch.zeros(1, len(class_names), head.embed))
        head.fuse(model.pe)
        model.load(weights_model, verbose=False)
        model.pe = weights_model.pe
    else:
        if raw_pe is None:
            raise TrainerError(
                "YOLOE needs text-prompt embeddings: pass --text-embeddings FILE "
                "(make it once with: python -m trainer.embed --data DATA --out FILE)"
            )
        with torch.no_grad():
            tpe = head.get_tpe(raw_pe.to(next(model.parameters()).dtype))
        model.set_classes(class_names, tpe)
        head.fuse(model.pe)
    model.train()
    if mode == "linear":
        model.requires_grad_(False)
    for branch, i in prompt_convs(model):
        seq = getattr(head, branch)[i]
        seq[-1] = deepcopy(seq[-1]).requires_grad_(True)  # fused without gradients; the prompt convs always train


def apply_freeze(model: nn.Module, freeze: int | tuple[int | str, ...] | None) -> list[str]:
    """Freeze the layers ultralytics' ``freeze`` names, and the DFL projection (never trained).

    ``freeze=N`` is the first N layers; a list names layer indices or module paths (``23.cv2``).
    Returns the frozen parameter names.

    Raises:
        TrainerError: nothing would be left to train.
    """
    layers = list(range(freeze)) if isinstance(freeze, int) else list(freeze or [])
    prefixes = [f"model.{x}." for x in layers] + [".dfl"]
    frozen = []
    for name, p in model.named_parameters():
        if any(x in name for x in prefixes):
            p.requires_grad_(False)
            frozen.append(name)
    if not any(p.requires_grad for p in model.parameters()):
        raise TrainerError(f"--freeze {freeze} freezes the whole model: nothing would train")
    return frozen


def is_frozen_norm(module: nn.Module) -> bool:
    """A BatchNorm whose weights do not train: its running statistics must not move either."""
    params = list(module.parameters(recurse=False))
    return (
        isinstance(module, nn.modules.batchnorm._BatchNorm)
        and bool(params)
        and not any(p.requires_grad for p in params)
    )


def set_train_mode(model: nn.Module) -> None:
    """Training mode, except BatchNorm in frozen parts, which stays in eval mode (running statistics
    unchanged), as ultralytics does for frozen layers and YOLOE linear probing needs."""
    model.train()
    for module in model.modules():
        if is_frozen_norm(module):
            module.eval()
