"""Build the network: YOLO12 or YOLOE, from a YAML or a checkpoint, with YOLOE text prompts from a file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from trainer.errors import TrainerError


def task_of(model_name: str) -> str:
    """``segment`` for ``*-seg`` architectures, else ``detect``."""
    return "segment" if Path(model_name).stem.endswith("-seg") else "detect"


def is_yoloe(model_name: str) -> bool:
    """Whether the architecture is a YOLOE (prompted) one."""
    return Path(model_name).name.startswith("yoloe")


def load_weights(path: str) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint: its (EMA) model in fp32 and the raw dict.

    Raises:
        TrainerError: the file does not exist (named, never downloaded) or is not a checkpoint.
    """
    from ultralytics.nn.tasks import load_checkpoint

    if not Path(path).is_file():
        raise TrainerError(f"--weights {path}: no such file (the trainer never downloads weights; copy it to every node)")
    try:
        return load_checkpoint(path)
    except (TypeError, RuntimeError, KeyError, AttributeError) as e:
        raise TrainerError(f"--weights {path}: not an ultralytics checkpoint ({str(e).splitlines()[0]})") from None


def architecture(model: str | None, weights_model: nn.Module | None) -> str | dict[str, Any]:
    """The YAML (file name or dict) to build: ``--model`` if given, else the checkpoint's own."""
    if model:
        return model
    if weights_model is not None:
        return weights_model.yaml
    return "yolo12n.yaml"


def build_model(arch: str | dict[str, Any], names: dict[int, str], hyp: SimpleNamespace,
                weights_model: nn.Module | None) -> nn.Module:
    """The ultralytics model for ``arch`` with ``len(names)`` classes, pretrained weights transferred.

    The scale (n/s/m/l/x) is read from the YAML file name, so pass ``yolo12s.yaml``, not ``yolo12.yaml``.

    Raises:
        TrainerError: an architecture ultralytics does not know.
    """
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel, YOLOEModel, YOLOESegModel

    name = arch if isinstance(arch, str) else str(arch.get("yaml_file", ""))
    yoloe, seg = is_yoloe(name), task_of(name) == "segment"
    cls = (YOLOESegModel if seg else YOLOEModel) if yoloe else (SegmentationModel if seg else DetectionModel)
    try:
        model = cls(arch, ch=3, nc=len(names), verbose=False)
    except FileNotFoundError:
        raise TrainerError(f"--model {name}: unknown architecture (e.g. yolo12s.yaml, yoloe-11m.yaml, yoloe-v8l-seg.yaml)") from None
    if weights_model is not None and not (yoloe and getattr(weights_model.model[-1], "is_fused", False)):
        model.load(weights_model, verbose=False)
    model.nc, model.names, model.args = len(names), names, hyp
    return model


def load_text_embeddings(path: str, names: list[str]) -> torch.Tensor:
    """The raw text embeddings of ``names`` (in order) from a ``python -m trainer.embed`` file.

    Accepted formats: ``{name: vector}``, or ``{"names": [...], "embeddings": (N, D)}``.

    Returns:
        A (1, N, D) float tensor.

    Raises:
        TrainerError: missing file, unreadable content, or a class with no vector.
    """
    if not Path(path).is_file():
        raise TrainerError(f"--text-embeddings {path}: no such file (make it with: python -m trainer.embed --data DATA --out {path})")
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "names" in obj and "embeddings" in obj:
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


def setup_yoloe_prompts(model: nn.Module, names: dict[int, str], raw_pe: torch.Tensor | None,
                        weights_model: nn.Module | None, mode: str) -> None:
    """Turn a YOLOE model into a closed-set detector for ``names`` and choose what trains.

    The offline form of ultralytics' YOLOEPETrainer: text embeddings come from a file instead of
    the CLIP model; they pass through the head's own text projection (``get_tpe``) and are folded
    into the classification convs (``fuse``). The visual-prompt branch (``savpe``) is dropped: it
    gets no gradient, which would stall DDP. ``linear`` trains only the last classification conv
    of each scale (YOLOE train_pe); ``full`` trains everything (train_pe_all).

    Raises:
        TrainerError: no embeddings given for a model whose head is not already fused.
    """
    head = model.model[-1]
    if hasattr(head, "savpe"):
        del head.savpe
    class_names = list(names.values())
    model.eval()
    if weights_model is not None and getattr(weights_model.model[-1], "is_fused", False):
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
        for branch in ("cv3", "one2one_cv3"):
            for seq in getattr(head, branch, None) or []:
                seq[-1].requires_grad_(True)


def freeze_dfl(model: nn.Module) -> None:
    """The DFL conv is a fixed projection; ultralytics never trains it."""
    for name, p in model.named_parameters():
        if ".dfl" in name:
            p.requires_grad_(False)
