"""`orch up` stopped (SIGTERM, as a scheduler or a CI timeout stops it; Ctrl-C) while its preflight
runs: a half-launched job is always torn down, and the preflight is its first half. The node's
probe and the job's own check it runs (`python -m trainer --check`, held here until it is killed)
end with orch, and so does the probe's throw-away container of the job's image (the fake runtime
of tests/fake_runtime.py, whose killed client leaves its container running, as a real one does).
One `transport: local` node (real probe, real checks), and one real SSH node, bare and with its
real podman store."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import fake_runtime
from tests.cluster import TestCluster
from tests.containers import PodmanBed
from tests.integration.test_check_sigterm import marked
from tests.integration.test_up_container import container_keys
from tests.ports import job_port
from tests.up_helpers import REPO, Orch, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# The job's check (`python -m trainer --check`, with torchrun's RANK in its environment: sys.argv is
# ['-m', '--check', ...] while site imports this) waits here forever, on the job's PYTHONPATH only:
# the signal always lands while the check runs.
HOLD = """import os, sys, time
if "RANK" in os.environ and sys.argv[:2] == ["-m", "--check"]:
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("boxed", [False, True], ids=["host", "container"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_orch_up_stopped_during_its_preflight_leaves_nothing_of_it_running(
    tmp_path: Path, boxed: bool, sig: signal.Signals
) -> None:
    marker = f"preflight-stop-{uuid.uuid4().hex}"
    hold = tmp_path / marker / "hold"
    hold.mkdir(parents=True)
    (hold / "sitecustomize.py").write_text(HOLD)
    job = {
        "python": sys.executable,
        "workdir": str(REPO),
        "run_root": str(tmp_path / marker / "runs"),
        "module": "trainer",
        "args": {"data": str(tmp_path / "data.yaml"), "epochs": 1},
        "nproc_per_node": 1,
        "stop_grace_s": 5,
    }
    env = dict(os.environ, ORCH_HOME=str(tmp_path / "home"), NO_COLOR="1")
    env.pop("ORCH_INVENTORY", None)
    state = tmp_path / "containers.json"
    if boxed:
        fake_runtime.install(tmp_path / "bin", state, execute=True)
        env["PATH"] = f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"
        job["container"] = {"runtime": "podman", "image": "boxed:1", "python": sys.executable}
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "prestop",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}],
                "master": {"port": job_port()},
                "env": {"OMP_NUM_THREADS": "1", "PREFLIGHT_STOP_MARK": marker, "PYTHONPATH": str(hold)},
                "job": job,
            }
        )
    )

    def check_running() -> list[str]:
        if p.poll() is not None:
            out, err = p.communicate()
            raise AssertionError(f"orch up exited {p.returncode} before the check ran:\n{out[-2000:]}\n{err[-2000:]}")
        return [ln for ln in marked(marker) if " -m trainer --check " in ln]  # not the probe (its JSON says it)

    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", str(inv)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    left: list[str] = []
    try:
        wait_for(check_running, 150, "the job's check running in the preflight")
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
        wait_for(lambda: not marked(marker), 30, "nothing of the preflight left running")
    finally:
        left = marked(marker)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for line in marked(marker):  # never leave them behind (the hold keeps the check forever)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert left == [], f"still running after orch up exited {p.returncode}: {left}\n{err[-2000:]}"
    assert p.returncode == 130, (p.returncode, err[-2000:])
    assert "interrupted" in err
    if boxed:
        assert json.loads(state.read_text()) == [], "the probe's container was left"


@pytest.mark.parametrize("boxed", [False, True], ids=["host", "podman"])
def test_over_ssh_the_probe_ends_what_it_started_when_orch_up_is_stopped(
    cluster: TestCluster, podman_bed: Callable[..., PodmanBed], tmp_path: Path, boxed: bool
) -> None:
    """Over a real SSH login the probe is not in orch's process group: the controller closes its
    channel, and the probe, seeing its stdin end while it gathers, kills what it started (the
    held check; the client of the probe's real podman container, whose guard then removes it)."""
    marker = f"preflight-stop-{uuid.uuid4().hex}"
    hold = tmp_path / marker / "hold"
    hold.mkdir(parents=True)
    (hold / "sitecustomize.py").write_text(HOLD)
    job: dict[str, Any] = {
        "module": "trainer",
        "workdir": str(REPO),
        "args": {"data": str(tmp_path / "data.yaml"), "epochs": 1},
        "run_root": str(tmp_path / marker / "runs"),
    }
    bed = None
    if boxed:
        bed = podman_bed(cluster, ["node1"])
        job["container"] = container_keys(str(hold), workdir=str(REPO))
    inv = cluster.write_inventory(
        tmp_path / "inv.yaml",
        only=["node1"],
        job=job,
        env={"OMP_NUM_THREADS": "1", "PREFLIGHT_STOP_MARK": marker, "PYTHONPATH": str(hold)},
        master={"port": job_port()},
    )
    orch = Orch(tmp_path / "home")
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "up", str(inv)],
        cwd=REPO,
        env=orch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def check_running() -> bool:
        if p.poll() is not None:
            out, err = p.communicate()
            raise AssertionError(f"orch up exited {p.returncode} before the check ran:\n{out[-2000:]}\n{err[-2000:]}")
        return any(" -m trainer --check " in ln for ln in marked(marker))

    try:
        wait_for(check_running, 180, "the job's check running in the preflight")
        if bed is not None:
            assert bed.all_containers("orch.run"), "the check does not run in the probe's container"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        wait_for(lambda: not marked(marker), 30, "nothing of the preflight left running on the node")
        if bed is not None:
            assert bed.wait_no_containers("orch.run", within=30) == {}, "the probe's container was left"
    finally:
        left = marked(marker)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for line in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split()[0]), signal.SIGKILL)
    assert p.returncode == 130 and "interrupted" in err, (p.returncode, err[-2000:])
