"""`python -m trainer --check`: what a start refuses is refused (with the start's own message),
what a start accepts is accepted, and nothing is trained or written. In process, on a tiny
synthetic dataset; the `python -m trainer --check` process itself is run once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.trainer_helpers import make_dataset
from trainer import check, output
from trainer.config import check_topology, parse_config
from trainer.errors import TrainerError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("check-data"), images=8, imgsz=32)


@pytest.fixture(autouse=True)
def single_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "ORCH_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def refused(argv: list[str]) -> TrainerError:
    with pytest.raises(TrainerError) as info:
        check.check(argv)
    return info.value


def test_a_typo_is_the_argparse_error_line_with_the_flag_it_meant() -> None:
    err = refused(["--data", "/d.yaml", "--epocs", "24"])
    assert str(err) == "python -m trainer: error: unrecognized arguments: --epocs (did you mean --epochs?)"
    assert err.stage == "arguments"  # type: ignore[attr-defined]


def test_what_a_start_accepts_is_accepted_and_nothing_is_written(data: Path, tmp_path: Path) -> None:
    answer = check.check(["--data", str(data), "--batch", "4", "--epochs", "2", "--imgsz", "32"])
    assert answer["ok"] is True and answer["trainer_check"] == check.SCHEMA
    assert (answer["model"], answer["task"], answer["classes"], answer["device"]) == (
        "yolo12n.yaml",
        "detect",
        3,
        "cpu",
    )
    assert answer["out"] == str(tmp_path / "runs" / "detect" / "train")  # runs/<task>/train, as ultralytics 8.4
    assert list(tmp_path.iterdir()) == [], "the check wrote something"
    assert "model build (--freeze layer names)" in answer["not_verified"]


def test_the_world_comes_from_torchruns_environment_as_at_start(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "32")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    err = refused(["--data", str(data), "--batch", "100"])
    with pytest.raises(TrainerError) as start:  # the start's own rule, word for word
        check_topology(parse_config(["--data", str(data), "--batch", "100"]), 32, True, 8)
    assert str(err) == str(start.value) and "use 96 or 128" in str(err)
    assert err.stage == "topology"  # type: ignore[attr-defined]
    err = refused(["--data", str(data), "--batch", "64", "--device", "0,1,2,3"])
    assert "--device 0,1,2,3 names 4 GPUs but torchrun started 8 process(es) on this node" in str(err)


def test_an_out_that_holds_a_run_is_the_trainers_message(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "weights").mkdir(parents=True)
    (out / "weights" / "last.pt").write_bytes(b"")
    err = refused(["--data", str(data), "--batch", "4", "--out", str(out)])
    with pytest.raises(TrainerError) as start:
        output.resolve(parse_config(["--data", str(data), "--batch", "4", "--out", str(out)]))
    assert (
        str(err)
        == str(start.value)
        == (f"--out {out} already holds a run (weights/last.pt): add --resume, or pick another --out")
    )
    # with --resume the checkpoint is read as the start reads it: an empty file is refused, in words
    err = refused(["--data", str(data), "--batch", "4", "--out", str(out), "--resume"])
    assert str(err).startswith(f"--resume {out}/weights/last.pt: cannot be read as a checkpoint")
    assert err.stage == "run directory"  # type: ignore[attr-defined]


def test_only_rank_0_decides_the_run_directory(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    (out / "weights").mkdir(parents=True)
    (out / "weights" / "last.pt").write_bytes(b"")
    monkeypatch.setenv("RANK", "8")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    answer = check.check(["--data", str(data), "--batch", "16", "--out", str(out)])
    assert answer["ok"] and "out" not in answer and answer["rank"] == 8


def test_inputs_are_checked_as_at_start(data: Path, tmp_path: Path) -> None:
    assert "no such file" in str(refused(["--data", str(tmp_path / "nope.yaml")]))
    assert str(refused(["--data", str(data), "--weights", str(tmp_path / "w.pt")])).startswith(
        f"--weights {tmp_path}/w.pt: no such file"
    )
    assert str(refused(["--data", str(data), "--model", "yolo12q.yaml"])).startswith("--model yolo12q.yaml: unknown")
    # a rule the start used to apply only after building the model
    assert str(refused(["--data", str(data), "--prompt-mode", "full"])) == (
        "--prompt-mode is for YOLOE models; --model yolo12n.yaml is yolo12n.yaml"
    )
    assert "needs CUDA" in str(refused(["--data", str(data), "--amp"]))


def test_the_command_answers_one_json_line_and_exits_2_when_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--check", "--data", "/nowhere/d.yaml", "--epocs", "2"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == {
        "trainer_check": 1,
        "ok": False,
        "stage": "arguments",
        "error": "python -m trainer: error: unrecognized arguments: --epocs (did you mean --epochs?)",
    }
    assert "usage:" not in proc.stderr


def test_a_segment_model_on_a_detection_dataset_is_refused_before_launch(data: Path, tmp_path: Path) -> None:
    """The run of issue 43 failed on one rank after start-up with ultralytics' `Segment dataset
    requires equal numbers of boxes and segments`; the check names the label file and the fix."""
    err = refused(["--data", str(data), "--model", "yolo12n-seg.yaml", "--imgsz", "32"])
    assert err.stage == "inputs"  # type: ignore[attr-defined]
    assert "is a box (class x y w h), but --model yolo12n-seg.yaml is a segment model" in str(err), str(err)
    assert "/labels/" in str(err) and "use a detection model" in str(err)
    seg = make_dataset(tmp_path / "seg", images=4, imgsz=32, segments=True)
    assert check.check(["--data", str(seg), "--model", "yolo12n-seg.yaml", "--imgsz", "32"])["task"] == "segment"
    assert check.check(["--data", str(seg), "--imgsz", "32"])["task"] == "detect"  # boxes from polygons: fine


def test_an_architecture_spelled_with_a_v_is_refused_with_the_name_it_meant(data: Path) -> None:
    """Field guide 004 writes `yolov12s.yaml`; ultralytics names it `yolo12s.yaml`."""
    err = str(refused(["--data", str(data), "--model", "yolov12s.yaml"]))
    assert err.startswith("--model yolov12s.yaml: unknown architecture (did you mean yolo12s.yaml?)"), err
    assert "did you mean yoloe-v8l-seg.yaml?" in str(refused(["--data", str(data), "--model", "yoloe-v8l-sge.yaml"]))
    assert "did you mean" not in str(refused(["--data", str(data), "--model", "resnet50.yaml"]))


def test_every_refusal_of_one_command_comes_at_once(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Field guide 001's line on a CPU node took three launches to learn about --device, --amp and
    --sync-bn, one refusal each: now one answer names all three (the check's and the start's)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "4")):
        monkeypatch.setenv(name, value)
    err = str(
        refused(
            [
                "--data",
                str(data),
                "--batch-size",
                "64",
                "--amp",
                "--sync-bn",
                "--gradient-accumulation",
                "2",
                "--device",
                "0,1,2,3",
            ]
        )
    )
    assert err.startswith("3 problems: "), err
    for said in (
        "--device 0,1,2,3 but torch sees no GPU",
        "--amp on: fp16 mixed precision needs CUDA",
        "--sync-bn needs CUDA",
    ):
        assert said in err, err
    from trainer import dist as tdist

    cfg = parse_config(["--data", str(data), "--batch", "64", "--amp", "--sync-bn", "--device", "0,1,2,3"])
    with pytest.raises(TrainerError) as start:  # what every rank of a start prints, the same problems
        tdist.start_device(cfg, tdist.Topology.from_env(), select=False)
    assert str(start.value) == err


def test_every_range_problem_of_the_arguments_comes_at_once() -> None:
    with pytest.raises(TrainerError) as info:
        parse_config(["--data", "/d.yaml", "--epochs", "0", "--imgsz", "0", "--workers", "-1", "--fraction", "2"])
    text = str(info.value)
    assert text.startswith("4 problems: ")
    for said in ("--epochs must be >= 1", "--imgsz must be >= 1", "--workers must be >= 0", "--fraction must be in"):
        assert said in text
    with pytest.raises(TrainerError) as one:  # one problem reads as before
        parse_config(["--data", "/d.yaml", "--epochs", "0"])
    assert str(one.value) == "--epochs must be >= 1, got 0"


def test_argument_and_device_refusals_come_together(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A range rule of the arguments and the device's problems are one answer, not two launches."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    err = refused(["--data", str(data), "--epochs", "0", "--amp"])
    assert str(err).startswith("2 problems: 1) --epochs must be >= 1, got 0; 2) --amp on: fp16"), str(err)
    assert err.stage == "arguments"  # type: ignore[attr-defined]


def test_a_yoloe_model_without_prompts_is_refused_with_the_starts_message(data: Path) -> None:
    """Every rank of a start would fail building it: the check must say so, not ok."""
    err = refused(["--data", str(data), "--model", "yoloe-11s.yaml", "--imgsz", "32"])
    assert str(err).startswith("YOLOE needs text-prompt embeddings (yoloe-11s.yaml): pass --text-embeddings FILE")
    assert err.stage == "inputs"  # type: ignore[attr-defined]


def test_the_input_refusals_come_with_the_device_refusals(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--amp and --sync-bn on a CPU were refused first and the YOLOE embeddings only once those were
    fixed (and --ddp-grad-dtype bf16 and MuSGD on a V100 after that): one command, one refusal
    naming every problem, from the check and from the start alike."""
    import torch

    from trainer import dist as tdist
    from trainer import loop

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    argv = ["--data", str(data), "--model", "yoloe-11s.yaml", "--imgsz", "32", "--batch", "4", "--amp", "--sync-bn"]
    err = refused(argv)
    assert str(err).startswith("3 problems: 1) --amp on: fp16 mixed precision needs CUDA"), str(err)
    assert "2) --sync-bn needs CUDA" in str(err)
    assert "3) YOLOE needs text-prompt embeddings (yoloe-11s.yaml)" in str(err)
    assert err.stage == "device"  # type: ignore[attr-defined]
    with pytest.raises(TrainerError) as start:  # what every rank of a start prints
        loop.admit(parse_config(argv), tdist.Topology.from_env(), [], select=False)
    assert str(start.value) == str(err)
    # a V100: what needs bfloat16, with the inputs' own problem, at once
    cfg = parse_config(["--data", str(data), "--imgsz", "32", "--ddp-grad-dtype", "bf16", "--optimizer", "MuSGD"])
    with pytest.raises(TrainerError) as v100:
        loop.prepare(
            replace(cfg, text_embeddings="/no/such.pt"),
            tdist.Topology(),
            torch.device("cuda", 0),
            capability=(7, 0),
        )
    said = str(v100.value)
    assert said.startswith("3 problems: 1) --text-embeddings is for YOLOE models"), said
    assert "2) --ddp-grad-dtype bf16: cuda:0 has compute capability 7.0" in said and "3) --optimizer MuSGD" in said


def test_gloo_lets_two_ranks_share_one_gpu_and_nccl_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dist-backend gloo: a rank whose LOCAL_RANK has no GPU of its own shares one (the GPU
    validation's two ranks on its one GPU); NCCL refuses that, and so does the trainer under it."""
    import torch

    from trainer import dist as tdist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    second = tdist.Topology(rank=1, local_rank=1, world_size=2, launched=True, local_world_size=2)
    assert tdist.pick_device("cuda", second, "gloo") == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="LOCAL_RANK 1 has no GPU: this node shows 1"):
        tdist.pick_device("cuda", second, "nccl")
    assert tdist.backend_of("auto", torch.device("cuda", 0)) == "nccl"
    assert tdist.backend_of("gloo", torch.device("cuda", 0)) == "gloo"
    assert tdist.backend_of("auto", torch.device("cpu")) == "gloo"
    err = refused(["--data", "/d.yaml", "--device", "cpu", "--dist-backend", "nccl"])
    assert "--dist-backend nccl needs CUDA" in str(err)
