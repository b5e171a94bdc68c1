"""`orch report` and `orch top` read the node logs as streams: their peak memory does not grow
with the logs' size (it grew with every line: two 330 MB logs took 1.98 GB for the report). The
run and the measurement are the benchmark's (bench/report_top_memory.py): each command in a fresh
process, its own high-water mark (VmHWM), at two log sizes 4 x apart. Not a timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report_top_memory import measured, write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[float, tuple[Path, str]]:
    out = {}
    for mb in (3.0, 12.0):
        home = tmp_path_factory.mktemp(f"home{mb:g}")
        out[mb] = (home, write_run(home, nodes=2, ranks=4, megabytes=mb))
    return out


@pytest.mark.parametrize("args", [("report",), ("top", "--once", "--json")], ids=["report", "top"])
def test_peak_memory_is_flat_in_the_size_of_the_node_logs(
    runs: dict[float, tuple[Path, str]], args: tuple[str, ...]
) -> None:
    peaks = {}
    for mb, (home, run_id) in runs.items():
        got = measured(home, args[0], run_id, *args[1:])
        assert got["exit_code"] == 0, got
        peaks[mb] = got["peak_rss_mb"]
    # 18 MB more of logs: holding them (or their records) took several times that
    assert peaks[12.0] - peaks[3.0] < 8, peaks
