"""`orch exec` streams a node's output as it comes: its memory does not grow with what a command
prints (one long line, or `yes` until --timeout), live or with -b/--gather, which keeps the first
`KEPT_BYTES` of each stream and says how much more came. Peak memory is the orch process's own
(VmHWM of a fresh process), not a timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.report_top_memory import PEAK  # orch ARGS that says its own peak RSS as it exits
from orchestrator.remote.exec import KEPT_BYTES

REPO = Path(__file__).resolve().parents[2]
BIG = 64 << 20


def orch_peak(tmp_path: Path, *args: str) -> tuple[int, int, str]:
    """(exit code, peak RSS of the orch process in MiB, stderr) of `orch exec ARGS` on one local node."""
    inv = tmp_path / "one.yaml"
    inv.write_text(
        yaml.safe_dump({"name": "mem", "transport": "local", "nodes": [{"host": "localhost", "name": "n0"}]})
    )
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, "exec", str(inv), *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "ORCH_HOME": str(tmp_path / "orch")},
    )
    kb = int(proc.stderr.rsplit("PEAK_KB ", 1)[1].split()[0])
    return proc.returncode, kb >> 10, proc.stderr


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> int:
    code, mib, err = orch_peak(tmp_path_factory.mktemp("base"), "--", "true")
    assert code == 0, err
    return mib


def test_one_64_mib_line_shown_live_takes_no_more_memory_than_a_command_printing_nothing(
    tmp_path: Path, base: int
) -> None:
    code, mib, err = orch_peak(tmp_path, "--", f"head -c {BIG} /dev/zero | tr '\\0' x")
    assert code == 0, err[-2000:]
    assert mib - base < 24, (mib, base)  # it held the whole line, and copies of it: 64 MiB x several


def test_gather_keeps_the_first_mib_of_each_stream_says_what_it_dropped_and_stays_small(
    tmp_path: Path, base: int
) -> None:
    code, mib, err = orch_peak(tmp_path, "-b", "--", f"head -c {BIG} /dev/zero | tr '\\0' x; echo oops >&2")
    assert code == 0, err[-2000:]
    assert mib - base < 24, (mib, base)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "exec",
            str(tmp_path / "one.yaml"),
            "-b",
            "--",
            "head -c 3000000 /dev/zero | tr '\\0' x",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "ORCH_HOME": str(tmp_path / "orch")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("x") == KEPT_BYTES
    assert f"[orch: {3000000 - KEPT_BYTES} more bytes of stdout not kept: -b keeps the first 1 MiB" in proc.stdout


@pytest.mark.parametrize("gather", [False, True])
def test_yes_until_the_timeout_stays_small(tmp_path: Path, base: int, gather: bool) -> None:
    """`orch exec -- yes` grew without bound (every byte kept for the report, live or not)."""
    code, mib, err = orch_peak(tmp_path, *(["-b"] if gather else []), "--timeout", "2", "--", "yes")
    assert code == 124, err[-2000:]
    assert mib - base < 24, (mib, base)
