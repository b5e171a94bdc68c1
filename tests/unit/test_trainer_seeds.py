"""The field guides' trainer command lines, with only the script name changed to ``-m trainer``:
each parses, and each flag means what the guide says it means. The guides' own lines are kept
verbatim in tests/fixtures/seeds/guide_commands.txt (000_ae8b4e44573bff88.txt,
001_83a665fb07e85527.txt, 004_c737db0fc323ac13.txt: the field guides shipped with the project brief)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from trainer.config import accumulation, check_topology, parse_config
from trainer.errors import TrainerError

# Verbatim from the guides (line continuations joined, trailing `# comment`s dropped), the script
# (train_pe_all.py, dist_train.py) replaced by `-m trainer`.
SEED_COMMANDS = {
    "000 §2.2": "torchrun --nproc_per_node=2 --nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=29500 "
    "-m trainer --data data/coco.yaml --epochs 80 --batch-size 32 --weights pretrain/yoloe-v8l-seg.pt "
    "--device cuda:0,1",
    "000 §5.1": "torchrun --nproc_per_node=4 -m trainer --workers 4 --pin-memory --persistent-workers",
    "001 §3.1": "python -m torch.distributed.run --nproc_per_node=4 -m trainer --data your_dataset.yaml "
    "--cfg yoloe-v8l-seg.yaml --weights pretrain/yoloe-v8l-seg.pt --epochs 80 --batch-size 32 --device 0,1,2,3",
    "001 §3.2": "python -m torch.distributed.run --nproc_per_node=8 --nnodes=1 --node_rank=0 --master_addr=127.0.0.1 "
    "--master_port=29500 -m trainer --data dataset.yaml --cfg yoloe-v8l-seg.yaml "
    "--weights pretrain/yoloe-v8l-seg.pt --epochs 80 --batch-size 64 --amp --sync-bn --device 0,1,2,3,4,5,6,7",
    "001 §3.3": "python -m torch.distributed.run --nproc_per_node=8 -m trainer --batch-size 32 --lr 0.08 --epochs 80",
    "001 §4.1": "python -m torch.distributed.run --nproc_per_node=4 -m trainer --batch-size 16 --gradient-accumulation 2 "
    "--amp --sync-bn --optimizer AdamW --cache ram",
    "001 §4.3a": "python -m torch.distributed.run --nproc_per_node=4 -m trainer --batch-size 8 --gradient-accumulation 4",
    "001 §4.3b": "python -m torch.distributed.run --nproc_per_node=4 -m trainer --workers 8 --pin-memory --persistent-workers",
    "001 §6.2a": "python -m torch.distributed.run --nproc_per_node=2 -m trainer --batch-size 24 --lr 0.02 --epochs 80 --amp",
    "001 §6.2b": "python -m torch.distributed.run --nproc_per_node=4 -m trainer --batch-size 16 --lr 0.04 --epochs 80 "
    "--amp --sync-bn",
    "001 §6.2c": "python -m torch.distributed.run --nproc_per_node=8 -m trainer --batch-size 32 --lr 0.08 --epochs 80 "
    "--amp --sync-bn --gradient-accumulation 2",
    "004 §4.1": "python -m torch.distributed.run --nproc_per_node=8 --nnodes=4 --node_rank=0 --master_addr=192.168.1.10 "
    "--master_port=29500 -m trainer --data coco128.yaml --model yolov12s.pt --epochs 100 --batch-size 12 "
    "--imgsz 640",
}

GUIDES = Path(__file__).resolve().parents[1] / "fixtures" / "seeds" / "guide_commands.txt"
GUIDE_FILES = ("000_ae8b4e44573bff88.txt", "001_83a665fb07e85527.txt", "004_c737db0fc323ac13.txt")


def split(command: str) -> tuple[int, int, list[str]]:
    """(nproc_per_node, nnodes, the trainer's arguments) of a launcher command."""
    words = shlex.split(command)
    nproc = int(re.search(r"--nproc_per_node=(\d+)", command).group(1))  # type: ignore[union-attr]
    nnodes = int(m.group(1)) if (m := re.search(r"--nnodes=(\d+)", command)) else 1
    return nproc, nnodes, words[words.index("trainer") + 1 :]


def guide_blocks() -> dict[str, str]:
    """{"000 §2.2": the guide's lines, ...} from the fixture's `== FILE lines A-B (SECTION)` blocks."""
    blocks: dict[str, str] = {}
    key = ""
    for line in GUIDES.read_text(encoding="utf-8").splitlines():
        if m := re.match(r"^== (\d{3})_[0-9a-f]{16}\.txt lines \d+-\d+ \((§[\d.]+)\)$", line):
            key = f"{m.group(1)} {m.group(2)}"
            blocks.setdefault(key, "")  # a section may have several blocks
        elif key:  # the header comment comes before the first block
            blocks[key] += line + "\n"
    return blocks


def test_the_commands_here_are_the_guides_own() -> None:
    """Every flag sequence above appears in the guide and section it is named after (modulo the
    guide's line continuations and trailing comments), and the fixture cites the three guides."""
    text = GUIDES.read_text(encoding="utf-8")
    assert all(f"== {name} lines " in text for name in GUIDE_FILES)
    blocks = guide_blocks()
    for key, command in SEED_COMMANDS.items():
        section = blocks[key.rstrip("abc")]  # "001 §6.2a" is the first of §6.2's three commands
        flat = re.sub(r"\s+", " ", re.sub(r"\\ *(# [^\n]*?(?=--|$))?", " ", section.replace("\\\n", " ")))
        _, _, args = split(command)
        for flag in [a for a in args if a.startswith("--")]:
            assert flag in flat, f"{key}: {flag} is not in that section of the guide"


def parse_seed(args: list[str]) -> object:
    """Parse as the trainer does; lines without --data get one (the guide's script has it built in)."""
    if "--data" not in args:
        with pytest.raises(TrainerError, match="--data is required"):
            parse_config(args)
        args = [*args, "--data", "/data/mine/data.yaml"]
    return parse_config(args)


@pytest.mark.parametrize("key", SEED_COMMANDS)
def test_every_seed_command_parses(key: str) -> None:
    nproc, nnodes, args = split(SEED_COMMANDS[key])
    cfg = parse_seed(args)
    try:
        check_topology(cfg, world_size=nproc * nnodes, launched=True, local_world_size=nproc)  # type: ignore[arg-type]
    except TrainerError as e:
        # The guides' relative paths are refused under torchrun, as guide 000 §3.3 itself requires,
        # with the absolute path in the message; and 004's 12 images over 32 GPUs does not divide.
        assert "is relative" in str(e) or (key == "004 §4.1" and "does not divide by world size 32" in str(e)), str(e)


def test_each_flag_means_what_the_guides_say() -> None:
    def cfg(key: str):  # noqa: ANN202
        return parse_seed(split(SEED_COMMANDS[key])[2])

    c = cfg("000 §2.2")
    assert c.device_ids == (0, 1) and c.batch == 32 and c.epochs == 80 and c.weights == "pretrain/yoloe-v8l-seg.pt"
    c = cfg("001 §3.2")
    assert c.model == "yoloe-v8l-seg.yaml" and c.amp == "on" and c.sync_bn and c.device_ids == tuple(range(8))
    assert c.batch == 64  # global, as ultralytics' batch= and guide 001 §3.1 ("总批次大小，会自动分配到各GPU")
    c = cfg("001 §4.1")
    assert c.accumulate == 2 and accumulation(c) == 2 and c.optimizer == "AdamW" and c.cache == "ram" and c.amp == "on"
    c = cfg("001 §4.3b")
    assert c.workers == 8 and c.pin_memory is True and c.persistent_workers is True
    c = cfg("001 §6.2c")
    assert c.lr == 0.08 and c.optimizer == "SGD" and c.accumulate == 2 and c.sync_bn and c.amp == "on"
    c = cfg("004 §4.1")
    assert c.weights == "yolov12s.pt" and c.model is None  # --model X.pt is a checkpoint to load, never a download
    assert c.imgsz == 640 and c.epochs == 100


def test_the_device_list_is_checked_against_nproc_per_node() -> None:
    _, _, args = split(SEED_COMMANDS["001 §3.1"])
    absolute = {"your_dataset.yaml": "/data/your_dataset.yaml", "pretrain/yoloe-v8l-seg.pt": "/m/yoloe-v8l-seg.pt"}
    cfg = parse_config([absolute.get(a, a) for a in args])
    check_topology(cfg, world_size=4, launched=True, local_world_size=4)
    with pytest.raises(TrainerError, match=r"--device 0,1,2,3 names 4 GPUs but torchrun started 2"):
        check_topology(cfg, world_size=2, launched=True, local_world_size=2)


def test_the_trainer_table_maps_every_flag_of_the_guides() -> None:
    """Each flag the guides pass to their training script has a row (or an alias in one) in the trainer
    guide's flag table (docs/trainer.md)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trainer.md").read_text()
    rows = [ln for ln in doc.splitlines() if ln.startswith("| `--")]
    flags = {a.split("=")[0] for key in SEED_COMMANDS for a in split(SEED_COMMANDS[key])[2] if a.startswith("--")}
    missing = sorted(f for f in flags if not any(re.search(rf"`{re.escape(f)}[` ]", row.split("|")[1]) for row in rows))
    assert not missing, f"seed flags without a row in docs/trainer.md's flag table: {missing}"
