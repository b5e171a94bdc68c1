"""The run report, built from a run directory (its rendering in Chromium: tests/local/test_report_chromium.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.logs.trainer import parse_throughput
from orchestrator.report import build_report, read_results_csv
from tests.report_support import RESULTS, make_run, node_log


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
