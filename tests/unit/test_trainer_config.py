"""Flag parsing, ultralytics key=value settings, and the checks made before any file or process group is touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainer.config import accumulation, build_parser, check_topology, parse_config
from trainer.errors import TrainerError
from trainer.settings import ultralytics_defaults


def cfg_of(*argv: str):  # noqa: ANN201
    return parse_config(["--data", "/d.yaml", *argv])


def test_help_documents_every_flag_with_examples() -> None:
    text = build_parser().format_help()
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"
    assert "examples:" in text and "torchrun" in text and "python -m trainer.embed" in text


def test_a_flag_is_written_once_its_help_is_the_fields_docstring() -> None:
    """build_parser is generated from TrainConfig: each field's docstring is its flag's help, its
    default is said once (by the field), and every flag but the aliases, --cfg and --check (a
    mode, not a setting) is a field."""
    from dataclasses import fields

    from trainer.config import ALIASES, CHECK_HELP, TrainConfig, field_docs
    from trainer.settings import OPTIMIZERS

    by_flag = {a.option_strings[-1]: a for a in build_parser()._actions if a.option_strings}
    names = {f.name for f in fields(TrainConfig)}
    for opt, action in by_flag.items():
        if opt in ("--help", "--cfg", "--check") or opt in ALIASES:
            continue
        name = opt[2:].replace("-", "_")
        assert name in names, f"{opt} is not a TrainConfig field"
        assert action.help.startswith(field_docs()[name]), opt
    assert by_flag["--epochs"].help.endswith("(default 100)") and by_flag["--imgsz"].type is int
    assert by_flag["--cos-lr"].metavar == "BOOL" and by_flag["--sync-bn"].metavar == "BOOL"
    assert all(o in by_flag["--optimizer"].help for o in OPTIMIZERS)
    assert by_flag["--check"].help == CHECK_HELP and "check" not in names


def test_defaults_are_ultralytics_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_RUN_ID", raising=False)
    cfg = cfg_of()
    d = ultralytics_defaults()
    assert (
        cfg.epochs,
        cfg.batch,
        cfg.imgsz,
        cfg.lrf,
        cfg.weight_decay,
        cfg.warmup_epochs,
        cfg.close_mosaic,
        cfg.patience,
        cfg.nbs,
        cfg.workers,
        cfg.optimizer,
        cfg.cos_lr,
    ) == (
        d["epochs"],
        d["batch"],
        d["imgsz"],
        d["lrf"],
        d["weight_decay"],
        d["warmup_epochs"],
        d["close_mosaic"],
        d["patience"],
        d["nbs"],
        d["workers"],
        d["optimizer"],
        d["cos_lr"],
    )
    assert cfg.model is None and cfg.weights is None and cfg.amp == "auto" and cfg.lr is None
    assert accumulation(cfg) == 4  # round(nbs 64 / batch 16), as ultralytics
    assert (cfg.out, cfg.project, cfg.name) == (None, "", "train")  # runs/<task>/train, as ultralytics 8.4


def test_resume_forms() -> None:
    assert cfg_of("--resume").resume == ""
    assert cfg_of("--resume", "/r/last.pt").resume == "/r/last.pt"
    assert cfg_of("resume=True").resume == ""
    assert cfg_of("resume=/r/last.pt").resume == "/r/last.pt"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batch", "0"], "--batch must be >= 1"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--accumulate", "0"], "--accumulate must be >= 1"),
        (["--cfg", "mosaic"], "expected KEY=VALUE"),
        (["--fraction", "1.5"], "--fraction must be in"),
        (["batch=-1"], "no auto-batch"),
        (["--device", "0,0"], "listed twice"),
        (["--optimizer", "Lion"], "unknown optimizer"),
    ],
)
def test_unusable_values_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(TrainerError, match=message):
        cfg_of(*argv)


def test_data_is_required_with_a_clear_line() -> None:
    with pytest.raises(TrainerError, match="--data is required"):
        parse_config(["--epochs", "3"])


def test_ultralytics_key_value_arguments_mean_the_same_as_flags() -> None:
    a = parse_config(
        [
            "model=yolo12s.yaml",
            "data=/d.yaml",
            "epochs=5",
            "batch=32",
            "imgsz=320",
            "lr0=0.02",
            "lrf=0.1",
            "momentum=0.9",
            "weight_decay=0.001",
            "warmup_epochs=1",
            "workers=2",
            "seed=3",
            "device=0,1",
            "amp=False",
            "cos_lr=True",
            "close_mosaic=2",
            "optimizer=AdamW",
            "patience=7",
            "cache=disk",
            "fraction=0.5",
            "freeze=[0,1]",
            "multi_scale=0.25",
            "nbs=128",
            "project=/p",
            "name=n",
            "exist_ok=True",
            "save_period=3",
            "deterministic=False",
        ]
    )
    b = parse_config(
        [
            "--model",
            "yolo12s.yaml",
            "--data",
            "/d.yaml",
            "--epochs",
            "5",
            "--batch",
            "32",
            "--imgsz",
            "320",
            "--lr",
            "0.02",
            "--lrf",
            "0.1",
            "--momentum",
            "0.9",
            "--weight-decay",
            "0.001",
            "--warmup-epochs",
            "1",
            "--workers",
            "2",
            "--seed",
            "3",
            "--device",
            "0,1",
            "--amp",
            "off",
            "--cos-lr",
            "--close-mosaic",
            "2",
            "--optimizer",
            "adamw",
            "--patience",
            "7",
            "--cache",
            "disk",
            "--fraction",
            "0.5",
            "--freeze",
            "0,1",
            "--multi-scale",
            "0.25",
            "--nbs",
            "128",
            "--project",
            "/p",
            "--name",
            "n",
            "--exist-ok",
            "--save-period",
            "3",
            "--deterministic",
            "false",
        ]
    )
    assert a == b
    assert a.device_ids == (0, 1) and a.freeze == (0, 1) and a.optimizer == "AdamW" and a.cache == "disk"


def test_settings_pasted_from_yolo_train_with_task_and_mode_words() -> None:
    cfg = parse_config(["segment", "train", "data=/d.yaml", "model=/w/yolo12n-seg.pt", "epochs=3"])
    assert cfg.task == "segment" and cfg.weights == "/w/yolo12n-seg.pt" and cfg.model is None and cfg.epochs == 3
    with pytest.raises(TrainerError, match="unexpected argument 'predict'"):
        parse_config(["predict", "data=/d.yaml"])


def test_a_bare_optional_flag_does_not_swallow_the_next_setting() -> None:
    cfg = cfg_of("--amp", "epochs=7", "--cache", "--resume", "fraction=0.5")
    assert cfg.amp == "on" and cfg.epochs == 7 and cfg.cache == "ram" and cfg.resume == "" and cfg.fraction == 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["--epochs", "5", "epochs=10"],
        ["--batch", "16", "--batch-size", "32"],
        ["--accumulate", "2", "--gradient-accumulation", "4"],
        ["--lr", "0.01", "lr0=0.02"],
        ["--model", "yolo12n.yaml", "--cfg", "yolo12s.yaml"],
        ["--cfg", "mosaic=0", "mosaic=0.5"],
    ],
)
def test_one_setting_given_twice_differently_is_refused(argv: list[str]) -> None:
    with pytest.raises(TrainerError, match="given twice"):
        cfg_of(*argv)


def test_the_same_value_twice_is_fine() -> None:
    assert cfg_of("--epochs", "5", "epochs=5").epochs == 5


@pytest.mark.parametrize(
    "setting, message",
    [
        ("rect=True", "not honoured"),
        ("single_cls=True", "not honoured"),
        ("compile=True", "not honoured"),
        ("time=2", "not honoured"),
        ("cls_pw=0.5", "not honoured"),
        ("mosaicc=1", "unknown ultralytics setting 'mosaicc'"),
        ("mode=val", "only trains"),
    ],
)
def test_settings_the_loop_does_not_honour_are_refused_never_ignored(setting: str, message: str) -> None:
    with pytest.raises(TrainerError, match=message):
        cfg_of(setting)
    with pytest.raises(TrainerError, match=message):
        cfg_of("--cfg", setting)


def test_honoured_ultralytics_settings_reach_its_namespace() -> None:
    cfg = cfg_of(
        "mosaic=0.5",
        "--cfg",
        "fliplr=0",
        "box=5.0",
        "overlap_mask=False",
        "conf=0.01",
        "warmup_bias_lr=0.05",
        "plots=False",
        "verbose=True",
        "rect=False",
    )
    assert cfg.hyp == {
        "mosaic": 0.5,
        "fliplr": 0,
        "box": 5.0,
        "overlap_mask": False,
        "conf": 0.01,
        "warmup_bias_lr": 0.05,
    }


def test_cfg_file_of_settings_or_a_model_yaml(tmp_path: Path) -> None:
    settings = tmp_path / "hyp.yaml"
    settings.write_text(yaml.safe_dump({"epochs": 12, "mosaic": 0.3, "cos_lr": True}))
    cfg = cfg_of("--cfg", str(settings))
    assert cfg.epochs == 12 and cfg.cos_lr and cfg.hyp == {"mosaic": 0.3}
    assert cfg_of(f"cfg={settings}").epochs == 12
    assert cfg_of("--cfg", "yoloe-v8l-seg.yaml").model == "yoloe-v8l-seg.yaml"
    arch = tmp_path / "custom.yaml"
    arch.write_text(
        yaml.safe_dump({"nc": 3, "backbone": [[-1, 1, "Conv", [16, 3, 2]]], "head": [[-1, 1, "Detect", ["nc"]]]})
    )
    assert cfg_of("--cfg", str(arch)).model == str(arch)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rect: true\n")
    with pytest.raises(TrainerError, match="not honoured"):
        cfg_of("--cfg", str(bad))


def test_a_checkpoint_given_as_model_means_weights() -> None:
    cfg = cfg_of("--model", "/m/yolo12s.pt")
    assert cfg.weights == "/m/yolo12s.pt" and cfg.model is None
    assert cfg_of("pretrained=/m/a.pt").weights == "/m/a.pt"
    with pytest.raises(TrainerError, match="pretrained=False contradicts"):
        cfg_of("--weights", "/m/a.pt", "pretrained=False")


def test_amp_forms() -> None:
    assert cfg_of("--amp").amp == "on"  # a bare --amp asks for mixed precision
    assert cfg_of("--amp", "bf16").amp == "bf16"
    assert cfg_of("--amp", "off").amp == "off"
    assert cfg_of("amp=True").amp == "auto"  # ultralytics' default: where the device supports it
    assert cfg_of("amp=False").amp == "off"


def test_giving_a_rate_selects_sgd_unless_auto_was_asked_for() -> None:
    cfg = cfg_of("--lr", "0.02")
    assert cfg.optimizer == "SGD" and cfg.lr == 0.02 and any("optimizer SGD" in n for n in cfg.notes)
    assert cfg_of("--lr", "0.02", "--optimizer", "AdamW").optimizer == "AdamW"
    # ultralytics' rule: optimizer=auto picks its own rate; lr0 is unused, and said so
    cfg = cfg_of("--lr", "0.02", "optimizer=auto")
    assert cfg.optimizer == "auto" and cfg.lr is None
    assert "lr0 0.02 unused: optimizer auto picks its own (ultralytics' rule; name an optimizer" in cfg.notes[0]


def test_settings_without_effect_on_training_are_accepted_and_named_once() -> None:
    cfg = cfg_of("source=/x.jpg", "format=onnx", "plots=True", "--cfg", "show=True", "save_dir=/r/train")
    assert cfg.notes == (
        "accepted without effect on training (prediction, export, tracking): source, format, save_dir, show",
    )


def test_plots_are_on_by_default_and_every_spelling_turns_them_off(tmp_path: Path) -> None:
    """ultralytics' plots=True default; --plots false, plots=False and an args.yaml's `plots: false`
    each turn them off (honoured, never named as without effect)."""
    args = tmp_path / "args.yaml"
    args.write_text(yaml.safe_dump({"plots": False, "epochs": 3}))
    assert cfg_of().plots is True and cfg_of("plots=True").plots is True
    for argv in (["--plots", "false"], ["plots=False"], ["--cfg", "plots=false"], ["--cfg", str(args)]):
        cfg = cfg_of(*argv)
        assert cfg.plots is False and not any("without effect" in n for n in cfg.notes), argv
    assert cfg_of("--cfg", str(args), "--plots").plots is True  # the command line wins over the file


def test_an_args_yaml_is_refused_once_with_every_unsupported_key_and_the_command_line_wins(tmp_path: Path) -> None:
    """A settings file from `yolo train` with several settings this loop cannot train with: one
    error lists them all. Its other values are ultralytics' `cfg=`: the command line overrides them."""
    args = tmp_path / "args.yaml"
    args.write_text(
        yaml.safe_dump(
            {
                "epochs": 3,
                "rect": True,
                "single_cls": True,
                "time": 2.0,
                "source": None,
                "optimizer": "auto",
                "lr0": 0.01,
                "momentum": 0.937,
                "project": None,
                "cfg": None,
                "mosaic": 1.0,
            }
        )
    )
    with pytest.raises(TrainerError) as e:
        cfg_of("--cfg", str(args))
    message = str(e.value)
    assert message.startswith(f"--cfg {args}: 3 setting(s) this trainer cannot train with: rect=True is not honoured")
    assert "single_cls=True is not honoured" in message and "time=2.0 is not honoured" in message
    assert "\n" not in message
    fine = tmp_path / "fine.yaml"
    fine.write_text(
        yaml.safe_dump(
            {
                "epochs": 3,
                "optimizer": "auto",
                "lr0": 0.01,
                "momentum": 0.937,
                "project": None,
                "cfg": None,
                "mosaic": 1.0,
                "plots": True,
                "save_dir": "/r/train",
            }
        )
    )
    cfg = cfg_of("--epochs", "5", "--cfg", str(fine), "mosaic=0.5")
    assert cfg.epochs == 5 and cfg.hyp["mosaic"] == 0.5 and cfg.optimizer == "auto" and cfg.lr is None
    assert cfg.project == parse_config(["--data", "/d.yaml"]).project
    assert any(n.startswith("lr0 0.01 and momentum 0.937 unused: optimizer auto picks its own") for n in cfg.notes)
    assert any("overrides the settings file's epochs (by --epochs 5), mosaic (by 0.5)" in n for n in cfg.notes), (
        cfg.notes
    )


