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
    assert saved["names"] == ["square", "disc", "triangle"] and saved["text_model"] == "mobileclip:blt"
    pe = load_text_embeddings(str(out), ["triangle", "square"], "mobileclip:blt")
    assert pe.shape == (1, 2, 4) and pe[0, 0].tolist() == [8.0, 9.0, 10.0, 11.0]


def test_embeddings_of_another_text_model_are_refused(tmp_path: Path) -> None:
    """YOLOE-26's prompts come from mobileclip2:b, v8/11's from mobileclip:blt: both 512-d, so a
    file of the other model would load and train silently wrong prompts."""
    f = tmp_path / "pe.pt"
    torch.save({"names": ["square"], "embeddings": torch.zeros(1, 512), "text_model": "mobileclip:blt"}, f)
    with pytest.raises(
        TrainerError,
        match=r"made with the text model mobileclip:blt, but this model's prompts come "
        r"from mobileclip2:b: remake it with python -m trainer.embed --variant "
        r"mobileclip2:b",
    ):
        load_text_embeddings(str(f), ["square"], "mobileclip2:b")
    assert load_text_embeddings(str(f), ["square"], "mobileclip:blt").shape == (1, 1, 512)


def test_the_yoloe_text_model_is_the_yamls(tmp_path: Path) -> None:
    from trainer.models import Arch, text_model

    assert text_model(Arch({"text_model": "mobileclip2:b"}, "yoloe-26s.yaml", "detect", True, "")) == "mobileclip2:b"
    assert text_model(Arch({}, "yoloe-11s.yaml", "detect", True, "")) == "mobileclip:blt"


def test_without_the_tokenizer_or_the_encoder_file_one_line_says_what_is_needed(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "clip" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        embed.main(["--names", "person,forklift", "--out", str(tmp_path / "pe.pt"), "--text-encoder", "/m/x.ts"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith(
        "python -m trainer.embed: error: the CLIP tokenizer is not installed (`import clip`): pip install clip-anytorch"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "clip" else real(name, *a))
    with pytest.raises(SystemExit):
        embed.main(["--names", "person", "--out", str(tmp_path / "pe.pt")])
    assert "--variant mobileclip:blt needs its text encoder's weights: --text-encoder PATH" in capsys.readouterr().err
    assert not (tmp_path / "pe.pt").exists()


def test_missing_class_or_file_is_a_clear_error(tmp_path: Path) -> None:
    f = tmp_path / "pe.pt"
    torch.save({"square": torch.zeros(4)}, f)
    with pytest.raises(TrainerError, match=r"no vector for 1 class\(es\).*'disc'"):
        load_text_embeddings(str(f), ["square", "disc"])
    with pytest.raises(TrainerError, match="python -m trainer.embed"):
        load_text_embeddings(str(tmp_path / "none.pt"), ["square"])
