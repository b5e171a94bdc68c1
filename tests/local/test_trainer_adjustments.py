"""What the trainer adjusts of the command line to what the run can use is said once at start-up
and recorded as used: loader workers beyond the batches an epoch has (a real run, one process)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import make_dataset, run_trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_workers_beyond_the_batches_of_an_epoch_are_said_and_recorded_as_used(tmp_path: Path) -> None:
    """One batch per epoch is loaded in the process (no workers): trainer.yaml said 2 while 0 ran."""
    data = make_dataset(tmp_path / "ds", images=4, imgsz=32)  # 3 training images: one batch of 4
    out = tmp_path / "run"
    result = run_trainer(
        [
            "--data",
            str(data),
            "--epochs",
            "1",
            "--batch",
            "4",
            "--imgsz",
            "32",
            "--workers",
            "2",
            "--val-period",
            "0",
            "--out",
            str(out),
        ]
    )
    assert result.returncode == 0, result.explain()
    said = [ln for ln in result.rank_lines() if "--workers 2 -> 0" in ln]
    assert len(said) == 1 and "1 batch(es) per epoch" in said[0], result.rank_lines()[:12]
    assert yaml.safe_load((out / "trainer.yaml").read_text())["workers"] == 0
    assert yaml.safe_load((out / "args.yaml").read_text())["workers"] == 0