def test_val_false_validates_only_after_the_last_epoch() -> None:
    assert cfg_of("epochs=7", "val=False").val_period == 7
    assert cfg_of("val=True").val_period == 1


def test_batch_must_divide_by_world_size_and_says_alternatives() -> None:
    with pytest.raises(
        TrainerError,
        match=r"--batch 30: global batch 30 does not divide by world size 8 "
        r"\(3.75 images per rank\): use 24 or 32; for 30 images per GPU use 240",
    ):
        check_topology(cfg_of("--batch", "30"), world_size=8, launched=True, local_world_size=8)
    check_topology(cfg_of("--batch", "32"), world_size=8, launched=True, local_world_size=8)
    # seed 004: 12 meant per GPU on 32 ranks; one suggestion below the world size, never "32 or 32"
    with pytest.raises(TrainerError, match=r"\): use 32; for 12 images per GPU use 384 \(or --batch-per-device 12\)$"):
        check_topology(cfg_of("--batch-size", "12"), world_size=32, launched=True, local_world_size=8)


def test_batch_per_device_is_the_global_batch_over_the_world_size() -> None:
    from trainer.config import with_world_size

    cfg = cfg_of("--batch-per-device", "12")
    check_topology(cfg, world_size=32, launched=True, local_world_size=8)
    wide = with_world_size(cfg, 32)
    assert wide.batch == 384 and "global batch 384 = --batch-per-device 12 x 32 rank(s)" in wide.notes
    assert with_world_size(cfg_of("--batch", "64"), 32).batch == 64
    with pytest.raises(TrainerError, match=r"--batch 64 and --batch-per-device 12 both set the batch"):
        cfg_of("--batch", "64", "--batch-per-device", "12")
    with pytest.raises(TrainerError, match=r"--batch-per-device must be >= 1"):
        cfg_of("--batch-per-device", "0")


