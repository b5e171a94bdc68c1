"""NaN recovery and the checkpoints it recovers from (CPU, one process, no process group): the
guard sees every tensor that goes into last.pt, a recovered epoch is trained again differently
(not replayed into the same NaN), and last.pt is a checkpoint ultralytics itself can resume."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.offline import set_offline_env

set_offline_env()  # before ultralytics is imported

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import make_dataset  # noqa: E402

from trainer import checkpoint, loop  # noqa: E402
from trainer.config import parse_config  # noqa: E402
from trainer.dist import Topology  # noqa: E402

pytestmark = [pytest.mark.timeout(600)]

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("ds"), images=12, classes=2, imgsz=64)


def inputs(data: Path, out: Path, *argv: str) -> loop.Inputs:
    return loop.prepare(
        parse_config(
            [
                "--data",
                str(data),
                "--imgsz",
                "64",
                "--batch",
                "2",
                "--workers",
                "0",
                "--accumulate",
                "1",
                "--val-period",
                "0",
                "--plots",
                "false",
                "--out",
                str(out),
                *argv,
            ]
        ),
        Topology(),
        CPU,
    )


def test_batchnorm_statistics_made_non_finite_break_the_epoch(
    tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fp16 overflow in a BatchNorm's input leaves its running variance inf while every weight
    stays finite (training normalizes with the batch's own statistics): the guard must see it, or
    the EMA takes it over and last.pt saves it."""
    inp = inputs(data, tmp_path / "run")
    parts, train_set, _ = loop.build_parts(inp, 2)

    bn = next(m for m in parts.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    real_step = loop.optimizer_step

    def overflowed_step(parts: loop.Parts, clip: float) -> Any:
        bn.running_var.fill_(float("inf"))  # what a forward with an inf activation leaves behind
        return real_step(parts, clip)

    monkeypatch.setattr(loop, "optimizer_step", overflowed_step)
    loader = loop.make_loader(train_set, 2, inp, None)
    _, _, health = loop.train_epoch(0, loader, parts, inp, loop.State())
    assert all(torch.isfinite(p).all() for p in parts.model.parameters())  # the weights alone look fine
    assert not health.finite and health.broken, health


def test_a_non_finite_ema_breaks_the_epoch(tmp_path: Path, data: Path) -> None:
    inp = inputs(data, tmp_path / "run")
    parts, train_set, _ = loop.build_parts(inp, 2)
    with torch.no_grad():
        next(parts.ema.ema.parameters()).view(-1)[0] = float("nan")  # NaN stays NaN through every EMA update
    loader = loop.make_loader(train_set, 2, inp, None)
    _, _, health = loop.train_epoch(0, loader, parts, inp, loop.State())
    assert all(torch.isfinite(p).all() for p in parts.model.parameters())
    assert not health.finite and health.broken, health


def test_state_finite_reads_parameters_and_buffers_of_each_module() -> None:
    model, ema = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)), torch.nn.BatchNorm2d(4)
    assert loop.state_finite(model, ema).item() == 1.0
    ema.running_mean[0] = float("nan")
    assert loop.state_finite(model, ema).item() == 0.0
    assert loop.state_finite(model).item() == 1.0


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_state_finite_sees_each_kind_of_non_finite_value_and_no_finite_one(bad: float) -> None:
    """The check sums each tensor in float64: any NaN or infinity, of either sign, makes a sum
    non-finite, and the largest finite fp32 values do not (their float64 sum cannot overflow)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    with torch.no_grad():
        model[0].weight.fill_(torch.finfo(torch.float32).max)
        assert loop.state_finite(model).item() == 1.0
        model[0].weight.view(-1)[5] = bad
    assert loop.state_finite(model).item() == 0.0


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_recovered_epoch_is_trained_again_differently(
    tmp_path: Path, data: Path, workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole fit loop, its epoch 2 reported broken once: the second attempt starts from the
    EMA weights of last.pt (ultralytics' recovery), not from the weights that led to the NaN, and
    draws other augmentation (the RNG is not rewound; loader workers reseed for the attempt) over
    the same images in the same order. A replay bit for bit would meet a deterministic NaN again,
    three times, and stop the run."""
    out = tmp_path / "run"
    inp = inputs(data, out, "--epochs", "3", "--workers", workers, "--close-mosaic", "0")
    attempts: list[dict[str, Any]] = []
    real_epoch, real_pre = loop.train_epoch, loop.preprocess

    def spy_pre(batch: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if not attempts:  # the probe step before training
            return real_pre(batch, *args, **kwargs)
        attempts[-1]["files"].extend(Path(f).name for f in batch["im_file"])
        attempts[-1]["images"].append(digest(batch["img"]))
        return real_pre(batch, *args, **kwargs)

    def spy_epoch(epoch: int, loader: Any, parts: loop.Parts, inp: loop.Inputs, state: loop.State) -> Any:
        attempt = sum(a["epoch"] == epoch for a in attempts)
        attempts.append(
            {
                "epoch": epoch,
                "attempt": attempt,
                "files": [],
                "images": [],
                "start": {k: v.clone() for k, v in parts.model.state_dict().items()},
            }
        )
        means, throughput, health = real_epoch(epoch, loader, parts, inp, state)
        if epoch == 1 and attempt == 0:
            attempts[-1]["last"] = checkpoint.load_for_resume(out / "weights" / "last.pt")["trainer"]
            health = replace(health, finite=False)
        return means, throughput, health

    monkeypatch.setattr(loop, "preprocess", spy_pre)
    monkeypatch.setattr(loop, "train_epoch", spy_epoch)
    loop.fit(inp)
    assert [(a["epoch"], a["attempt"]) for a in attempts] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    first, second = attempts[1], attempts[2]
    assert first["files"] == second["files"]  # the same images in the same order (the sampler's epoch)
    assert first["images"] != second["images"], "the second attempt replayed the first one's augmentation"
    saved = first["last"]
    assert all(torch.equal(second["start"][k], v) for k, v in saved["ema"].items())  # the EMA's weights
    assert any(not torch.equal(saved["model"][k], v) for k, v in saved["ema"].items() if v.is_floating_point())


def mid_run_checkpoint(tmp_path: Path, data: Path, *argv: str) -> tuple[Path, loop.Parts, loop.Inputs]:
    """A run of 2 epochs stopped after its first: its last.pt, and the parts that wrote it."""
    out = tmp_path / "run"
    inp = inputs(data, out, "--epochs", "2", *argv)
    parts, train_set, _ = loop.build_parts(inp, 2)
    state = loop.State()
    loop.train_epoch(0, loop.make_loader(train_set, 2, inp, None), parts, inp, state)
    loop.end_epoch(0, None, {"box_loss": 1.0}, [[4, 0.1, 1.0]], parts, inp, state, out, None, 0.0)
    return out / "weights" / "last.pt", parts, inp


@pytest.mark.slow
def test_ultralytics_resumes_a_mid_run_last_pt(tmp_path: Path, data: Path) -> None:
    """``YOLO(last.pt).train(resume=True)``: ultralytics' Model.train takes it as a resumable
    checkpoint (an epoch and an optimizer state), its check_resume reads the settings back from
    train_args, its resume_training loads the optimizer, scaler and EMA and starts at epoch 2 in the
    run's own directory, and the run finishes there."""
    import subprocess

    from trainer_helpers import env

    last, _, _ = mid_run_checkpoint(tmp_path, data)
    script = (
        "import sys\nfrom trainer.offline import set_offline_env\nset_offline_env()\n"
        "from ultralytics import YOLO\nm = YOLO(sys.argv[1])\nm.train(resume=True)\n"
        "print('RESUMED', m.trainer.start_epoch, m.trainer.save_dir, m.trainer.epochs)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", script, str(last)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env()
    )
    both = r.stdout + r.stderr
    assert r.returncode == 0, both[-4000:]
    assert "not a resumable training checkpoint" not in both, both[-4000:]
    assert f"RESUMED 1 {last.parent.parent} 2" in r.stdout, both[-4000:]  # start_epoch: set by resume_training only
    assert torch.load(last, weights_only=False)["epoch"] == -1  # ultralytics finished the run in place


def test_the_trainers_own_resume_is_still_exact(tmp_path: Path, data: Path) -> None:
    """The optimizer state lives once in the file, in fp32, where ultralytics reads it; the
    trainer's resume puts back exactly what trained (model, EMA, optimizer) from it."""
    from trainer import checkpoint

    last, parts, inp = mid_run_checkpoint(tmp_path, data)
    ckpt = torch.load(last, weights_only=False)
    assert "optimizer" not in ckpt["trainer"] and "scaler" not in ckpt["trainer"]
    assert ckpt["train_args"]["save_dir"] == str(last.parent.parent.resolve())
    fresh, _, _ = loop.build_parts(inp, 2)
    state = loop.restore(checkpoint.load_for_resume(last), fresh, Topology())
    assert state.epoch == 1
    for mine, theirs in ((parts.model, fresh.model), (parts.ema.ema, fresh.ema.ema)):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))
    saved, loaded = parts.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for k, v in saved["state"].items():
        for name, t in v.items():
            assert t.dtype == loaded["state"][k][name].dtype and torch.equal(t, loaded["state"][k][name]), (k, name)
