"""Image caching with several ranks on a node, one builder per node: fake ranks (threads, each with
its own Topology) meet at the start-up barriers (a threading.Barrier), build their datasets as a
start does (``data.build_splits``) and cache them on CPU."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainer.offline import set_offline_env

set_offline_env()  # before ultralytics is imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import make_dataset  # noqa: E402

from trainer import data as tdata  # noqa: E402
from trainer import dist as tdist  # noqa: E402
from trainer import loop  # noqa: E402
from trainer.config import parse_config  # noqa: E402
from trainer.dist import Topology  # noqa: E402

pytestmark = [pytest.mark.timeout(300)]

IMGSZ = 64
TRAIN, VAL = 9, 3  # make_dataset(images=12): a quarter for validation
IMAGE_BYTES = IMGSZ * IMGSZ * 3  # the synthetic images are square at imgsz


def hyp_of(data: Path, cache: str) -> Any:
    import torch

    return loop.prepare(
        parse_config(["--data", str(data), "--imgsz", str(IMGSZ), "--batch", "2", "--cache", cache]),
        Topology(),
        torch.device("cpu"),
    ).hyp


class Ranks:
    """Fake ranks of ``nodes`` x ``per_node``: each thread is one rank; what each did, in order."""

    def __init__(self, nodes: int, per_node: int, monkeypatch: pytest.MonkeyPatch) -> None:
        from ultralytics.data.base import BaseDataset

        world = nodes * per_node
        self.topos = [
            Topology(rank=r, local_rank=r % per_node, world_size=world, launched=True, local_world_size=per_node)
            for r in range(world)
        ]
        self.barrier = threading.Barrier(world, timeout=120)
        self.lock = threading.Lock()
        self.events: list[tuple[str, int]] = []
        self.written: list[str] = []
        self.local = threading.local()
        monkeypatch.setattr(tdist, "startup_barrier", lambda: self.barrier.wait())
        real_cache, real_disk = BaseDataset.cache_images, BaseDataset.cache_images_to_disk
        ranks = self

        def cache_images(ds: Any) -> None:
            ranks.note("start", ranks.local.rank)
            real_cache(ds)
            ranks.note("end", ranks.local.rank)

        def to_disk(ds: Any, i: int) -> None:
            new = not ds.npy_files[i].exists()
            real_disk(ds, i)
            if new:
                with ranks.lock:
                    ranks.written.append(ds.npy_files[i].name)

        monkeypatch.setattr(BaseDataset, "cache_images", cache_images)
        monkeypatch.setattr(BaseDataset, "cache_images_to_disk", to_disk)

    def note(self, what: str, rank: int) -> None:
        with self.lock:
            self.events.append((what, rank))

    def run(self, hyp: Any, data: dict[str, Any]) -> list[tuple[Any, Any]]:
        out: list[Any] = [None] * len(self.topos)
        errors: list[BaseException] = []
        # as the trainer's start-up does before build_splits (loop.py, one_writer_first): the
        # labels.cache files are written once, so the ranks' builds only read them (three threads
        # writing one train.cache at once: one read it while another had it unlinked)
        tdata.write_label_caches(hyp, data, ("train", "val"), 32)

        def rank(topo: Topology) -> None:
            self.local.rank = topo.rank
            try:
                out[topo.rank] = tdata.build_splits(hyp, data, 2, 32, topo, val=True)
            except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=rank, args=(t,)) for t in self.topos]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        if errors:
            raise errors[0]
        assert not any(t.is_alive() for t in threads)
        return out

    def cachers(self) -> list[int]:
        return [r for what, r in self.events if what == "start"]


def test_disk_cache_is_written_once_by_each_nodes_first_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 nodes x 2 ranks on one file system (shared storage): rank 0 writes every .npy file, the
    other node's first rank finds them written, and no two ranks ever write at once; every rank's
    datasets then read the disk cache."""
    data = make_dataset(tmp_path / "ds", images=TRAIN + VAL, imgsz=IMGSZ)
    hyp = hyp_of(data, "disk")
    ranks = Ranks(2, 2, monkeypatch)
    built = ranks.run(hyp, tdata.load_data_yaml(str(data)))
    assert set(ranks.cachers()) == {0, 2}, ranks.events  # each node's first rank, none of the others
    assert ranks.events == [
        ("start", 0),
        ("end", 0),
        ("start", 0),
        ("end", 0),
        ("start", 2),
        ("end", 2),
        ("start", 2),
        ("end", 2),
    ], ranks.events  # one at a time
    assert sorted(ranks.written) == sorted(set(ranks.written)) and len(ranks.written) == TRAIN + VAL
    for train, val in built:
        assert train.cache == "disk" and val.cache == "disk"
        assert all(f.exists() for f in (*train.npy_files, *val.npy_files))


def fake_memory(monkeypatch: pytest.MonkeyPatch, available: int) -> None:
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=available, total=available * 2))


@pytest.mark.parametrize("fits", [2, 3])
def test_ram_cache_counts_the_nodes_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fits: int) -> None:
    """3 ranks on one node, with free memory for the training images of ``fits`` ranks (ultralytics'
    2x margin included; the validation images, a third of them, fit three times): every rank sees the same free
    memory, so each alone would cache and three copies would not fit. The check counts the node's
    ranks: with room for 2 no rank caches the training images (the node's first rank says why, once);
    with room for 3 all cache, the first rank before the others."""
    data = make_dataset(tmp_path / "ds", images=TRAIN + VAL, imgsz=IMGSZ)
    hyp = hyp_of(data, "ram")
    per_rank = TRAIN * IMAGE_BYTES * 2
    fake_memory(monkeypatch, per_rank * fits + IMAGE_BYTES)  # each split is checked on its own, as ultralytics
    said: list[str] = []
    import trainer.logs

    monkeypatch.setattr(trainer.logs, "say", lambda line: said.append(line))
    ranks = Ranks(1, 3, monkeypatch)
    built = ranks.run(hyp, tdata.load_data_yaml(str(data)))
    for train, val in built:
        assert val.cache == "ram" and all(im is not None for im in val.ims)
        assert (train.cache == "ram") == (fits == 3)
        assert all(im is not None for im in train.ims) == (fits == 3)
    warnings = [ln for ln in said if ln.startswith("warning: --cache ram")]
    if fits == 3:
        assert not warnings
        starts = [r for what, r in ranks.events if what == "start"]
        first_end = ranks.events.index(("end", 0), ranks.events.index(("end", 0)) + 1)  # rank 0's second set
        assert starts[:2] == [0, 0] and all(r != 0 for what, r in ranks.events[first_end + 1 :]), ranks.events
    else:
        assert len(warnings) == 1, said
        assert warnings[0].startswith(f"warning: --cache ram: not caching the {TRAIN} training images: ")
        assert "for the 3 rank(s) of this node" in warnings[0]
        assert sorted(ranks.cachers()) == [0, 1, 2]  # the validation images only


def test_cache_bytes_are_ultralytics_resized_images() -> None:
    ds = SimpleNamespace(imgsz=640, channels=3, labels=[{"shape": (480, 640)}, {"shape": (1000, 500)}, {}])
    assert tdata.cache_bytes(ds) == (480 * 640 + 640 * 320 + 640 * 640) * 3
