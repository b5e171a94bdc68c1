"""run.json written by several processes at once (`orch up` beside `orch status` / `orch down`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orchestrator.store import RunDir

WRITER = """
import sys
from pathlib import Path
from orchestrator.store import RunDir
run = RunDir(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    run.update(**{f"{sys.argv[2]}{i}": i})
"""


def test_two_processes_updating_run_json_lose_no_field(tmp_path: Path) -> None:
    """Two writers, each setting its own keys by read-modify-write: with run.json's lock every
    key of both is there at the end (without it, each rewrite drops what the other just added)."""
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.write({"run": "r", "nodes": []})
    n = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(run.path), prefix, str(n)], cwd=Path(__file__).resolve().parents[2]
        )
        for prefix in ("a", "b")
    ]
    for p in procs:
        assert p.wait(120) == 0
    data = json.loads((run.path / "run.json").read_text())
    missing = [f"{p}{i}" for p in "ab" for i in range(n) if f"{p}{i}" not in data]
    assert missing == [], f"{len(missing)} updates lost, e.g. {missing[:5]}"
