"""The run report renders offline in headless Chromium (Debian's chromium package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from orchestrator.report import build_report
from tests.cluster import missing
from tests.report_support import make_run, png_size


def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    if shutil.which("chromium") is None:
        missing("Debian's chromium package is not installed")
    run = make_run(tmp_path, failed=True)
    page = build_report(run)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,1600",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_size(data) == (1200, 1600)
    # a blank page compresses to a few KB; the plots and tables make it far larger
    assert len(data) > 50_000


def test_the_rendered_summary_card_holds_results_csv_and_run_json_numbers(tmp_path: Path) -> None:
    """The page as Chromium builds it (its DOM after parsing, what a person sees): the summary card's
    best mAP50-95 and its epoch are results.csv's, the wall time, world size and attempt run.json's,
    and a failed run's root cause comes before everything else."""
    import re

    from orchestrator.report import read_results_csv

    if shutil.which("chromium") is None:
        missing("Debian's chromium package is not installed")
    run = make_run(tmp_path, failed=True)
    page = build_report(run)
    proc = subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    items = {
        key: (value, text)
        for key, value, text in re.findall(
            r'data-key="([a-z_0-9]+)" data-value="([^"]*)"><div class="label">[^<]*</div>'
            r'<div class="value[^"]*">([^<]*)</div>',
            dom,
        )
    }
    assert set(items) >= {"state", "best_map50_95", "wall_s", "world_size", "attempts"}, dom[:2000]
    cols = read_results_csv(run.path / "results.csv")
    info = run.read()
    best = max(range(len(cols["epoch"])), key=lambda i: cols["metrics/mAP50-95(B)"][i])
    assert float(items["best_map50_95"][0]) == cols["metrics/mAP50-95(B)"][best]
    assert items["best_map50_95"][1] == f"{cols['metrics/mAP50-95(B)'][best]:.4g} (epoch {int(cols['epoch'][best])})"
    assert items["wall_s"][1] == f"{info['wall_s']:.1f} s"
    assert items["world_size"][1] == f"{sum(n['nproc'] for n in info['nodes'])} ({len(info['nodes'])} nodes)"
    assert items["attempts"][1] == f"{info['attempt']} of {info['max_attempts']}"
    assert items["state"][1] == info["state"] == "failed"
    assert dom.index('id="root-cause"') < dom.index('id="summary"')
    top = dom[dom.index('id="root-cause"') : dom.index('id="summary"')]
    assert "killed by SIGKILL" in top and info["first_failure"]["cause"] == "killed by SIGKILL"