def test_bf16_on_a_gpu_without_native_bfloat16_is_refused() -> None:
    import torch

    from trainer.loop import resolve_amp

    cuda = torch.device("cuda", 0)
    with pytest.raises(TrainerError, match=r"--amp bf16: .*compute capability 7\.0.*emulate.*--amp fp16"):
        resolve_amp("bf16", cuda, capability=(7, 0))  # V100
    with pytest.raises(TrainerError, match=r"compute capability 7\.5"):
        resolve_amp("bf16", cuda, capability=(7, 5))  # T4
    assert resolve_amp("bf16", cuda, capability=(8, 0)) == resolve_amp("bf16", cuda, capability=(9, 0)) == "bf16"
    assert resolve_amp("fp16", cuda, capability=(7, 0)) == resolve_amp("auto", cuda, capability=(7, 0)) == "fp16"
    assert resolve_amp("bf16", torch.device("cpu")) == "bf16"


def test_device_list_must_match_the_processes_of_this_node() -> None:
    cfg = cfg_of("--device", "cuda:0,1,2,3", "--batch", "8")
    assert cfg.device == "cuda:0,1,2,3" and cfg.device_ids == (0, 1, 2, 3)
    check_topology(cfg, world_size=8, launched=True, local_world_size=4)
    with pytest.raises(TrainerError, match=r"names 4 GPUs but torchrun started 2 process\(es\).*--nproc-per-node 4"):
        check_topology(cfg, world_size=4, launched=True, local_world_size=2)
    with pytest.raises(TrainerError, match="this is one process: start it with torchrun --nproc-per-node 4"):
        check_topology(cfg, world_size=1, launched=False, local_world_size=1)
    check_topology(cfg_of("--device", "0"), world_size=1, launched=False)


