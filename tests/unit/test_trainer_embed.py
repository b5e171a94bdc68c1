"""The YOLOE embeddings file: what trainer.embed writes is what the trainer reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer import embed
from trainer.errors import TrainerError
from trainer.models import load_text_embeddings
from trainer.synth import write_dataset


def test_embed_file_round_trips_in_data_yaml_order(tmp_path: Path, monkeypatch) -> None:
    data = write_dataset(tmp_path / "ds", images=2, classes=3, imgsz=32)
    # The real encoder needs mobileclip weights; the file format is what is under test here.
    monkeypatch.setattr(embed, "encode", lambda names, *a: torch.arange(len(names) * 4.0).reshape(len(names), 4))
    out = tmp_path / "pe.pt"
    embed.main(["--data", str(data), "--out", str(out)])
    saved = torch.load(out)
    assert list(saved) == ["square", "disc", "triangle"]
    pe = load_text_embeddings(str(out), ["triangle", "square"])
    assert pe.shape == (1, 2, 4) and pe[0, 0].tolist() == [8.0, 9.0, 10.0, 11.0]


def test_missing_class_or_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "pe.pt"
    torch.save({"square": torch.zeros(4)}, f)
    with pytest.raises(TrainerError, match=r"no vector for 1 class\(es\).*'disc'"):
        load_text_embeddings(str(f), ["square", "disc"])
    with pytest.raises(TrainerError, match="python -m trainer.embed"):
        load_text_embeddings(str(tmp_path / "none.pt"), ["square"])
