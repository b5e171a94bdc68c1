"""Data YAML checks and the train/val loaders over ultralytics' YOLO datasets and augmentation."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, get_worker_info

from trainer import dist as tdist
from trainer.dist import Topology
from trainer.errors import TrainerError


def load_data_yaml(path: str) -> dict[str, Any]:
    """Read and check a YOLO data YAML without ultralytics' downloads and font check.

    Returns the dict ultralytics' datasets expect: absolute ``train``/``val`` paths, ``names``
    as ``{index: name}``, ``nc`` and ``channels``.

    Raises:
        TrainerError: missing file, no ``names`` (or empty), missing ``train``/``val``, a split
            path that does not exist, or a ``download:`` key (the trainer never downloads).
    """
    file = Path(path)
    if not file.is_file():
        raise TrainerError(f"--data {path}: no such file")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        raise TrainerError(f"--data {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise TrainerError(f"--data {path}: expected a mapping with train, val and names")
    names = raw.get("names")
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise TrainerError(
            f"--data {path}: 'names' is missing or empty; list the class names, e.g. names: [person, car] "
            "(every rank builds its class table from it; for one class use names: [object])"
        )
    names = {int(k): str(v) for k, v in names.items()}
    if sorted(names) != list(range(len(names))):
        raise TrainerError(f"--data {path}: 'names' keys must be 0..{len(names) - 1}, got {sorted(names)}")
    root = Path(raw.get("path") or file.parent)
    if not root.is_absolute():
        root = (file.parent / root).resolve()
    data: dict[str, Any] = {
        "path": str(root),
        "names": names,
        "nc": len(names),
        "channels": int(raw.get("channels", 3)),
    }
    for split in ("train", "val"):
        data[split] = _resolve_split(path, raw, split, root)
    return data


def _resolve_split(path: str, raw: dict[str, Any], split: str, root: Path) -> list[str]:
    """Absolute paths of one split; each must exist (we never follow ``download:``)."""
    value = raw.get(split)
    if not value:
        raise TrainerError(f"--data {path}: no '{split}' entry")
    out = []
    for item in value if isinstance(value, list) else [value]:
        p = Path(item) if Path(item).is_absolute() else root / item
        if not p.exists():
            hint = " (the trainer never downloads; fetch the dataset first)" if raw.get("download") else ""
            raise TrainerError(f"--data {path}: {split} path {p} does not exist{hint}")
        out.append(str(p))
    return out


IMAGE_SUFFIXES = frozenset({".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm", ".heic"})
LABEL_SAMPLE = 64
"""How many label files of each split `check_labels_fit` reads (the first, in path order)."""


def _images(split: str, limit: int) -> list[Path]:
    """The first `limit` images of a split entry: a directory (walked in name order) or a list file."""
    p = Path(split)
    if p.is_file() and p.suffix == ".txt":
        lines = [t.strip() for t in p.read_text(errors="replace").splitlines()[:limit] if t.strip()]
        return [Path(t) if Path(t).is_absolute() else p.parent / t for t in lines]
    out: list[Path] = []
    for folder, dirs, files in os.walk(p):
        dirs.sort()
        out += [Path(folder) / f for f in sorted(files) if Path(f).suffix.lower() in IMAGE_SUFFIXES]
        if len(out) >= limit:
            break
    return out[:limit]


def label_of(image: Path) -> Path:
    """ultralytics' label file of an image: the last `images` folder of its path made `labels`, `.txt`."""
    parts = list(image.parts)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def check_labels_fit(data: dict[str, Any], task: str, path: str, model: str) -> None:
    """Refuse a segment (or OBB) model on a dataset whose labels are boxes only, before any rank
    starts: ultralytics would raise on one rank at the first batch, after the start-up. Reads the
    first `LABEL_SAMPLE` label files of each split.

    Raises:
        TrainerError: a label line of 5 values (class and box) where the task needs a polygon.
    """
    if task not in ("segment", "obb"):
        return
    for split in ("train", "val"):
        for entry in data[split]:
            for image in _images(entry, LABEL_SAMPLE):
                label = label_of(image)
                try:
                    lines = label.read_text(errors="replace").splitlines()
                except OSError:
                    continue
                for n, line in enumerate(lines, 1):
                    if len(line.split()) == 5:
                        wants = (
                            "an oriented box (class x1 y1 ... x4 y4)"
                            if task == "obb"
                            else "a polygon (class x1 y1 x2 y2 ...)"
                        )
                        raise TrainerError(
                            f"--data {path}: {label}:{n} is a box (class x y w h), but {model} is a {task} model "
                            f"whose labels need {wants}: use a detection model (e.g. without -seg), or a "
                            f"{task} dataset"
                        )


