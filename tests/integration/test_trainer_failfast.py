"""The trainer fails fast and never stalls: a rank that raises takes the job down at once, and a
slow start-up (datasets built and cached at COCO scale) waits on its own long timeout, not on the
job's collective timeout. Real torchrun, gloo on CPU, 2 ranks, 64 px, n-scale.

These bound a duration by a deadline on the processes, never a timed assertion. Only the 6 s
collective timeout runs in the foreground lane (first in line for the CPU, tests/conftest.py);
the others' deadlines leave a loaded machine room.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.trainer_helpers import REPO, make_dataset, run_nodes, run_trainer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_ONCE = REPO / "tests" / "kill_once"


def test_a_rank_that_raises_aborts_and_every_rank_exits(tmp_path: Path) -> None:
    """Rank 1 (its own torchrun, as on a second node) raises after optimizer step 3. It aborts the
    process group instead of leaving it gracefully, says so in one line, and exits non-zero; rank 0,
    in a collective with it, errors out too. Both end long before the 5 min collective timeout:
    a rank left waiting until then fails the deadline (TimeoutExpired)."""
    data = make_dataset(tmp_path / "ds", images=16, classes=2)
    args = [
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        "3",
        "--batch",
        "2",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--accumulate",
        "1",
        "--val-period",
        "0",
        "--timeout-min",
        "5",
        "--out",
        str(tmp_path / "run"),
    ]
    hook = {
        "PYTHONPATH": f"{KILL_ONCE}:{REPO}",
        "ORCH_TEST_KILL_RANK": "1",
        "ORCH_TEST_KILL_AT_STEP": "3",
        "ORCH_TEST_KILL_HOW": "raise",
        "ORCH_TEST_KILL_MARKER": str(tmp_path / "raised"),
    }
    try:
        node0, node1 = run_nodes(args, [tmp_path / "h0", tmp_path / "h1"], timeout=240, extra_env=hook)
    except subprocess.TimeoutExpired as e:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"a rank was still running {e.timeout:.0f} s after rank 1 raised (collective timeout 5 min)")
    assert (tmp_path / "raised").exists(), node1.stderr[-3000:]
    assert node1.returncode != 0 and node0.returncode != 0, (node0.explain(), node1.explain())
    abort_lines = [ln for ln in node1.rank_lines("stderr") if "process group aborted" in ln]
    assert abort_lines and abort_lines[0].startswith("[rank 1] error: RuntimeError: test: rank 1 fails"), (
        node1.explain()
    )
    assert "RuntimeError: test: rank 1 fails after optimizer step 3" in node1.stderr  # the traceback is kept


@pytest.mark.foreground  # a collective timeout of 6 s: load could starve a healthy rank that long
def test_a_slow_start_up_outlasts_a_short_collective_timeout(tmp_path: Path) -> None:
    """Rank 0's first dataset build takes 15 s longer than rank 1's, with a collective timeout of
    6 s: the start-up barriers are on the gloo group with the long start-up timeout, so rank 1
    waits there and the run trains; meanwhile rank 0 says every 4 s what it is building."""
    data = make_dataset(tmp_path / "ds", images=8, classes=2)
    args = [
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        "1",
        "--batch",
        "4",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--timeout-min",
        "0.1",
        "--progress-every-s",
        "4",
        "--out",
        str(tmp_path / "run"),
    ]
    r = run_trainer(args, nproc=2, slow_build_s=15)
    assert r.returncode == 0, r.explain()
    beats = [ln for ln in r.rank_lines() if ln.startswith("[rank 0] startup: building the datasets, ")]
    assert beats, r.explain()
    assert any(ln.startswith("[rank 0] done: 1 epochs") for ln in r.rank_lines()), r.explain()


def test_an_infinite_loss_is_counted_and_recovered_from_last_pt(tmp_path: Path) -> None:
    """One process, fp32 on CPU: the loss of micro-step 6 (the last of epoch 2, 3 steps an epoch)
    is infinite, which makes the weights NaN (no GradScaler to skip the step). The progress line
    counts it, the run names that batch's images, says it recovers from last.pt and trains epoch 2
    again (not as the first time: from last.pt's EMA weights, at half the rate, without those
    images, so in 2 batches), and ends with finite weights and finite losses in results.csv, whose
    steps/* columns count the troubled steps of each epoch kept and its recoveries."""
    import torch

    from tests.trainer_helpers import read_results

    data = make_dataset(tmp_path / "ds", images=8, classes=2)
    out = tmp_path / "run"
    args = [
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        "3",
        "--batch",
        "2",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--accumulate",
        "1",
        "--val-period",
        "0",
        "--log-every",
        "1",
        "--out",
        str(out),
    ]
    r = run_trainer(args, inf_loss_at=6)
    assert r.returncode == 0, r.explain()
    lines = r.rank_lines()
    assert any(
        ln.startswith("[rank 0] epoch 2/3 batch 3/3 ") and ln.endswith(" nonfinite 1 skipped 0") for ln in lines
    ), r.explain()
    named = [ln for ln in lines if "the first non-finite loss came from" in ln]
    assert len(named) == 1 and named[0].startswith(
        "[rank 0] warning: epoch 2: the first non-finite loss came from rank 0 batch 3, images "
    ), r.explain()
    recovery = [ln for ln in lines if "recovering from" in ln]
    assert len(recovery) == 1 and recovery[0] == (
        f"[rank 0] warning: epoch 2: the weights are no longer finite after 1 non-finite loss(es); recovering from "
        f"{out}/weights/last.pt (epoch 1) and training epoch 2 again, attempt 1/3: lr x0.5 for this epoch, another "
        "image order, 2 image(s) left out (above)"
    ), r.explain()
    assert lines.index(named[0]) < lines.index(recovery[0])
    again = [ln for ln in lines[lines.index(recovery[0]) :] if ln.startswith("[rank 0] epoch 2/3 batch ")]
    assert [ln.split()[5] for ln in again] == ["1/2", "2/2"], r.explain()  # 4 images left: not a replay
    rows = read_results(out)
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert all(row["steps/nonfinite"] == 0 and row["steps/skipped"] == 0 for row in rows)  # the kept epochs
    assert [row["steps/recoveries"] for row in rows] == [0, 1, 0]
    assert all(torch.isfinite(torch.tensor(v)) for row in rows for k, v in row.items() if k.startswith("train/"))
    model = torch.load(out / "weights" / "last.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_fp16_warm_up_skipping_a_whole_first_epoch_trains_on(tmp_path: Path) -> None:
    """A GradScaler whose first 5 steps overflow (fp16's warm-up while its scale falls from 2^16;
    forced on the CPU), 3 steps an epoch: epoch 1 skips all of its steps, which is warm-up and not
    divergence (ultralytics never stops on skipped steps): the run goes on, without recovering,
    and results.csv counts the skipped steps of each epoch."""
    from tests.trainer_helpers import read_results

    data = make_dataset(tmp_path / "ds", images=8, classes=2)
    out = tmp_path / "run"
    args = [
        "--model",
        "yolo12n.yaml",
        "--data",
        str(data),
        "--epochs",
        "2",
        "--batch",
        "2",
        "--imgsz",
        "64",
        "--workers",
        "0",
        "--accumulate",
        "1",
        "--val-period",
        "0",
        "--log-every",
        "1",
        "--out",
        str(out),
    ]
    r = run_trainer(args, overflow_steps=5)
    assert r.returncode == 0, r.explain()
    lines = r.rank_lines()
    assert any(
        ln.startswith("[rank 0] epoch 1/2 batch 3/3 ") and ln.endswith(" nonfinite 0 skipped 3") for ln in lines
    ), r.explain()
    assert not any("recovering from" in ln or "diverges" in ln for ln in lines), r.explain()
    assert [(row["epoch"], row["steps/skipped"]) for row in read_results(out)] == [(1, 3), (2, 2)]


def test_a_rank_that_dies_building_its_dataset_ends_the_run_at_once_and_is_named(tmp_path: Path) -> None:
    """`orch up`, two local nodes of one rank: rank 1 is SIGKILLed while it builds its datasets (as
    the OOM killer would, caching images), after the label caches' turns. Rank 0 builds its own and
    waits for rank 1 on the rendezvous store, with a start-up timeout of 30 min and a heartbeat
    that keeps orch's stall watchdog quiet; orch's fail-fast ends the run anyway as soon as rank 1's
    torchrun reports the death (the run's deadline is 4 min: waiting out the start-up timeout fails
    it), and the first failure it names is rank 1 on n1, not rank 0 that was left waiting."""
    import json

    import yaml

    from tests.ports import job_port
    from tests.up_helpers import Orch

    data = make_dataset(tmp_path / "ds", images=8, classes=2)
    marker = tmp_path / "died"
    python = REPO / ".venv" / "bin" / "python"
    args = [
        *("--model", "yolo12n.yaml", "--data", str(data), "--epochs", "1", "--batch", "2", "--imgsz", "64"),
        *("--workers", "0", "--timeout-min", "30", "--startup-timeout-min", "30", "--progress-every-s", "2"),
        *("--out", str(tmp_path / "run"), "--plots", "false"),
    ]
    die = {
        "PYTHONPATH": str(KILL_ONCE),
        "ORCH_TEST_KILL_RANK": "1",
        "ORCH_TEST_KILL_AT_STEP": "build",
        "ORCH_TEST_KILL_MARKER": str(marker),
    }
    inv = tmp_path / "local.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "died-building",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1", "env": die}],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                "job": {
                    "python": str(python) if python.exists() else "python3",
                    "workdir": str(REPO),
                    "run_root": str(tmp_path / "nodes"),
                    "module": "trainer",
                    "nproc_per_node": 1,
                    "stop_grace_s": 5,
                    "args": args,
                },
            }
        )
    )
    orch = Orch(tmp_path / "home")
    try:
        up = orch.run("up", str(inv), "--skip-checks", "--run-id", "died", timeout=240)
    except subprocess.TimeoutExpired:  # pragma: no cover - the failure this test exists for
        pytest.fail("the run was still waiting 4 min after rank 1 died building its datasets")
    assert marker.read_text() == "rank 1 killed building its datasets\n", up.stderr[-3000:]
    assert up.returncode == 1, up.stderr[-3000:]
    err = " ".join(up.stderr.split())
    assert "first failure on n1 (node rank 1, rank 1): killed by SIGKILL" in err, up.stderr[-3000:]
    assert "first failure on n0" not in err
    first = json.loads((orch.run_dir("died") / "run.json").read_text())["first_failure"]
    assert (first["node"], first["rank"], first["signal"]) == ("n1", 1, "SIGKILL"), first
    assert "[rank 0] done" not in up.stdout  # rank 0 never trained: it was stopped while it waited
