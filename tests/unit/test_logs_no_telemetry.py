"""`orch logs --no-telemetry`: a run's merged lines without the node agents' telemetry samples and
the ranks' timing lines (what `orch top` and the straggler detector read), everything else kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.logs.lines import format_ts
from orchestrator.store import remote_dir
from tests.logs_support import make_run

T0 = 1_796_031_125.0  # 2026-11-30T09:32:05Z
JOB = "epoch 3/10 batch 40/120 box_loss 1.2"
TIMING = "timing epoch 3 batch 40 steps 10 images 80 data_s 0.0123 compute_s 1.52 wall_s 3.1"
SAMPLE = 'telemetry {"v": 1, "gpus": [], "gpu_error": "nvidia-smi: not found in PATH", "ranks": []}'


def test_no_telemetry_prints_the_jobs_lines_without_the_samples_and_timing_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    inv, run = make_run(tmp_path, ["n1"], nproc=1)
    node_dir = Path(os.path.expanduser(remote_dir(inv, inv.nodes[0], run.run_id)))
    node_dir.mkdir(parents=True)
    (node_dir / "node.log").write_text(
        f"{format_ts(T0)} out [default0]:[rank 0] {JOB}\n"
        f"{format_ts(T0 + 1)} orch {SAMPLE}\n"
        f"{format_ts(T0 + 2)} out [default0]:[rank 0] {TIMING}\n"
        f"{format_ts(T0 + 3)} err [default0]:[rank 0] a warning\n"
    )
    (node_dir / "state.json").write_text('{"state": "succeeded"}')

    def logs(*args: str) -> list[str]:
        with pytest.raises(SystemExit) as exc:
            main(["logs", run.run_id, *args])
        assert exc.value.code == 0
        return capsys.readouterr().out.splitlines()

    everything = logs()
    assert len(everything) == 4 and any(SAMPLE in ln for ln in everything) and any(TIMING in ln for ln in everything)
    quiet = logs("--no-telemetry")
    assert len(quiet) == 2 and JOB in quiet[0] and "a warning" in quiet[1]
    assert logs("--no-telemetry", "--tail", "1") == quiet[1:]
    assert [ln for ln in logs("--no-telemetry", "--grep", "epoch")] == quiet[:1]
