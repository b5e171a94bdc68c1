"""What the inventory's `job.args` and the words after `--` become on the job's command line, read
back by the trainer's own parser: nothing the user wrote is dropped or given twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import inventory
from orchestrator.config.overrides import Overrides, apply
from orchestrator.config.plan import make_plan
from orchestrator.errors import InventoryError

HEAD = "transport: local\nnodes:\n  - host: localhost\n    name: n[0-1]\njob:\n"


def load(tmp_path: Path, job: str) -> inventory.Inventory:
    path = tmp_path / "inv.yaml"
    path.write_text(HEAD + job)
    return inventory.load(path)


def job_words(inv: inventory.Inventory) -> list[str]:
    argv = list(make_plan(inv).nodes[0].argv)
    return argv[argv.index("trainer") + 1 :]


def parsed(words: list[str]):  # noqa: ANN201
    from trainer.config import parse_config

    return parse_config(words)


# ----------------------------------------------------------------------------- false


def test_false_reaches_the_trainer_as_its_own_spelling_of_off(tmp_path: Path) -> None:
    """`amp: false` meant off; left out, the trainer's default (fp16 on CUDA, plots on) applied."""
    inv = load(
        tmp_path,
        "  args:\n    data: /d/data.yaml\n    amp: false\n    deterministic: false\n"
        "    plots: false\n    pin-memory: false\n    sync-bn: false\n    cos-lr: false\n"
        "    persistent-workers: false\n    exist-ok: false\n    cache: false\n",
    )
    words = job_words(inv)
    for flag in ("--amp", "--deterministic", "--plots", "--pin-memory", "--sync-bn", "--cache"):
        assert flag in words, words
    cfg = parsed(words)
    assert cfg.amp == "off"
    assert (
        cfg.deterministic,
        cfg.plots,
        cfg.pin_memory,
        cfg.sync_bn,
        cfg.cos_lr,
        cfg.persistent_workers,
        cfg.exist_ok,
        cfg.cache,
    ) == (False, False, False, False, False, False, False, None)
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
    booleans = {
        f.name
        for f in fields(TrainConfig)
        if f.metadata.get("flag", {}) is not None and hints[f.name] in (bool, bool | None)
    }
    assert booleans <= set(OFF_WORD), booleans - set(OFF_WORD)
    off = {"amp": "off", "cache": None, "multi_scale": 0.0, "freeze": None}
    for name, word in OFF_WORD.items():
        cfg = parsed(["--data", "/d.yaml", "--" + name.replace("_", "-"), word])
        assert getattr(cfg, name) == off.get(name, False), name


# ----------------------------------------------------------------------------- overrides after --


TRAINER_JOB = "  args:\n    data: /d/data.yaml\n    model: yolo12n.yaml\n    batch: 8\n    epochs: 3\n"


def overridden(tmp_path: Path, *extra: str) -> inventory.Inventory:
    return apply(load(tmp_path, TRAINER_JOB), Overrides(args=extra))


def test_batch_per_device_replaces_the_inventorys_global_batch(tmp_path: Path) -> None:
    """orch's own hint recommends --batch-per-device: over `batch: 8` both reached the trainer,
    which refused ("both set the batch")."""
    inv = overridden(tmp_path, "--batch-per-device", "2")
    words = job_words(inv)
    assert "--batch" not in words and words[-2:] == ["--batch-per-device", "2"]
    cfg = parsed(words)
    assert cfg.batch_per_device == 2 and "batch" not in cfg.given
    assert "batch" not in inv.job.raw_args and inv.job.raw_args["batch_per_device"] == 2
    back = overridden(tmp_path, "--batch", "4")  # and the other way round
    assert "--batch-per-device" not in job_words(apply(inv, Overrides(args=("--batch", "4"))))
    assert parsed(job_words(back)).batch == 4


@pytest.mark.parametrize(
    "spelling",
    [
        ["--cfg", "yolo12s.yaml"],
        ["--cfg=yolo12s.yaml"],
        ["cfg=yolo12s.yaml"],
        ["--cfg", "model=yolo12s.yaml"],
        ["model=yolo12s.yaml"],
    ],
)
def test_cfg_naming_a_model_replaces_the_inventorys_model(tmp_path: Path, spelling: list[str]) -> None:
    """`-- --cfg yolo12s.yaml` over `model:` gave "model is given twice"."""
    inv = overridden(tmp_path, *spelling)
    words = job_words(inv)
    assert "yolo12n.yaml" not in words and words[-len(spelling) :] == spelling
    assert parsed(words).model == "yolo12s.yaml"
    assert inv.job.raw_args.get("model") in (None, "yolo12s.yaml") and "yolo12n.yaml" not in inv.job.raw_args.values()


