"""`python -m trainer.embed` through ultralytics' own text model: the tokenizer (`import clip`) and
a TorchScript encoder given as `--text-encoder PATH` under any name (ultralytics opens it by its
own name from the working directory, where embed links it). The real tokenizer package and the
mobileclip weights are not on this machine: a stand-in `clip` module tokenizes, a tiny TorchScript
module encodes; what is under test is that the file reaches ultralytics' loader and the vectors
come back in the file the trainer reads."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from trainer import embed
from trainer.models import load_text_embeddings
from trainer.offline import set_offline_env

set_offline_env()


class Encoder(torch.nn.Module):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, :4].float().repeat(1, 128)  # (N, 512), a function of the tokens


def test_the_encoder_file_is_used_whatever_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vocab = {"person": 7, "forklift": 9}

    def tokenize(texts: list[str], truncate: bool = True) -> torch.Tensor:
        out = torch.zeros(len(texts), 77, dtype=torch.long)
        for i, t in enumerate(texts):
            out[i, :4] = vocab[t]
        return out

    fake = types.ModuleType("clip")
    fake.clip = types.SimpleNamespace(tokenize=tokenize)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "clip", fake)
    monkeypatch.setattr(embed, "need_tokenizer", lambda: None)
    weights = tmp_path / "models" / "my-encoder-v1.ts"
    weights.parent.mkdir()
    torch.jit.script(Encoder()).save(str(weights))
    out = tmp_path / "pe.pt"
    embed.main(["--names", "person,forklift", "--out", str(out), "--text-encoder", str(weights)])
    pe = load_text_embeddings(str(out), ["forklift", "person"], "mobileclip:blt")
    assert pe.shape == (1, 2, 512) and pe[0, 0, 0] == 9.0 and pe[0, 1, 0] == 7.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models", "pe.pt"]  # nothing left in the cwd or beside