@contextmanager
def one_writer_first(topo: Topology) -> Iterator[None]:
    """Let rank 0 go first, then each node's local rank 0, then everyone else.

    Building a dataset writes ``labels.cache`` next to the labels. Rank 0 writes it once (on a
    shared file system everyone then reads it); on node-local storage each node's first rank
    writes its own. Never two writers of the same file at once. The barriers are the start-up's
    (a gloo group with the long start-up timeout): a label scan at COCO scale takes minutes.
    """
    phase = 0 if topo.rank == 0 else 1 if topo.local_rank == 0 else 2
    for turn in range(3):
        if turn == phase:
            yield
        tdist.startup_barrier()


def write_label_caches(hyp: Any, data: dict[str, Any], splits: tuple[str, ...], stride: int) -> None:
    """Scan the labels of ``splits`` so that ultralytics writes (or validates) each ``labels.cache``,
    without caching any image: the only part of a dataset build that writes a file, the part
    ``one_writer_first`` serializes. The builds that follow then run on every rank at once and only
    read the cache; image caching follows, node by node (``build_splits``)."""
    from types import SimpleNamespace

    scan = SimpleNamespace(**{**vars(hyp), "cache": False})
    for split in splits:
        build_dataset(scan, data, split, 1, stride)


def without_cache(hyp: Any) -> Any:
    """``hyp`` with image caching off: every rank builds its datasets so, then ``cache_images``
    caches them node by node."""
    from types import SimpleNamespace

    return SimpleNamespace(**{**vars(hyp), "cache": False})


def cache_mode(cache: Any) -> str | None:
    """ultralytics' reading of ``cache``: ram (True or "ram"), disk, or None."""
    return cache.lower() if isinstance(cache, str) else "ram" if cache is True else None


RAM_MARGIN = 1.0
"""ultralytics' safety margin of its RAM check (``check_cache_ram``): twice the images' bytes."""


def cache_bytes(dataset: Any) -> int:
    """The bytes ``dataset``'s images take cached in RAM, as ultralytics' ``load_image`` resizes them
    (long side to imgsz): exact from the label scan's image shapes; an image whose shape the dataset
    no longer holds (rect validation sets pop them) counts as imgsz x imgsz, an upper bound."""
    size = max(dataset.imgsz) if isinstance(dataset.imgsz, (tuple, list)) else int(dataset.imgsz)
    channels = int(getattr(dataset, "channels", 3))
    total = 0
    for label in dataset.labels:
        shape = label.get("shape")
        if shape is None:
            total += size * size * channels
            continue
        h0, w0 = int(shape[0]), int(shape[1])
        r = size / max(h0, w0)
        h, w = (min(math.ceil(h0 * r), size), min(math.ceil(w0 * r), size)) if r != 1 else (h0, w0)
        total += h * w * channels
    return total


def ram_cache_fits(dataset: Any, ranks: int) -> tuple[bool, str]:
    """Whether every one of this node's ``ranks`` can hold ``dataset``'s images in RAM: ultralytics'
    check (the images' bytes x 2 against the available memory), for the node's ranks together, and
    the warning when they cannot."""
    import psutil

    gb = 1 << 30
    each = cache_bytes(dataset) * (1 + RAM_MARGIN)
    available = psutil.virtual_memory().available
    if each * ranks <= available:
        return True, ""
    split = "training" if dataset.augment else "validation"
    return False, (
        f"warning: --cache ram: not caching the {len(dataset.labels)} {split} images: "
        f"{each * ranks / gb:.1f} GB of RAM needed for the {ranks} rank(s) of this node "
        f"({each / gb:.1f} GB each, with ultralytics' 100% margin) but {available / gb:.1f} GB available "
        "(--cache disk caches once per node; or fewer ranks per node)"
    )


