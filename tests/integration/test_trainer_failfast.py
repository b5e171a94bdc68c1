"""The trainer fails fast and never stalls: a rank that raises takes the job down at once, and a
slow start-up (datasets built and cached at COCO scale) waits on its own long timeout, not on the
job's collective timeout. Real torchrun, gloo on CPU, 2 ranks, 64 px, n-scale.

These bound a duration (a deadline on the processes, never a timed assertion), so they run alone.
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
    args = ["--model", "yolo12n.yaml", "--data", str(data), "--epochs", "3", "--batch", "2", "--imgsz", "64",
            "--workers", "0", "--accumulate", "1", "--val-period", "0", "--timeout-min", "5",
            "--out", str(tmp_path / "run")]
    hook = {"PYTHONPATH": f"{KILL_ONCE}:{REPO}", "ORCH_TEST_KILL_RANK": "1", "ORCH_TEST_KILL_AT_STEP": "3",
            "ORCH_TEST_KILL_HOW": "raise", "ORCH_TEST_KILL_MARKER": str(tmp_path / "raised")}
    try:
        node0, node1 = run_nodes(args, [tmp_path / "h0", tmp_path / "h1"], timeout=240, extra_env=hook)
    except subprocess.TimeoutExpired as e:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"a rank was still running {e.timeout:.0f} s after rank 1 raised (collective timeout 5 min)")
    assert (tmp_path / "raised").exists(), node1.stderr[-3000:]
    assert node1.returncode != 0 and node0.returncode != 0, (node0.explain(), node1.explain())
    abort_lines = [ln for ln in node1.rank_lines("stderr") if "process group aborted" in ln]
    assert abort_lines and abort_lines[0].startswith("[rank 1] error: RuntimeError: test: rank 1 fails"), node1.explain()
    assert "RuntimeError: test: rank 1 fails after optimizer step 3" in node1.stderr  # the traceback is kept


def test_a_slow_start_up_outlasts_a_short_collective_timeout(tmp_path: Path) -> None:
    """Rank 0's first dataset build takes 15 s longer than rank 1's, with a collective timeout of
    6 s: the start-up barriers are on the gloo group with the long start-up timeout, so rank 1
    waits there and the run trains; meanwhile rank 0 says every 4 s what it is building."""
    data = make_dataset(tmp_path / "ds", images=8, classes=2)
    args = ["--model", "yolo12n.yaml", "--data", str(data), "--epochs", "1", "--batch", "4", "--imgsz", "64",
            "--workers", "0", "--timeout-min", "0.1", "--progress-every-s", "4", "--out", str(tmp_path / "run")]
    r = run_trainer(args, nproc=2, slow_build_s=15)
    assert r.returncode == 0, r.explain()
    beats = [ln for ln in r.rank_lines() if ln.startswith("[rank 0] startup: building the datasets, ")]
    assert beats, r.explain()
    assert any(ln.startswith("[rank 0] done: 1 epochs") for ln in r.rank_lines()), r.explain()
