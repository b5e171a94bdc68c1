"""The per-micro-step path never reads the device back to the host: counted on CPU by patching the
tensor methods that would wait for a GPU (item, tolist, float()...), for calls from trainer/ code."""

from __future__ import annotations

import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the shared trainer helpers
from trainer_helpers import Result, make_dataset, run_trainer_counting_syncs  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_host_reads_do_not_grow_with_the_number_of_micro_steps(tmp_path: Path) -> None:
    def run(images: int) -> tuple[Result, dict[str, int]]:
        data = make_dataset(tmp_path / f"ds{images}", images=images, imgsz=64)
        return run_trainer_counting_syncs(
            [
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
                "2",
                "--log-every",
                "1000",
                "--val-period",
                "0",
                "--out",
                str(tmp_path / f"run{images}"),
            ],
            tmp_path / f"syncs{images}.json",
        )

    counts = {}
    steps = {}
    with ThreadPoolExecutor(2) as pool:  # two single-process runs, one a core: side by side
        runs = dict(zip((12, 36), pool.map(run, (12, 36))))  # 9 and 27 training images: 5 and 14 micro-steps of 2
    for images, (result, counts[images]) in runs.items():
        assert result.returncode == 0, result.explain()
        steps[images] = sum(1 for ln in result.stdout.splitlines() if re.search(r"\] epoch \d+/\d+ batch ", ln))
    assert counts[12] == counts[36], counts  # the same host reads whether an epoch has 5 or 14 micro-steps
    # per epoch: one read of the losses for the progress line at the epoch's end
    assert counts[36].get("loop.py:_epoch_steps", 0) == 2, counts[36]  # train_epoch's micro-step loop
    for per_step in ("loop.py:optimizer_step", "loop.py:preprocess", "schedule.py:micro_step"):
        assert per_step not in counts[36], counts[36]
    assert steps[36] == 2  # log-every 1000: only each epoch's last batch prints
    assert counts[36].get("dist.py:gather_rows", 0) == 2, counts[36]  # the counter does see reads: one per epoch
