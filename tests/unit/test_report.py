"""The run report: built from a run directory, renders offline in headless Chromium."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.logs.trainer import parse_throughput
from orchestrator.report import build_report, read_results_csv
from orchestrator.store import RunDir
from tests.cluster import missing

RESULTS = """                  epoch,         train/box_loss,         train/cls_loss,         train/dfl_loss,   metrics/precision(B),      metrics/recall(B),       metrics/mAP50(B),    metrics/mAP50-95(B),           val/box_loss,           val/cls_loss,           val/dfl_loss,                 lr/pg0
                      1,                 3.1,                 4.2,                 2.9,                 0.01,                 0.02,                 0.003,                 0.001,                 3.0,                 4.0,                 2.8,                 0.0001
                      2,                 2.7,                 3.5,                 2.5,                 0.05,                 0.09,                 0.02,                 0.008,                 2.8,                 3.6,                 2.6,                 0.0002
                      3,                 2.2,                 2.9,                 2.1,                 0.12,                 0.20,                 0.09,                 0.03,                 2.4,                 3.1,                 2.3,                 0.0003
"""


def node_log(node_rank: int) -> str:
    ts = "2026-11-30T09:32:0{}.000000Z"
    lines = [f"{ts.format(node_rank)} orch agent started torchrun pid 123"]
    for epoch in (1, 2):
        lines.append(f"{ts.format(node_rank)} out [default0]:[rank {node_rank}] throughput epoch {epoch}: rank  images/s  data-wait")
        lines.append(f"{ts.format(node_rank)} out [default0]:[rank {node_rank}] throughput epoch {epoch}: "
                     f"{node_rank:>4}  {10.0 * epoch + node_rank:8.1f}  {12.5:8.1f}%")
    lines.append(f"{ts.format(node_rank)} out [default0]:[rank 0] throughput epoch 2: total 41.0 images/s over 2 ranks, "
                 "scaling efficiency 91.1% of 2 x 22.5 images/s")
    return "\n".join(lines) + "\n"


def make_run(tmp_path: Path, failed: bool = False) -> RunDir:
    run = RunDir(tmp_path / "20261130-093200-demo")
    run.path.mkdir(parents=True)
    now = time.time()
    nodes = [{"node": f"node{i}", "node_rank": i, "host": "localhost", "state": "failed" if failed and i else "succeeded",
              "exit_code": 1 if failed and i else 0, "pid": 100 + i, "started_at": now - 60, "finished_at": now - 5}
             for i in range(2)]
    info = {"run": run.run_id, "inventory": "inventory/local.yaml", "created": now - 62, "finished_at": now - 4,
            "state": "failed" if failed else "succeeded", "nodes": nodes}
    if failed:
        info["first_failure"] = {"node": "node1", "rank": 1, "exit_code": 1, "reason": "exited with code 1",
                                 "cause": "killed by SIGKILL", "signal": "SIGKILL", "hint": "the OOM killer <usually>",
                                 "excerpt": ["Traceback (most recent call last):", "RuntimeError: boom <&>"]}
    run.write(info)
    run.write({"results": [{"check": "ssh", "node": "node0", "status": "ok", "value": "3 ms", "detail": "", "hint": ""},
                           {"check": "gpus", "node": "node0", "status": "skip", "value": None,
                            "detail": "no gpus declared", "hint": ""}]}, "check.json")
    (run.path / "nodes").mkdir()
    for i in range(2):
        (run.path / "nodes" / f"node{i}.log").write_text(node_log(i))
    (run.path / "results.csv").write_text(RESULTS)
    return run


def test_throughput_keeps_the_latest_epoch() -> None:
    tp = parse_throughput(node_log(0).splitlines() + node_log(1).splitlines())
    assert tp.epoch == 2
    assert tp.ips == {0: 20.0, 1: 21.0}
    assert tp.wait_share[1] == pytest.approx(0.125)
    assert (tp.total, tp.efficiency) == (41.0, pytest.approx(0.911))


def test_results_csv_columns_are_stripped() -> None:
    import io
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as fh:
        fh.write(RESULTS)
    cols = read_results_csv(Path(fh.name))
    assert cols["epoch"] == [1, 2, 3]
    assert cols["metrics/mAP50-95(B)"] == [0.001, 0.008, 0.03]
    del io


def test_report_has_every_section_and_its_pngs(tmp_path: Path) -> None:
    run = make_run(tmp_path, failed=True)
    page = build_report(run)
    text = page.read_text()
    for section in ("timeline", "loss and mAP", "throughput", "nodes", "preflight", "first failure"):
        assert f"<h2>{section}</h2>" in text
    assert text.count("data:image/png;base64,") == 3
    assert "RuntimeError: boom &lt;&amp;&gt;" in text  # escaped, not injected
    # the cause above the excerpt: a killed rank by its signal, not torchrun's exit code
    assert "node node1, rank 1, signal SIGKILL" in text and "exit code 1</p>" not in text
    assert text.index("<b>killed by SIGKILL</b>") < text.index("hint: the OOM killer &lt;usually&gt;") < text.index("<pre>")
    assert "http" not in text.replace("http-equiv", "")  # nothing fetched from the network
    for png in ("timeline.png", "curves.png", "throughput.png"):
        data = (page.parent / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    assert page.stat().st_mode & 0o777 == 0o600


def test_report_without_results_or_preflight_says_so(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run.path / "results.csv").unlink()
    (run.path / "check.json").unlink()
    text = build_report(run).read_text()
    assert "no data for loss and mAP curves" in text
    assert "no preflight recorded" in text


def png_size(data: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        missing("Debian's chromium package is not installed")
    run = make_run(tmp_path, failed=True)
    page = build_report(run)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600", f"--screenshot={shot}",
         page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_size(data) == (1200, 1600)
    # a blank page compresses to a few KB; the plots and tables make it far larger
    assert len(data) > 50_000


def test_report_command_fetches_results_and_says_where_everything_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    home = tmp_path / "home"
    run = make_run(home / "runs")
    (home / "latest").write_text(run.run_id + "\n")
    (run.path / "results.csv").unlink()
    out_dir = tmp_path / "trainer-out"
    out_dir.mkdir()
    (out_dir / "results.csv").write_text(RESULTS)
    (run.path / "inventory.yaml").write_text("transport: local\nnodes:\n  - host: localhost\n    name: node[0-1]\n")
    with open(run.path / "nodes" / "node0.log", "a") as fh:
        fh.write(f"2026-11-30T09:33:00.000000Z out [default0]:[rank 0] done: 3 epochs in 9.0 s; weights in "
                 f"{out_dir}/weights, results in {out_dir}/results.csv\n")
    monkeypatch.setenv("ORCH_HOME", str(home))
    with pytest.raises(SystemExit) as exc:
        main(["report"])
    assert exc.value.code == 0
    err = capsys.readouterr().err
    assert f"weights: {out_dir}/weights (on node0)" in err
    assert f"results: {out_dir}/results.csv (on node0)" in err
    assert "report:" in err and "index.html" in err
    assert (run.path / "results.csv").read_text() == RESULTS  # fetched over the (local) transport
    assert "validation mAP" not in (run.path / "report" / "index.html").read_text()  # plots are images
    assert (run.path / "report" / "curves.png").exists()
