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
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600", f"--screenshot={shot}",
         page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_size(data) == (1200, 1600)
    # a blank page compresses to a few KB; the plots and tables make it far larger
    assert len(data) > 50_000
