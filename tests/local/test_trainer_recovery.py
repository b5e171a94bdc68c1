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
from trainer_helpers import make_dataset, read_results  # noqa: E402

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
def test_a_recovered_epoch_changes_what_caused_the_nan(
    tmp_path: Path, data: Path, workers: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole fit loop with a GradScaler (on the CPU): the loss of epoch 1's first batch and of
    epoch 2's second batch made infinite (the scaler skips both steps, halving its scale), and epoch
    2 reported broken once. The second attempt starts from the EMA weights of last.pt (ultralytics'
    recovery), not from the weights that led to the NaN, and changes what caused it instead of
    replaying it three times: half the rate for that epoch (said, and in results.csv), the
    GradScaler from its initial scale (not last.pt's), the images of the batch whose loss was first
    non-finite named and left out for the rest of the run, the others in another order."""
    out = tmp_path / "run"
    inp = inputs(data, out, "--epochs", "3", "--workers", workers, "--close-mosaic", "0", "--warmup-epochs", "0")
    attempts: list[dict[str, Any]] = []
    poison = {(0, 0, 0), (1, 0, 1)}  # (epoch, attempt, batch index) whose loss is made infinite
    armed = [False]
    real_epoch, real_pre, real_build, real_advance = (
        loop.train_epoch,
        loop.preprocess,
        loop.build_parts,
        loop.advance_criterion,
    )

    def spy_pre(batch: dict[str, Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        if attempts:  # not the probe step before training
            now = attempts[-1]
            armed[0] = (now["epoch"], now["attempt"], len(now["batches"])) in poison
            now["batches"].append(list(batch["im_file"]))
        return real_pre(batch, *args, **kwargs)

    def with_scaler(*args: Any, **kwargs: Any) -> Any:
        parts, train_set, val_set = real_build(*args, **kwargs)
        parts.scaler = torch.amp.GradScaler("cpu")
        return parts, train_set, val_set

    def poisoned(model: Any, epoch: int) -> None:
        real_advance(model, epoch)
        criterion = model.criterion
        if getattr(criterion, "poisoned", False):
            return
        original = type(criterion).__call__

        class Poisoned(type(criterion)):  # type: ignore[misc]
            poisoned = True

            def __call__(self, preds: Any, batch: Any) -> Any:
                loss, items = original(self, preds, batch)
                return (loss * float("inf"), items) if armed[0] else (loss, items)

        criterion.__class__ = Poisoned

    def spy_epoch(epoch: int, loader: Any, parts: loop.Parts, inp: loop.Inputs, state: loop.State) -> Any:
        attempt = sum(a["epoch"] == epoch for a in attempts)
        assert parts.scaler is not None
        if epoch == 2:  # the recovered epoch's checkpoint: what a resume would leave out
            attempts[-1]["saved_left_out"] = checkpoint.load_for_resume(out / "weights" / "last.pt")["trainer"][
                "left_out"
            ]
        attempts.append(
            {
                "epoch": epoch,
                "attempt": attempt,
                "batches": [],
                "start": {k: v.clone() for k, v in parts.model.state_dict().items()},
                "scale": parts.scaler.get_scale(),
                "rate": parts.optimizer.param_groups[0]["initial_lr"] * parts.lf(epoch),
            }
        )
        means, throughput, health = real_epoch(epoch, loader, parts, inp, state)
        attempts[-1]["lr"] = parts.optimizer.param_groups[0]["lr"]
        if epoch == 1 and attempt == 0:
            attempts[-1]["last"] = checkpoint.load_for_resume(out / "weights" / "last.pt")
            health = replace(health, finite=False)
        return means, throughput, health

    monkeypatch.setattr(loop, "preprocess", spy_pre)
    monkeypatch.setattr(loop, "train_epoch", spy_epoch)
    monkeypatch.setattr(loop, "build_parts", with_scaler)
    monkeypatch.setattr(loop, "advance_criterion", poisoned)
    loop.fit(inp)
    said = capsys.readouterr().out.splitlines()
    assert [(a["epoch"], a["attempt"]) for a in attempts] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    first, second, after = attempts[1], attempts[2], attempts[3]
    # from last.pt's EMA weights
    saved = first["last"]["trainer"]
    assert all(torch.equal(second["start"][k], v) for k, v in saved["ema"].items())
    assert any(not torch.equal(saved["model"][k], v) for k, v in saved["ema"].items() if v.is_floating_point())
    # the batch whose loss was first non-finite: named, and its images left out from then on
    culprit = first["batches"][1]
    named = [ln for ln in said if "the first non-finite loss came from" in ln]
    assert named == [
        f"[rank 0] warning: epoch 2: the first non-finite loss came from rank 0 batch 2, images {', '.join(culprit)}: "
        "left out of training from now on; check their labels (boxes outside the image, degenerate boxes, empty "
        "files)"
    ], said
    trained = [f for b in first["batches"] for f in b]
    kept = [f for f in trained if f not in culprit]
    again = [f for b in second["batches"] for f in b]
    assert sorted(again) == sorted(kept) and again != kept  # another order of the images left in
    assert not set(culprit) & {f for b in after["batches"] for f in b}  # for the rest of the run
    # the GradScaler starts over: not the scale last.pt saved (halved by epoch 1's skipped step)
    assert first["last"]["scaler"]["scale"] == 2.0**15 and second["scale"] == 2.0**16
    recovered = [ln for ln in said if "recovering from" in ln]
    assert len(recovered) == 1 and recovered[0].endswith(
        "training epoch 2 again, attempt 1/3: lr x0.5 for this epoch, another image order, GradScaler reset to "
        "65536, 2 image(s) left out (above)"
    ), recovered
    # half the rate for that epoch, in results.csv too; the next epoch at its own rate
    assert second["lr"] == pytest.approx(0.5 * second["rate"]) and after["lr"] == pytest.approx(after["rate"])
    rows = read_results(out)
    assert rows[1]["lr/pg0"] == pytest.approx(0.5 * second["rate"], rel=1e-5) and rows[1]["steps/recoveries"] == 1
    assert rows[2]["lr/pg0"] == pytest.approx(after["rate"], rel=1e-5) and rows[2]["steps/recoveries"] == 0
    assert second["saved_left_out"] == sorted(culprit)


def mid_run_checkpoint(tmp_path: Path, data: Path, *argv: str) -> tuple[Path, loop.Parts, loop.Inputs]:
    """A run of 2 epochs stopped after its first: its last.pt, and the parts that wrote it."""
    out = tmp_path / "run"
    inp = inputs(data, out, "--epochs", "2", *argv)
    parts, train_set, _ = loop.build_parts(inp, 2)
    state = loop.State()
    loop.train_epoch(0, loop.make_loader(train_set, 2, inp, None), parts, inp, state)
    state.left_out = {train_set.im_files[0]}  # as NaN recovery leaves images out
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
    assert state.epoch == 1 and len(state.left_out) == 1  # the images NaN recovery left out stay out
    for mine, theirs in ((parts.model, fresh.model), (parts.ema.ema, fresh.ema.ema)):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))
    saved, loaded = parts.optimizer.state_dict(), fresh.optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for k, v in saved["state"].items():
        for name, t in v.items():
            assert t.dtype == loaded["state"][k][name].dtype and torch.equal(t, loaded["state"][k][name]), (k, name)
