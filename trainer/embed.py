"""Compute YOLOE text-prompt embeddings once, where the text model is available.

Usage::

    python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt \\
        --text-encoder /models/mobileclip_blt.ts [--variant mobileclip:blt]

Writes ``{"names": [...], "embeddings": (N, D), "text_model": VARIANT}`` (raw text-encoder
output, before YOLOE's own projection) with ultralytics' text model, the same vectors ultralytics
caches as ``text_embeddings_mobileclip_blt.pt``; the trainer refuses a file made with another
text model than the one its YOLOE expects (v8/11: mobileclip:blt, 26: mobileclip2:b). Copy the
file next to the data on every node and pass it with ``--text-embeddings``: no rank then needs the
text model or the network.

It needs the CLIP tokenizer (``import clip``: the ``clip-anytorch`` package on PyPI, or
ultralytics' fork from GitHub, which ultralytics would install at run time and this program does
not) and the text encoder's weights file (ultralytics downloads ``mobileclip_blt.ts``; here it is
``--text-encoder PATH``: nothing is downloaded).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from trainer.errors import TrainerError


def class_names(data: str | None, names: str | None) -> list[str]:
    """Names from ``--names a,b,c`` or from the data YAML's ``names``."""
    if names:
        return [n.strip() for n in names.split(",") if n.strip()]
    from trainer.data import load_data_yaml

    return list(load_data_yaml(str(data))["names"].values())


ENCODER_FILES = {"mobileclip:blt": "mobileclip_blt.ts", "mobileclip2:b": "mobileclip2_b.ts"}
"""The weights file ultralytics loads for each TorchScript text model (by this name, from the cwd)."""


class EmbedError(Exception):
    """What stops ``python -m trainer.embed``, as one line."""


def need_tokenizer() -> None:
    """Refuse, in one line, when ``import clip`` would fail (ultralytics would then try to pip
    install its fork from GitHub).

    Raises:
        EmbedError: no ``clip`` module.
    """
    import importlib.util

    if importlib.util.find_spec("clip") is None:
        raise EmbedError(
            "the CLIP tokenizer is not installed (`import clip`): pip install clip-anytorch (it imports "
            "pkg_resources: on Python >= 3.12 or setuptools >= 81 also pip install 'setuptools<81'), "
            "or ultralytics' fork: pip install git+https://github.com/ultralytics/CLIP.git"
        )


def encoder_file(variant: str, weights: str | None) -> Path | None:
    """The local weights file of ``variant`` (``--text-encoder``), checked; None for ``clip:*``
    variants, which ``clip`` itself loads by name.

    Raises:
        EmbedError: a TorchScript variant without ``--text-encoder``, or a file that is not there.
    """
    if variant not in ENCODER_FILES:
        return Path(weights) if weights else None
    if not weights:
        raise EmbedError(
            f"--variant {variant} needs its text encoder's weights: --text-encoder PATH "
            f"(ultralytics' {ENCODER_FILES[variant]}; this program never downloads it)"
        )
    path = Path(weights)
    if not path.is_file():
        raise EmbedError(f"--text-encoder {weights}: no such file")
    return path


def encode(names: list[str], variant: str, weights: str | None, device: str) -> torch.Tensor:
    """(N, D) text embeddings of ``names`` from ultralytics' text encoder.

    ``weights``: a local copy of the encoder (e.g. mobileclip_blt.ts); ultralytics opens it by its
    own name in the working directory, so it is linked there under that name in a scratch
    directory and the encoder is built from there.
    """
    import tempfile

    need_tokenizer()
    path = encoder_file(variant, weights)
    from ultralytics.nn.text_model import build_text_model

    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as scratch:
        if path is not None and variant in ENCODER_FILES:
            os.symlink(path.absolute(), Path(scratch) / ENCODER_FILES[variant])
        try:
            os.chdir(scratch)
            model = build_text_model(variant, device=torch.device(device))
        finally:
            os.chdir(cwd)
    feats = [model.encode_text(tokens, torch.float32) for tokens in model.tokenize(names).split(80)]
    return torch.cat(feats).float().cpu()


def main(argv: list[str] | None = None) -> None:
    """Command line entry: encode the class names and save them with the text model's name."""
    import sys

    p = argparse.ArgumentParser(
        prog="python -m trainer.embed",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt "
        "--text-encoder /models/mobileclip_blt.ts",
    )
    p.add_argument("--data", help="data YAML whose names to encode, e.g. /data/mine/data.yaml")
    p.add_argument("--names", help="comma-separated names instead of --data, e.g. 'person,forklift'")
    p.add_argument("--out", required=True, help="output file, e.g. /data/mine/text_pe.pt")
    p.add_argument(
        "--variant",
        default="mobileclip:blt",
        help="ultralytics text model: mobileclip:blt (YOLOE v8/11, the default), mobileclip2:b (YOLOE-26)",
    )
    p.add_argument(
        "--text-encoder",
        "--text-model",
        dest="text_encoder",
        help="the text encoder's weights file, e.g. /models/mobileclip_blt.ts"
        " (required for mobileclip; never downloaded)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    a = p.parse_args(argv)
    if not (a.data or a.names):
        p.error("give --data or --names")
    try:
        names = class_names(a.data, a.names)
        vectors = encode(names, a.variant, a.text_encoder, a.device)
    except (EmbedError, TrainerError) as e:
        print(f"python -m trainer.embed: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"names": list(names), "embeddings": vectors.clone(), "text_model": a.variant}, out)
    print(f"{out}: {len(names)} names x {vectors.shape[1]} dims ({a.variant})")


if __name__ == "__main__":
    main()
