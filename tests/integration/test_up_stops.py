"""How an attached `orch up` ends when something outside it stops the run (`transport: local`,
two nodes on this machine, real torchrun): `orch down` from another shell during retries, SIGTERM
to `orch up`, a node agent killed. Each ends named, with nothing of the run left running."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.integration.test_up_local import local_inventory, marked
from tests.up_helpers import Orch, ddp_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def node_state(tmp_path: Path, run_id: str, node: str) -> dict:
    try:
        return dict(json.loads((tmp_path / "nodes" / run_id / node / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def test_orch_down_from_another_shell_is_final_despite_retries(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ddp_job(steps=600, sleep=0.1))
    orch = Orch(tmp_path / "home")
    up = orch.start(str(inv), "--skip-checks", "--retries", "1")
    run_id = up.wait_running()
    try:
        down = orch.run("down", run_id, timeout=120)
        assert down.returncode == 0, down.stderr
        code = up.wait(120)
        left = marked(run_id)  # before the cleanup below: what orch up itself left
    finally:
        orch.run("down", run_id, timeout=120)
    assert code == 130, up.err
    assert "attempt 2" not in up.err and "stopped by orch down" in up.err, up.err
    doc = orch.run_json(run_id)
    assert doc["state"] == "stopped" and doc["attempt"] == 1, doc
    assert json.loads(orch.run("status", run_id, "--json").stdout)["state"] == "stopped"
    assert left == []


def test_sigterm_to_orch_up_tears_the_run_down_with_exit_130(tmp_path: Path) -> None:
    inv = local_inventory(tmp_path, ddp_job(steps=600, sleep=0.1))
    orch = Orch(tmp_path / "home")
    up = orch.start(str(inv), "--skip-checks", "--retries", "1")
    run_id = up.wait_running()
    try:
        up.proc.send_signal(signal.SIGTERM)
        code = up.wait(120)
        left = marked(run_id)  # before the cleanup below: what orch up itself left
    finally:
        orch.run("down", run_id, timeout=120)
    assert code == 130, up.err
    assert "attempt 2" not in up.err, up.err
    assert orch.run_json(run_id)["state"] == "stopped"
    assert all(node_state(tmp_path, run_id, n)["state"] == "stopped" for n in ("n0", "n1"))
    assert left == []


def test_a_killed_node_agent_ends_the_run_named_and_nothing_is_left(tmp_path: Path) -> None:
    """SIGKILL to n1's agent (not torchrun): the run fails on n1, the agent named; teardown stops
    n1's torchrun and workers (the agent's recorded processes) and n0's job."""
    inv = local_inventory(tmp_path, ddp_job(steps=600, sleep=0.1))
    orch = Orch(tmp_path / "home")
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.wait_running()
    try:
        wait_for(lambda: "step 2 " in up.out, 90, "the ranks to step")
        agent = node_state(tmp_path, run_id, "n1")["agent_pid"]
        os.kill(agent, signal.SIGKILL)
        code = up.wait(120)
        left = marked(run_id)  # before the cleanup below: what orch up itself left
    finally:
        orch.run("down", run_id, timeout=120)
    assert code == 1, up.err
    said = " ".join(up.err.split())
    assert "first failure on n1" in said and f"the node agent (pid {agent}) disappeared" in said, said
    assert left == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_controller_disk_does_not_stop_supervision_and_the_exit_code_is_the_runs(tmp_path: Path) -> None:
    """$ORCH_HOME on a 300 KB tmpfs, a job that logs about 1 MB: the local copies and merged.log
    stop being written (warned), the live log, the watchdog and supervision go on, run.json says
    how the run ended, and `orch up` exits 0 because both nodes succeeded."""
    import subprocess

    home = tmp_path / "home"
    home.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k,mode=0700", "tmpfs", str(home)], check=True)
    try:
        inv = local_inventory(tmp_path, ddp_job(steps=3000, sleep=0.002))
        orch = Orch(home)
        up = orch.start(str(inv), "--skip-checks", "--stall-timeout", "60")
        code = up.wait(200)
        run_id = (home / "latest").read_text().strip()
        said = " ".join(up.err.split())
        assert code == 0, up.err[-3000:]
        assert "No space left on device" in said and "internal error" not in said, said[-3000:]
        assert "r1 done steps=3000 allreduce_ok=True" in up.out and "r0 done steps=3000" in up.out
        assert "stall" not in said and "log streaming stopped" not in said, said[-3000:]
        assert orch.run_json(run_id)["state"] == "succeeded"
        assert marked(run_id) == []
    finally:
        subprocess.run(["umount", "-l", str(home)], check=False)


def test_a_start_reported_failed_while_its_agent_runs_is_found_and_stopped(tmp_path: Path) -> None:
    """n1's start answer is lost (as when SSH drops mid-launch): its boot runs and starts the
    agent, but the controller gets no answer and counts n1 as not started. The teardown of the
    failed start asks n1 too (guarded by the launch nonce) and stops its agent's job."""
    import yaml

    inv = local_inventory(tmp_path, ddp_job(steps=600, sleep=0.1))
    doc = yaml.safe_load(inv.read_text())
    python = os.path.abspath(inv.parent / doc["job"]["python"])
    lossy = tmp_path / "lossy-python"
    lossy.write_text(
        f'#!/bin/sh\ncase "$*" in *" start . --wait "*) {python} "$@" >/dev/null 2>&1; exit 255;; esac\n'
        f'exec {python} "$@"\n'
    )
    lossy.chmod(0o755)
    doc["nodes"][1]["python"] = str(lossy)
    inv.write_text(yaml.safe_dump(doc))
    orch = Orch(tmp_path / "home")
    up = orch.start(str(inv), "--skip-checks")
    run_id = up.run_id()
    try:
        code = up.wait(180)
        left = marked(run_id)
    finally:
        orch.run("down", run_id, timeout=120)
    assert code == 1, up.err
    said = " ".join(up.err.split())
    assert "n1: could not start" in said, said
    st = node_state(tmp_path, run_id, "n1")
    assert st.get("agent_pid") and st["state"] == "stopped", st  # it had started, and was stopped
    assert left == []