def cache_images(datasets: list[Any], cache: Any, topo: Topology) -> None:
    """Cache the images of ``datasets`` (built ``without_cache``) as ultralytics' ``cache`` says, one
    builder per node: with ``disk`` only the first rank of each node writes the .npy files, in
    ``one_writer_first``'s turns (rank 0 first: on a shared file system the others find them
    written), and the node's other ranks then read them; with ``ram`` every rank needs its own copy,
    so the check counts the node's ranks (decided by every rank before any caches, so all see the
    same free memory), the node's first rank caches first (the images' first read, from storage)
    and the others after it. Collective over the start-up group when ``cache`` is set."""
    from trainer.logs import say

    mode = cache_mode(cache)
    if mode == "disk":
        with one_writer_first(topo):
            for ds in datasets:
                if topo.local_rank == 0:
                    ds.cache = "disk"
                    if ds.check_cache_disk():  # ultralytics' own check and warning; it unsets cache
                        ds.cache_images()
                else:
                    ds.cache = "disk"  # written by this node's first rank: read them
    elif mode == "ram":
        fits = [ram_cache_fits(ds, topo.local_world_size) for ds in datasets]
        if topo.local_rank == 0:
            for _, why in fits:
                if why:
                    say(why)
        phase = 0 if topo.local_rank == 0 else 1
        for turn in range(2):
            tdist.startup_barrier()
            if turn == phase:
                for ds, (ok, _) in zip(datasets, fits):
                    if ok:
                        ds.cache = "ram"
                        ds.cache_images()


def build_splits(
    hyp: Any, data: dict[str, Any], local_batch: int, stride: int, topo: Topology, val: bool
) -> tuple[Any, Any]:
    """The training dataset and (with ``val``) the validation one, their images cached as ``hyp.cache``
    says, one builder per node (``cache_images``). Collective over the start-up group with a cache."""
    uncached = without_cache(hyp)
    train = build_dataset(uncached, data, "train", local_batch, stride)
    valid = build_dataset(uncached, data, "val", local_batch * 2, stride) if val else None
    cache_images([ds for ds in (train, valid) if ds is not None], hyp.cache, topo)
    return train, valid


class Heartbeat:
    """While a long start-up step runs, this node's first rank says so every ``every_s`` seconds
    (``startup: building datasets, 90 s so far``): the user sees it work, and orch's stall
    watchdog, which counts silence, sees a line. Once the node's own part is done and a start-up
    barrier waits for other ranks, the line says which (``startup: building datasets: waiting
    for rank(s) 5, 7, 120 s so far``, from ``dist.WAITING``): a rank that died or hangs there is
    named, not the ones waiting for it. A daemon thread; ``with Heartbeat(...):``."""

    def __init__(self, what: str, topo: Topology, every_s: float) -> None:
        import threading

        self.what, self.every_s = what, every_s
        self.missing: list[int] = []
        self.on = topo.local_rank == 0 and every_s > 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trainer-heartbeat", daemon=True)

    def waiting(self, missing: list[int]) -> None:
        """A start-up barrier waits for the ranks ``missing`` (``dist.WAITING``)."""
        self.missing = list(missing)

    def text(self, seconds: float) -> str:
        """The heartbeat line after ``seconds``."""
        missing = self.missing
        if missing:
            ranks = ", ".join(map(str, missing[:16])) + (f" and {len(missing) - 16} more" if len(missing) > 16 else "")
            return f"startup: {self.what}: waiting for rank(s) {ranks}, {seconds:.0f} s so far"
        return f"startup: {self.what}, {seconds:.0f} s so far"

    def _run(self) -> None:
        import time

        from trainer.logs import say

        start = time.monotonic()
        while not self.stop.wait(self.every_s):
            say(self.text(time.monotonic() - start))

    def __enter__(self) -> Heartbeat:
        tdist.WAITING.append(self.waiting)
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        tdist.WAITING.remove(self.waiting)
        if self.on:
            self.thread.join()


def build_dataset(hyp: Any, data: dict[str, Any], split: str, local_batch: int, stride: int) -> Any:
    """An ultralytics YOLODataset (augmented for train, letterboxed rect batches for val)."""
    from ultralytics.data import build_yolo_dataset

    mode = "train" if split == "train" else "val"
    return build_yolo_dataset(hyp, data[split], local_batch, data, mode=mode, rect=mode == "val", stride=stride)


