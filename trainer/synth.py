"""Write a small, real YOLO-format dataset of drawn shapes, for demos and tests.

Usage: ``python -m trainer.synth DIR --images 32 --classes 3 --imgsz 64``

Each class is a shape with its own colour (filled square, disc, triangle, ...), so a model can
actually learn it. Writes ``DIR/images/{train,val}/*.jpg``, matching ``DIR/labels/...`` and
``DIR/data.yaml`` with an absolute ``path`` and ``names``. ``--segments`` writes polygon labels
too (for the ``-seg`` models).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cv2
import numpy as np
import yaml

SHAPES = ("square", "disc", "triangle", "cross", "diamond", "ring", "bar", "hexagon")
COLOURS = (
    (230, 60, 60),
    (60, 200, 60),
    (60, 90, 230),
    (230, 200, 40),
    (200, 60, 220),
    (40, 210, 210),
    (240, 140, 30),
    (130, 130, 130),
)


def _polygon(shape: str, cx: float, cy: float, r: float) -> np.ndarray:
    """Outline of ``shape`` centred at (cx, cy) with half-size r, as an (N, 2) float array."""
    if shape in ("disc", "ring"):
        t = np.linspace(0, 2 * np.pi, 24, endpoint=False)
        return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
    if shape == "triangle":
        return np.array([[cx, cy - r], [cx + r, cy + r], [cx - r, cy + r]])
    if shape == "diamond":
        return np.array([[cx, cy - r], [cx + r, cy], [cx, cy + r], [cx - r, cy]])
    if shape == "hexagon":
        t = np.linspace(0, 2 * np.pi, 6, endpoint=False)
        return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
    if shape == "bar":
        return np.array([[cx - r, cy - r / 3], [cx + r, cy - r / 3], [cx + r, cy + r / 3], [cx - r, cy + r / 3]])
    # square and cross share a square outline (the cross is drawn inside it)
    return np.array([[cx - r, cy - r], [cx + r, cy - r], [cx + r, cy + r], [cx - r, cy + r]])


def draw_image(rng: np.random.Generator, imgsz: int, classes: int, max_objects: int) -> tuple[np.ndarray, list]:
    """One image and its objects as ``(class, polygon)`` pairs, polygons in pixels."""
    img = np.full((imgsz, imgsz, 3), rng.integers(0, 60, 3), dtype=np.uint8)
    img = np.clip(img + rng.normal(0, 8, img.shape), 0, 255).astype(np.uint8)
    objects = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        k = int(rng.integers(0, classes))
        r = float(rng.uniform(0.08, 0.2) * imgsz)
        cx, cy = rng.uniform(r, imgsz - r, 2)
        poly = _polygon(SHAPES[k % len(SHAPES)], cx, cy, r)
        colour = tuple(int(c) for c in COLOURS[k % len(COLOURS)])[::-1]  # cv2 draws BGR
        pts = poly.round().astype(np.int32)
        if SHAPES[k % len(SHAPES)] == "ring":
            cv2.polylines(img, [pts], True, colour, max(2, int(r / 4)))
        else:
            cv2.fillPoly(img, [pts], colour)
        if SHAPES[k % len(SHAPES)] == "cross":
            cv2.line(img, (int(cx - r), int(cy - r)), (int(cx + r), int(cy + r)), (0, 0, 0), max(1, int(r / 5)))
            cv2.line(img, (int(cx - r), int(cy + r)), (int(cx + r), int(cy - r)), (0, 0, 0), max(1, int(r / 5)))
        objects.append((k, poly))
    return img, objects


def label_line(k: int, poly: np.ndarray, imgsz: int, segments: bool) -> str:
    """One YOLO label line: ``k cx cy w h`` normalized, or ``k x1 y1 x2 y2 ...`` for segments."""
    p = np.clip(poly / imgsz, 0, 1)
    if segments:
        return f"{k} " + " ".join(f"{v:.6f}" for v in p.reshape(-1))
    (x0, y0), (x1, y1) = p.min(0), p.max(0)
    return f"{k} {(x0 + x1) / 2:.6f} {(y0 + y1) / 2:.6f} {x1 - x0:.6f} {y1 - y0:.6f}"


def write_dataset(
    root: Path,
    images: int,
    classes: int,
    imgsz: int,
    val_fraction: float = 0.25,
    seed: int = 0,
    segments: bool = False,
    max_objects: int = 3,
) -> Path:
    """Write the dataset under ``root`` and return the absolute path of its data YAML."""
    if classes < 1 or classes > len(SHAPES):
        raise ValueError(f"--classes must be 1..{len(SHAPES)}, got {classes}")
    root = root.absolute()
    rng = np.random.default_rng(seed)
    n_val = max(1, round(images * val_fraction))
    for i in range(images):
        split = "val" if i >= images - n_val else "train"
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        img, objects = draw_image(rng, imgsz, classes, max_objects)
        cv2.imwrite(str(root / "images" / split / f"{i:06d}.jpg"), img)
        lines = [label_line(k, poly, imgsz, segments) for k, poly in objects]
        (root / "labels" / split / f"{i:06d}.txt").write_text("\n".join(lines) + "\n")
    data = {
        "path": str(root),
        "train": "images/train",
        "val": "images/val",
        "names": {k: SHAPES[k] for k in range(classes)},
    }
    out = root / "data.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m trainer.synth DIR --images N --classes K --imgsz S``."""
    p = argparse.ArgumentParser(
        prog="python -m trainer.synth",
        description=__doc__.split("\n\n")[0],
        epilog="example: python -m trainer.synth /tmp/shapes --images 64 --classes 3 --imgsz 128",
    )
    p.add_argument("dir", type=Path, help="output directory, e.g. /tmp/shapes")
    p.add_argument("--images", type=int, default=64, help="total images, train + val (default 64)")
    p.add_argument("--classes", type=int, default=3, help=f"number of classes, 1..{len(SHAPES)} (default 3)")
    p.add_argument("--imgsz", type=int, default=128, help="image side in pixels (default 128)")
    p.add_argument("--val-fraction", type=float, default=0.25, help="share of images in val (default 0.25)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--segments", action="store_true", help="write polygon labels (for -seg models)")
    a = p.parse_args(argv)
    path = write_dataset(a.dir, a.images, a.classes, a.imgsz, a.val_fraction, a.seed, a.segments)
    print(path)


if __name__ == "__main__":
    main()
