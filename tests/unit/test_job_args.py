"""What the inventory's `job.args` and the words after `--` become on the job's command line, read
back by the trainer's own parser: nothing the user wrote is dropped or given twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import inventory
from orchestrator.config.plan import make_plan
from orchestrator.errors import InventoryError

HEAD = "transport: local\nnodes:\n  - host: localhost\n    name: n[0-1]\njob:\n"


def load(tmp_path: Path, job: str) -> inventory.Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(HEAD + job)
    return inventory.load(path)


def job_words(inv: inventory.Inventory) -> list[str]:
    argv = list(make_plan(inv).nodes[0].argv)
    return argv[argv.index("trainer") + 1:]


def parsed(words: list[str]):  # noqa: ANN201
    from trainer.config import parse_config

    return parse_config(words)


# ----------------------------------------------------------------------------- false


def test_false_reaches_the_trainer_as_its_own_spelling_of_off(tmp_path: Path) -> None:
    """`amp: false` meant off; left out, the trainer's default (fp16 on CUDA, plots on) applied."""
    inv = load(tmp_path, "  args:\n    data: /d/data.yaml\n    amp: false\n    deterministic: false\n"
                         "    plots: false\n    pin-memory: false\n    sync-bn: false\n    cos-lr: false\n"
                         "    persistent-workers: false\n    exist-ok: false\n    cache: false\n")
    words = job_words(inv)
    for flag in ("--amp", "--deterministic", "--plots", "--pin-memory", "--sync-bn", "--cache"):
        assert flag in words, words
    cfg = parsed(words)
    assert cfg.amp == "off"
    assert (cfg.deterministic, cfg.plots, cfg.pin_memory, cfg.sync_bn, cfg.cos_lr, cfg.persistent_workers,
            cfg.exist_ok, cfg.cache) == (False, False, False, False, False, False, False, None)
    assert {"amp", "deterministic", "plots", "pin_memory"} <= set(cfg.given)


def test_true_and_null_keep_their_meaning(tmp_path: Path) -> None:
    inv = load(tmp_path, "  args:\n    data: /d/data.yaml\n    amp: true\n    plots: null\n    sync-bn: true\n")
    words = job_words(inv)
    assert "--plots" not in words  # null: left out, the trainer's default
    cfg = parsed(words)
    assert cfg.amp == "on" and cfg.sync_bn and cfg.plots and "plots" not in cfg.given


def test_false_for_a_trainer_flag_without_an_off_is_refused_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as e:
        load(tmp_path, "  args:\n    data: /d/data.yaml\n    resume: false\n    epochs: false\n")
    text = str(e.value)
    assert "inv.yaml:8" in text and "job.args.resume" in text and "null" in text
    assert "inv.yaml:9" in text and "job.args.epochs" in text


@pytest.mark.parametrize("job", ["  module: mypkg.train\n", "  script: /srv/train.py\n"])
def test_false_for_another_job_is_refused_not_dropped(tmp_path: Path, job: str) -> None:
    with pytest.raises(InventoryError) as e:
        load(tmp_path, job + "  args:\n    lr: 0.1\n    amp: false\n")
    text = str(e.value)
    assert "job.args.amp" in text and "false" in text and "null" in text


def test_every_trainer_flag_that_takes_a_boolean_has_an_off_word() -> None:
    """interface.OFF_WORD is held to the trainer's parser: each word parses to the field's off,
    and every flag whose value is a boolean is in the table."""
    import typing
    from dataclasses import fields

    from trainer.config import TrainConfig
    from trainer.interface import OFF_WORD

    hints = typing.get_type_hints(TrainConfig)
    booleans = {f.name for f in fields(TrainConfig)
                if f.metadata.get("flag", {}) is not None and hints[f.name] in (bool, bool | None)}
    assert booleans <= set(OFF_WORD), booleans - set(OFF_WORD)
    off = {"amp": "off", "cache": None, "multi_scale": 0.0, "freeze": None}
    for name, word in OFF_WORD.items():
        cfg = parsed(["--data", "/d.yaml", "--" + name.replace("_", "-"), word])
        assert getattr(cfg, name) == off.get(name, False), name