def test_relative_paths_refused_under_torchrun_with_absolute_suggestion(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    cfg = parse_config(["--data", "data/coco.yaml", "--weights", "/abs/w.pt"])
    with pytest.raises(TrainerError) as e:
        check_topology(cfg, world_size=2, launched=True, local_world_size=2)
    assert str(tmp_path / "data" / "coco.yaml") in str(e.value)
    check_topology(cfg, world_size=1, launched=False)  # a plain process resolves them itself
    cfg = parse_config(["--data", "/abs/d.yaml", "--weights", "w.pt"])
    with pytest.raises(TrainerError, match="--weights w.pt is relative"):
        check_topology(cfg, world_size=1, launched=True)


def test_leading_tilde_is_this_nodes_home(monkeypatch) -> None:  # noqa: ANN001
    """orch quotes every argument, so no shell expands `~/`; the trainer does, on each node."""
    monkeypatch.setenv("HOME", "/home/alice")
    cfg = parse_config(["--data", "~/.orch/demo/data/data.yaml", "--out", "~/runs/a", "--resume", "~/runs/a/last.pt"])
    assert cfg.data == "/home/alice/.orch/demo/data/data.yaml"
    assert cfg.out == "/home/alice/runs/a" and cfg.resume == "/home/alice/runs/a/last.pt"
    check_topology(cfg, world_size=1, launched=True)  # absolute now: accepted under torchrun


def test_each_orch_run_gets_its_own_run_directory_name(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.delenv("ORCH_RUN_ID", raising=False)
    assert parse_config(["--data", "/d.yaml"]).name == "train"
    monkeypatch.setenv("ORCH_RUN_ID", "20261130-103558-local")
    assert parse_config(["--data", "/d.yaml"]).name == "20261130-103558-local"
    assert parse_config(["--data", "/d.yaml", "--name", "mine"]).name == "mine"
    assert parse_config(["--data", "/d.yaml", "--out", "/o"]).out == "/o"


def test_a_bare_resume_of_a_named_run_continues_that_run_not_the_newest(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """orch up's retry passes a bare --resume to a run named by its run id: another run under the
    same project that wrote a checkpoint since must not be the one continued."""
    import os

    from trainer.output import resolve

    for name, mtime in (("20261201-100000-a", 1000), ("20261201-110000-b", 2000), ("exp", 3000)):
        last = tmp_path / name / "weights" / "last.pt"
        last.parent.mkdir(parents=True)
        last.write_bytes(b"x")
        os.utime(last, (mtime, mtime))
    monkeypatch.setenv("ORCH_RUN_ID", "20261201-100000-a")
    cfg = parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path), "--resume"])
    assert resolve(cfg) == (tmp_path / "20261201-100000-a", tmp_path / "20261201-100000-a" / "weights" / "last.pt")
    monkeypatch.delenv("ORCH_RUN_ID")
    cfg = parse_config(
        ["--data", "/d/data.yaml", "--project", str(tmp_path), "--name", "20261201-110000-b", "--resume"]
    )
    assert resolve(cfg)[0] == tmp_path / "20261201-110000-b"
    cfg = parse_config(
        ["--data", "/d/data.yaml", "--project", str(tmp_path), "--resume"]
    )  # unnamed: the newest, as yolo
    assert resolve(cfg)[0] == tmp_path / "exp"
    cfg = parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path), "--name", "nothere", "--resume"])
    with pytest.raises(TrainerError, match=r"nothere has no weights/last.pt"):
        resolve(cfg)
    monkeypatch.setenv("ORCH_RUN_ID", "20261201-120000-c")  # a new orch up with resume: true: the newest run
    cfg = parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path), "--resume"])
    assert resolve(cfg)[0] == tmp_path / "exp"