class ShardSampler(DistributedSampler):
    """This rank's shard of the epoch's order, as DistributedSampler draws it (one permutation of
    the whole set, the same on every rank, padded to a multiple of the ranks), for each attempt at
    an epoch: attempt 0 is DistributedSampler's own order (a resumed run continues it exactly); an
    epoch trained again after a NaN recovery (attempt 1, 2...) another one, drawn from (seed,
    epoch, attempt). Images left out (``set_epoch(left_out=...)``, by file) are dropped from the
    order before it is padded and sharded, so every rank still trains the same number of batches."""

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.attempt = 0
        self.left_out: frozenset[int] = frozenset()
        self._index: dict[str, int] | None = None

    def set_epoch(self, epoch: int, attempt: int = 0, left_out: Collection[str] = ()) -> None:
        super().set_epoch(epoch)
        self.attempt = attempt
        if left_out and self._index is None:
            self._index = {f: i for i, f in enumerate(self.dataset.im_files)}  # type: ignore[attr-defined]
        self.left_out = frozenset(self._index[f] for f in left_out if f in self._index) if self._index else frozenset()
        if len(self.left_out) >= len(self.dataset):  # type: ignore[arg-type]
            raise TrainerError(
                f"every one of the {len(self.left_out)} training images was left out after a non-finite loss: "
                "check the labels (boxes outside the image, empty files) and the learning rate"
            )

    def __iter__(self) -> Iterator[int]:
        if not self.attempt and not self.left_out:
            return super().__iter__()
        g = torch.Generator()
        if self.attempt:
            g.manual_seed(int(np.random.SeedSequence([self.seed, self.epoch, self.attempt]).generate_state(1)[0]))
        else:
            g.manual_seed(self.seed + self.epoch)  # DistributedSampler's order, less the images left out
        order = [i for i in torch.randperm(len(self.dataset), generator=g).tolist() if i not in self.left_out]  # type: ignore[arg-type]
        total = math.ceil(len(order) / self.num_replicas) * self.num_replicas
        order += (order * math.ceil(total / len(order)))[: total - len(order)]
        return iter(order[self.rank : total : self.num_replicas])

    def __len__(self) -> int:
        return math.ceil((len(self.dataset) - len(self.left_out)) / self.num_replicas)  # type: ignore[arg-type]


class EpochSampler(Sampler[tuple[int, int, int]]):
    """A ``ShardSampler``'s indices, each tagged with the epoch it belongs to and the attempt at
    that epoch: (epoch, index, attempt). The attempt is 0 unless the epoch is trained again after a
    NaN recovery (``loop.recover``): another attempt draws another order and other augmentation."""

    def __init__(self, sampler: ShardSampler) -> None:
        self.sampler = sampler
        self.epoch = 0
        self.attempt = 0

    def set_epoch(self, epoch: int, attempt: int = 0, left_out: Collection[str] = ()) -> None:
        self.epoch, self.attempt = epoch, attempt
        self.sampler.set_epoch(epoch, attempt, left_out)

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        epoch, attempt = self.epoch, self.attempt
        return ((epoch, i, attempt) for i in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def restore_buffer(dataset: Any, indices: list[int]) -> None:
    """Put ``dataset``'s mosaic buffer back as it was: the same images loaded in the same order.

    Mosaic draws its partner images from the buffer of recently loaded images (ultralytics'
    ``BaseDataset.buffer``, in memory, bounded by ``max_buffer_length``); reloading those indices
    in order makes the buffer and the images cached with it what they were when it was saved.
    """
    dataset.buffer.clear()
    for i in indices:
        dataset.load_image(i)


class EpochSeeded(Dataset[Any]):
    """The training dataset as loader workers see it: at the first item of each epoch a worker
    restarts python's, numpy's and torch's generators (the augmentation's) from (seed, rank,
    epoch, worker id).

    A persistent worker's generators otherwise carry on from every epoch before, which a
    checkpoint cannot capture (they live in the worker processes), so a resumed run augmented
    differently from an uninterrupted one. Now each epoch's augmentation depends only on the run's
    seed, the rank and the epoch: `--resume` continues exactly with workers too. (The batches go to
    the workers round-robin from worker 0 each epoch, so which worker draws what is fixed too.)
    The other state a worker keeps, its mosaic buffer, travels with every batch it sends
    (``mosaic_collate``) and is put back by ``restore`` in the first epoch after a resume.
    An epoch trained again after a NaN recovery (attempt 1, 2...) restarts from another seed
    (``epoch_seed``): other augmentation (ultralytics' recovery does not rewind its generators
    either), over another order (``ShardSampler``).
    """

    def __init__(self, dataset: Any, seed: int, rank: int, restore: dict[int, list[int]] | None = None) -> None:
        self.dataset = dataset
        self.seed = seed
        self.rank = rank
        self.restore = restore
        """Worker id -> the mosaic buffer it had when the checkpoint was written (a resumed run only)."""
        self.epoch: tuple[int, int] | None = None  # (epoch, attempt) per worker: each holds its own copy

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int, int]) -> Any:
        epoch, index, attempt = key
        if (epoch, attempt) != self.epoch:
            info = get_worker_info()
            worker = info.id if info is not None else -1
            if self.epoch is None and self.restore and worker in self.restore:
                restore_buffer(self.dataset, self.restore[worker])
            self.epoch = (epoch, attempt)
            state = epoch_seed(self.seed, self.rank, epoch, worker, attempt)
            random.seed(state)
            np.random.seed(state)
            torch.manual_seed(state)
        return self.dataset[index]


