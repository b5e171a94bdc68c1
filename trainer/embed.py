"""Compute YOLOE text-prompt embeddings once, where the text model is available.

Usage::

    python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt \\
        [--text-model /models/mobileclip_blt.ts] [--variant mobileclip:blt]

Writes ``{class name: vector}`` (raw text-encoder output, before YOLOE's own projection) with
ultralytics' text model, the same vectors ultralytics caches as
``text_embeddings_mobileclip_blt.pt``. Copy the file next to the data on every node and pass it
with ``--text-embeddings``: no rank then needs the text model or the network.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch


def class_names(data: str | None, names: str | None) -> list[str]:
    """Names from ``--names a,b,c`` or from the data YAML's ``names``."""
    if names:
        return [n.strip() for n in names.split(",") if n.strip()]
    from trainer.data import load_data_yaml

    return list(load_data_yaml(str(data))["names"].values())


def encode(names: list[str], variant: str, weights: str | None, device: str) -> torch.Tensor:
    """(N, D) text embeddings of ``names`` from ultralytics' text encoder.

    ``weights``: a local copy of the encoder (e.g. mobileclip_blt.ts); ultralytics finds it by
    name in the working directory, so we run from the file's directory.
    """
    from ultralytics.nn.text_model import build_text_model

    cwd = os.getcwd()
    try:
        if weights:
            os.chdir(Path(weights).absolute().parent)
        model = build_text_model(variant, device=torch.device(device))
    finally:
        os.chdir(cwd)
    feats = [model.encode_text(tokens, torch.float32) for tokens in model.tokenize(names).split(80)]
    return torch.cat(feats).float().cpu()


def main(argv: list[str] | None = None) -> None:
    """Command line entry: encode the class names and save the mapping."""
    p = argparse.ArgumentParser(prog="python -m trainer.embed", description=__doc__.split("\n\n")[0],
                                epilog="example: python -m trainer.embed --data /data/mine/data.yaml --out /data/mine/text_pe.pt")
    p.add_argument("--data", help="data YAML whose names to encode, e.g. /data/mine/data.yaml")
    p.add_argument("--names", help="comma-separated names instead of --data, e.g. 'person,forklift'")
    p.add_argument("--out", required=True, help="output file, e.g. /data/mine/text_pe.pt")
    p.add_argument("--variant", default="mobileclip:blt", help="ultralytics text model, e.g. mobileclip:blt (YOLOE's) or clip:ViT-B/32")
    p.add_argument("--text-model", help="local encoder file, e.g. /models/mobileclip_blt.ts (else ultralytics fetches it)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    a = p.parse_args(argv)
    if not (a.data or a.names):
        p.error("give --data or --names")
    names = class_names(a.data, a.names)
    vectors = encode(names, a.variant, a.text_model, a.device)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({n: v.clone() for n, v in zip(names, vectors)}, out)
    print(f"{out}: {len(names)} names x {vectors.shape[1]} dims")


if __name__ == "__main__":
    main()