def test_an_orch_run_relaunched_before_its_first_checkpoint_keeps_its_directory(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """orch looks for the checkpoint in PROJECT/<run id>: a retry must not move to <run id>2."""
    from trainer.output import resolve

    (tmp_path / "20261201-100000-a" / "weights").mkdir(parents=True)  # the first attempt died before epoch 1 ended
    (tmp_path / "n" / "weights").mkdir(parents=True)
    monkeypatch.setenv("ORCH_RUN_ID", "20261201-100000-a")
    assert (
        resolve(parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path)]))[0]
        == tmp_path / "20261201-100000-a"
    )
    monkeypatch.delenv("ORCH_RUN_ID")
    assert (
        resolve(parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path), "--name", "n"]))[0]
        == tmp_path / "n2"
    )


def test_resume_auto_finds_this_runs_own_directory_by_the_trainers_rule(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """`--resume auto` (orch up's retry) with key=value project= and name=: the first attempt found
    /nfs/p/r1 taken by an older run and trained in r12, which records its run id; the retry
    continues r12's last.pt, never r1's. Before any checkpoint it starts over in r12 itself; with no
    directory of its own yet it starts like a first attempt; outside orch, PROJECT/NAME."""
    from trainer.output import mark_run, resolve

    project = tmp_path / "p"
    older = project / "r1" / "weights" / "last.pt"
    older.parent.mkdir(parents=True)
    older.write_bytes(b"older run")
    monkeypatch.setenv("ORCH_RUN_ID", "20261201-100000-a")
    first = parse_config(["data=/d/data.yaml", f"project={project}", "name=r1"])
    out, ckpt = resolve(first)
    assert (out, ckpt) == (project / "r12", None)
    out.mkdir(parents=True)
    mark_run(out)  # what rank 0 does when it opens the directory

    retry = parse_config(["data=/d/data.yaml", f"project={project}", "name=r1", "--resume", "auto"])
    assert retry.resume == "auto"
    assert resolve(retry) == (project / "r12", None)  # killed before its first checkpoint: start over in r12
    (out / "weights").mkdir()
    (out / "weights" / "last.pt").write_bytes(b"this run")
    assert resolve(retry) == (project / "r12", project / "r12" / "weights" / "last.pt")

    monkeypatch.setenv("ORCH_RUN_ID", "20261201-110000-b")  # another run, nothing of its own yet: a fresh start
    assert resolve(retry) == (project / "r13", None)
    monkeypatch.delenv("ORCH_RUN_ID")
    assert resolve(retry) == (project / "r1", project / "r1" / "weights" / "last.pt")  # outside orch: PROJECT/NAME
    with_out = parse_config(["--data", "/d/data.yaml", "--out", str(tmp_path / "o"), "--resume", "auto"])
    assert resolve(with_out) == (tmp_path / "o", None)


def test_the_run_directory_is_where_ultralytics_8_4_puts_it(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """get_save_dir: runs/<task>/train, train2...; a relative --project under runs/<task>; an
    absolute one as it is."""
    from dataclasses import replace

    from trainer.output import resolve

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ORCH_RUN_ID", raising=False)
    cfg = parse_config(["--data", "/d/data.yaml"])
    assert resolve(replace(cfg, task="detect"))[0] == Path("runs/detect/train")
    assert resolve(replace(cfg, task="segment"))[0] == Path("runs/segment/train")
    (tmp_path / "runs" / "segment" / "train").mkdir(parents=True)
    assert resolve(replace(cfg, task="segment"))[0] == Path("runs/segment/train2")
    mine = parse_config(["--data", "/d/data.yaml", "project=p", "name=r1"])
    assert resolve(replace(mine, task="detect"))[0] == Path("runs/detect/p/r1")
    absolute = parse_config(["--data", "/d/data.yaml", "--project", str(tmp_path / "nfs")])
    assert resolve(replace(absolute, task="segment"))[0] == tmp_path / "nfs" / "train"


def test_under_orch_the_process_count_hint_names_the_inventory_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's `--nproc-per-node` is orch's `job.nproc_per_node`: the hint says what to edit."""
    cfg = cfg_of("--device", "cuda:0,1,2,3", "--batch", "8")
    monkeypatch.setenv("ORCH_RUN_ID", "r1")
    with pytest.raises(TrainerError) as info:
        check_topology(cfg, world_size=4, launched=True, local_world_size=2)
    assert "set job.nproc_per_node: 4 in the inventory" in str(info.value)
    assert "--nproc-per-node" not in str(info.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--lr0", "nan"],
        ["--momentum", "1e999"],
        ["--time", "inf"],
        ["--warmup-epochs", "nan"],
        ["lr0=.nan"],
        ["lr0=inf"],
        ["degrees=.inf"],
        ["--cfg", "hsv_h=.nan"],
    ],
)
def test_a_number_that_is_not_finite_is_refused(args: list[str]) -> None:
    """A flag's or a setting's number the user gives: `nan` was a learning rate, `inf` a time limit."""
    with pytest.raises((TrainerError, SystemExit)) as info:
        parse_config(["--data", "/d.yaml", *args], usage_errors=True)
    assert "not a finite number" in str(info.value), str(info.value)


def test_the_gradient_all_reduce_and_backend_flags() -> None:
    """--ddp-grad-dtype (default fp32: DDP's own all-reduce, as ultralytics), --bucket-mb (DDP's
    25 MB), --dist-backend (auto): each a choice or a positive number, recorded in the config."""
    cfg = parse_config(["--data", "/d.yaml"])
    assert (cfg.ddp_grad_dtype, cfg.bucket_mb, cfg.dist_backend) == ("fp32", 25.0, "auto")
    cfg = parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "fp16", "--bucket-mb", "50", "--dist-backend", "gloo"])
    assert (cfg.ddp_grad_dtype, cfg.bucket_mb, cfg.dist_backend) == ("fp16", 50.0, "gloo")
    with pytest.raises(TrainerError, match=r"--bucket-mb must be > 0, got 0"):
        parse_config(["--data", "/d.yaml", "--bucket-mb", "0"])
    with pytest.raises(TrainerError, match=r"invalid choice: 'int8'"):
        parse_config(["--data", "/d.yaml", "--ddp-grad-dtype", "int8"], usage_errors=True)
