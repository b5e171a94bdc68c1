"""Flag parsing and the checks made before any file or process group is touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import build_parser, check_topology, effective_lr_text, parse_config
from trainer.errors import TrainerError


def test_help_documents_every_flag_with_examples() -> None:
    text = build_parser().format_help()
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"
    assert "examples:" in text and "torchrun" in text and "python -m trainer.embed" in text


def test_defaults_and_overrides() -> None:
    cfg = parse_config(["--data", "/d.yaml", "--cfg", "mosaic=0.5", "--cfg", "fliplr=0"])
    assert cfg.batch == 16 and cfg.lr == 0.01 and cfg.amp == "auto"
    assert cfg.extra == {"mosaic": "0.5", "fliplr": "0"}
    assert cfg.out == str(Path("runs/train/exp"))
    assert parse_config(["--data", "/d.yaml", "--project", "/p", "--name", "n"]).out == "/p/n"
    assert parse_config(["--data", "/d.yaml", "--resume"]).resume == ""
    assert parse_config(["--data", "/d.yaml", "--resume", "/r/last.pt"]).resume == "/r/last.pt"


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--epochs", "0"], ["--accumulate", "0"], ["--cfg", "mosaic"]])
def test_unusable_values_are_refused(argv: list[str]) -> None:
    with pytest.raises(TrainerError):
        parse_config(["--data", "/d.yaml", *argv])


def test_batch_must_divide_by_world_size_and_says_alternatives() -> None:
    cfg = parse_config(["--data", "/d.yaml", "--batch", "30"])
    with pytest.raises(TrainerError, match=r"--batch 30 is not divisible by WORLD_SIZE 8: use 24 or 32"):
        check_topology(cfg, world_size=8, launched=True)
    check_topology(parse_config(["--data", "/d.yaml", "--batch", "32"]), world_size=8, launched=True)


def test_relative_paths_refused_under_torchrun_with_absolute_suggestion(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(["--data", "data/coco.yaml", "--weights", "/abs/w.pt"])
    with pytest.raises(TrainerError) as e:
        check_topology(cfg, world_size=2, launched=True)
    assert str(tmp_path / "data" / "coco.yaml") in str(e.value)
    check_topology(cfg, world_size=1, launched=False)  # a plain process resolves them itself
    cfg = parse_config(["--data", "/abs/d.yaml", "--weights", "w.pt"])
    with pytest.raises(TrainerError, match="--weights w.pt is relative"):
        check_topology(cfg, world_size=1, launched=True)


def test_learning_rate_scales_linearly_with_global_batch() -> None:
    assert effective_lr_text(parse_config(["--data", "/d", "--batch", "64"])) == "0.01 @ 64 -> 0.01"
    assert effective_lr_text(parse_config(["--data", "/d", "--batch", "256", "--accumulate", "2"])) == "0.01 @ 64 -> 0.08"


def test_leading_tilde_is_this_nodes_home(monkeypatch) -> None:  # noqa: ANN001
    """orch quotes every argument, so no shell expands `~/`; the trainer does, on each node."""
    from trainer.config import check_topology, parse_config

    monkeypatch.setenv("HOME", "/home/alice")
    cfg = parse_config(["--data", "~/.orch/demo/data/data.yaml", "--out", "~/runs/a", "--resume", "~/runs/a/last.pt"])
    assert cfg.data == "/home/alice/.orch/demo/data/data.yaml"
    assert cfg.out == "/home/alice/runs/a" and cfg.resume == "/home/alice/runs/a/last.pt"
    check_topology(cfg, world_size=1, launched=True)  # absolute now: accepted under torchrun


def test_each_orch_run_gets_its_own_run_directory(monkeypatch) -> None:  # noqa: ANN001
    from trainer.config import parse_config

    monkeypatch.delenv("ORCH_RUN_ID", raising=False)
    assert parse_config(["--data", "/d.yaml"]).out == "runs/train/exp"
    monkeypatch.setenv("ORCH_RUN_ID", "20261130-103558-local")
    assert parse_config(["--data", "/d.yaml"]).out == "runs/train/20261130-103558-local"
    assert parse_config(["--data", "/d.yaml", "--name", "mine"]).out == "runs/train/mine"
    assert parse_config(["--data", "/d.yaml", "--out", "/o"]).out == "/o"