def test_cfg_key_value_replaces_that_setting(tmp_path: Path) -> None:
    words = job_words(overridden(tmp_path, "--cfg", "epochs=5", "--cfg", "lr0=0.02"))
    assert "--epochs" not in words and "3" not in words
    cfg = parsed(words)
    assert (cfg.epochs, cfg.lr, cfg.batch) == (5, 0.02, 8)


def test_a_model_given_as_a_checkpoint_replaces_the_inventorys_weights(tmp_path: Path) -> None:
    """`--model x.pt` means --weights (the trainer's rule), so it replaces `weights:`."""
    for extra in (("--model", "/m/b.pt"), ("model=/m/b.pt",), ("--cfg", "model=/m/b.pt")):
        inv = apply(load(tmp_path, "  args:\n    data: /d/data.yaml\n    weights: /m/a.pt\n"), Overrides(args=extra))
        words = job_words(inv)
        assert "/m/a.pt" not in words, extra
        assert parsed(words).weights == "/m/b.pt"


@pytest.mark.parametrize("where", ["inventory", "override"])
def test_the_job_check_takes_a_model_named_by_cfg_for_the_builtin_it_is(tmp_path: Path, where: str) -> None:
    """`--cfg yoloe-v8l-seg.yaml` (the README lists it) was "a relative path" to the job check."""
    from orchestrator.preflight.checks import cluster_job_findings, relative_args

    if where == "inventory":
        inv = load(tmp_path, "  args:\n    data: /d/data.yaml\n    cfg: yoloe-v8l-seg.yaml\n")
    else:
        inv = apply(
            load(tmp_path, "  args:\n    data: /d/data.yaml\n"), Overrides(args=("--cfg", "yoloe-v8l-seg.yaml"))
        )
    assert relative_args(inv) == {}
    assert not [f for f in cluster_job_findings(inv) if "relative" in f[1]]
    assert parsed(job_words(inv)).model == "yoloe-v8l-seg.yaml"
    settings = load(tmp_path, "  args:\n    data: /d/data.yaml\n    cfg: mosaic=0\n")  # a setting, not a file
    assert relative_args(settings) == {}
    own = load(tmp_path, "  args:\n    data: /d/data.yaml\n    cfg: my-args.yaml\n")  # a settings file: a path
    assert list(relative_args(own)) == ["cfg"]


@pytest.mark.parametrize("spelling", ["batch-size: 100", "batch_size: 100", "batch: 100"])
def test_the_job_check_reads_the_batch_by_any_of_its_spellings(tmp_path: Path, spelling: str) -> None:
    """The same table names the settings the job check judges: `batch-size: 100` is the batch."""
    from orchestrator.preflight.checks import cluster_job_findings

    path = tmp_path / "inv.yaml"
    path.write_text(
        "transport: local\nnodes:\n  - host: localhost\n    name: n[0-2]\njob:\n"
        f"  args:\n    data: /d/data.yaml\n    {spelling}\n"
    )
    inv = inventory.load(path)
    assert any("global batch 100 does not divide by world size 3" in f[1] for f in cluster_job_findings(inv))


def test_cfg_takes_its_key_value_word_and_replaces_that_setting_only(tmp_path: Path) -> None:
    from orchestrator.config.trainer import override_args, settings_of

    base = ("--data", "/d.yaml", "--cfg", "mosaic=0", "--cfg", "lr0=0.01", "--epochs", "3")
    assert [n for n, _ in settings_of(list(base))] == ["data", "mosaic", "lr", "epochs"]
    assert override_args(base, ("--cfg", "mosaic=0.5")) == (
        "--data",
        "/d.yaml",
        "--cfg",
        "lr0=0.01",
        "--epochs",
        "3",
        "--cfg",
        "mosaic=0.5",
    )
    assert override_args(base, ("--cfg", "yolo12s.yaml")) == (*base, "--cfg", "yolo12s.yaml")
    assert override_args(base, ("--lr", "0.02"))[:6] == ("--data", "/d.yaml", "--cfg", "mosaic=0", "--epochs", "3")
    assert override_args(("mosaic=0",), ("--cfg", "mosaic=0.5")) == ("--cfg", "mosaic=0.5")
    hyp = parsed(["--data", "/d.yaml", *override_args(base, ("--cfg", "mosaic=0.5"))]).hyp
    assert hyp["mosaic"] == 0.5