def epoch_seed(seed: int, rank: int, epoch: int, worker: int, attempt: int = 0) -> int:
    """A loader worker's seed for one epoch (``EpochSeeded``): a function of the run's seed, the rank,
    the epoch, the worker (-1: this process) and, from the second attempt at an epoch on, the attempt."""
    entropy = [seed, rank, epoch, worker + 1, *([attempt] if attempt else [])]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


MOSAIC_KEY = "mosaic_buffer"
"""Batch entry a loader worker adds: (worker id, its mosaic buffer after this batch)."""


class MosaicCollate:
    """The dataset's collate function, plus the worker's mosaic buffer (a list of at most
    ``max_buffer_length`` indices) so the main process knows every worker's buffer at a checkpoint."""

    def __init__(self, collate: Any) -> None:
        self.collate = collate

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        batch = self.collate(items)
        info = get_worker_info()
        if info is not None:
            source: Any = info.dataset  # this worker's EpochSeeded copy
            batch[MOSAIC_KEY] = (info.id, list(source.dataset.buffer))
        return batch


def worker_count(workers: int, local_world_size: int, batches: int) -> int:
    """Loader workers per rank: at most this node's CPUs shared by its ranks, and no more than there
    are batches (as ultralytics' build_dataloader)."""
    cpus = os.cpu_count() or 1
    return max(0, min(workers, cpus // max(local_world_size, 1), batches if batches > 1 else 0))


def train_loader(
    dataset: Any,
    local_batch: int,
    workers: int,
    seed: int,
    topo: Topology,
    device: torch.device,
    pin_memory: bool = True,
    persistent: bool = True,
    restore: dict[int, list[int]] | None = None,
) -> DataLoader:
    """The training loader: a DistributedSampler with the same seed on every rank.

    ultralytics' InfiniteDataLoader keeps one iterator across epochs, which prefetches the next
    epoch before ``set_epoch`` runs, so two epochs share an order (yolov5#6741). A plain
    DataLoader with persistent workers draws the sampler's order when the epoch starts. With
    workers, each worker's augmentation restarts every epoch from a seed of its own (EpochSeeded);
    without, it runs in this process, whose generators a checkpoint saves.
    """
    from ultralytics.data.build import seed_worker

    sampler = ShardSampler(dataset, topo.world_size, topo.rank, seed)
    generator = torch.Generator()
    generator.manual_seed(seed + topo.rank)  # worker augmentation streams differ per rank, same per run
    nw = worker_count(workers, topo.local_world_size, math.ceil(len(sampler) / max(local_batch, 1)))
    source: Any = EpochSeeded(dataset, seed, topo.rank, restore) if nw > 0 else dataset
    order: Any = EpochSampler(sampler) if nw > 0 else sampler
    return DataLoader(
        source,
        batch_size=local_batch,
        sampler=order,
        num_workers=nw,
        pin_memory=pin_memory and device.type == "cuda",
        collate_fn=MosaicCollate(dataset.collate_fn),
        worker_init_fn=seed_worker,
        generator=generator,
        persistent_workers=persistent and nw > 0,
        drop_last=False,
        prefetch_factor=4 if nw > 0 else None,
    )


def val_loader(dataset: Any, local_batch: int, workers: int, topo: Topology, device: torch.device) -> Any:
    """ultralytics' validation loader: contiguous, unpadded shards so each image counts once; twice
    the training workers, as its trainer gives validation (capped by this node's CPUs per rank)."""
    from ultralytics.data import build_dataloader

    rank = topo.local_rank if topo.distributed else -1  # only a switch: the sampler asks the process group
    cap = (os.cpu_count() or 1) // max(topo.local_world_size, 1)
    return build_dataloader(dataset, local_batch, min(workers * 2, cap), shuffle=False, rank=rank, device=device)
