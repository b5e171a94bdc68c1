"""A warning signal (SIGUSR2: Slurm's `--signal` before a time limit or a preemption) reaches one
rank mid-epoch: every rank stops at the same optimizer step, rank 0 writes `weights/last.pt` there,
every rank exits 75 (the trainer's "preempted"), and `--resume` continues mid-epoch to the
uninterrupted run's weights, losses and rates, bit for bit (the session's `trainer_reference`: the
same flags and world size). torchrun with 2 ranks, gloo."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.trainer_helpers import Reference, read_results, run_trainer, train_loss
from tests.up_helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KILL_ONCE = REPO / "tests" / "kill_once"
STEPS_PER_EPOCH = 4
"""16 training images of the 20, a global batch of 4 on 2 ranks, --accumulate 1: 4 optimizer steps an
epoch; the ranks agree on the signal every --log-every 2 of them."""


def test_a_warned_rank_stops_every_rank_at_one_step_and_the_resume_continues_mid_epoch(
    trainer_reference: Reference, tmp_path: Path
) -> None:
    ref = trainer_reference
    marker = tmp_path / "warned"
    at = STEPS_PER_EPOCH + 1  # rank 1 alone gets the signal after the 1st step of epoch 2
    warn = {
        "PYTHONPATH": str(KILL_ONCE),
        "ORCH_TEST_KILL_RANK": "1",
        "ORCH_TEST_KILL_AT_STEP": str(at),
        "ORCH_TEST_KILL_MARKER": str(marker),
        "ORCH_TEST_KILL_HOW": "warn",
    }
    args = ref.args(out=tmp_path / "run", debug_dir=tmp_path / "debug")
    first = run_trainer(args, nproc=2, extra_env=warn)
    assert first.returncode != 0, first.explain()
    assert marker.read_text() == f"rank 1 warned after optimizer step {at}\n"
    said = first.stdout + first.stderr
    # both ranks stopped at the 2nd step, where they agree; the first to exit is torchrun's root cause
    assert re.search(r"exitcode\s*: 75 ", said.split("Root Cause")[-1]), said[-3000:]
    stopped = re.findall(r"\[rank (\d)\] preempted \(SIGUSR2\): checkpoint \S+ in epoch 2 after batch 2 of 4;", said)
    assert sorted(set(stopped)) == ["0", "1"], said[-3000:]
    assert (tmp_path / "run" / "weights" / "last.pt").is_file()
    assert len(read_results(tmp_path / "run")) == 1  # epoch 2 was not finished

    resumed = run_trainer([*args, "--resume"], nproc=2)
    assert resumed.returncode == 0, resumed.explain()
    lines = resumed.rank_lines()
    assert any("resuming at epoch 2 (checkpoint finished epoch 1, " in ln for ln in lines), lines[-20:]
    assert any("the first 2 batches of epoch 2 are loaded again, not trained" in ln for ln in lines), lines[-20:]
    a, b = ref.rows(), read_results(tmp_path / "run")
    assert len(b) == 3
    assert train_loss(b[2]) == train_loss(a[2]) and b[2]["lr/pg0"] == a[2]["lr/pg0"]
    checksums = [json.loads((tmp_path / "debug" / f"rank{r}.json").read_text())["checksum"] for r in (0, 1)]
    assert checksums == [ref.checksum(0), ref.checksum(1)]
