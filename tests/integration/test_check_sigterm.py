"""SIGTERM to `orch check` while the fabric check's job runs (a scheduler's kill, a CI timeout, a
script stopping its step) tears the job down as Ctrl-C does: nothing of it is left running on the
node, and orch exits 130. One `transport: local` node: real agent, torchrun and job (gloo)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.ports import job_port
from tests.up_helpers import REPO, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def marked(marker: str) -> list[str]:
    """Processes whose environment or command line carries ``marker``: the job's, and its agent's."""
    want = marker.encode()
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if want in env or want in cmd:
            out.append(pid + " " + cmd.replace(b"\0", b" ").decode(errors="replace"))
    return out


def job_running(marker: str, proc: subprocess.Popen[str]) -> list[str]:
    """The fabric job's processes; fails at once, with orch's output, once orch check has exited."""
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"orch check exited {proc.returncode} before the job ran:\n{out[-2000:]}\n{err[-2000:]}")
    return [ln for ln in marked(marker) if "allreduce_job.py" in ln]  # the whole command line: its path is long


# The job's allreduce on one rank takes well under a second: on a fast machine the whole job could
# start and end between two scans of /proc, and SIGTERM would come after it. This hold, on the
# job's PYTHONPATH only, keeps the job's process (never torchrun's, never orch's) running until it
# is stopped, so the signal always lands while the job runs.
HOLD = """import sys, time
if sys.argv and sys.argv[0].endswith("allreduce_job.py"):
    while True:
        time.sleep(1)
"""


def test_sigterm_during_the_fabric_job_stops_the_job_and_exits_130(tmp_path: Path) -> None:
    marker = f"fabric-sigterm-{uuid.uuid4().hex}"
    run_root = tmp_path / marker  # in every agent's command line
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "sigterm",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}],
                "master": {"port": job_port()},
                "env": {
                    "GLOO_SOCKET_IFNAME": "lo",
                    "OMP_NUM_THREADS": "1",
                    "SIGTERM_TEST_MARK": marker,
                    "PYTHONPATH": str(hold),
                },
                "checks": {"fabric": {"max_bytes": "4M", "budget_s": 5, "timeout_s": 200}},
                "job": {
                    "python": sys.executable,
                    "workdir": str(REPO),
                    "run_root": str(run_root),
                    "script": "train.py",
                    "nproc_per_node": 1,
                    "stop_grace_s": 5,
                },
            }
        )
    )
    env = dict(os.environ, ORCH_HOME=str(tmp_path / "home"), NO_COLOR="1")
    env.pop("ORCH_INVENTORY", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "check", str(inv), "--only", "fabric"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    left: list[str] = []
    try:
        wait_for(lambda: job_running(marker, p), 150, "the fabric job running")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        left = marked(marker)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for line in marked(marker):  # never leave them behind (the hold keeps the job forever), whatever failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], f"still running after orch check exited {p.returncode}: {left}\n{err[-2000:]}"
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "interrupted" in err
