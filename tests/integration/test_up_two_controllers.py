"""Two controllers (two `$ORCH_HOME`s: two users of one login, two shells), one cluster of two
local nodes: a run is only ever touched by its own controller (`transport: local`, real torchrun)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.integration.test_up_local import local_inventory
from tests.ports import job_port
from tests.up_helpers import Orch, ddp_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def tagged(run_id: str, nonce: str | None = None) -> list[int]:
    """Pids on this machine whose environment carries the run id (and the launch nonce)."""
    want = {f"ORCH_RUN_ID={run_id}".encode(), *([f"ORCH_LAUNCH={nonce}".encode()] if nonce else [])}
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if want <= set(fh.read().split(b"\0")):
                        out.append(int(name))
            except OSError:
                continue
    return out


def node_file(tmp_path: Path, run_id: str, node: str, name: str) -> dict:
    try:
        return dict(json.loads((tmp_path / "nodes" / run_id / node / name).read_text()))
    except (OSError, ValueError):
        return {}


def with_port(inv: Path, name: str) -> Path:
    """A copy of the inventory on a master port of its own."""
    doc = yaml.safe_load(inv.read_text())
    doc["master"]["port"] = job_port()
    out = inv.with_name(name)
    out.write_text(yaml.safe_dump(doc))
    return out


def test_a_run_id_taken_by_another_controller_is_refused_and_each_down_stops_only_its_own(tmp_path: Path) -> None:
    """A runs `collide`; B's `orch up --run-id collide` is refused on the nodes before anything is
    written there (A keeps running, its launch.json is its own); B's `orch down collide` leaves A
    alone; B's other run on the same nodes is untouched by A's `orch down`."""
    inv = local_inventory(tmp_path, ddp_job(steps=600, sleep=0.1))
    a, b = Orch(tmp_path / "homeA"), Orch(tmp_path / "homeB")
    collide, other_id = f"collide-{os.getpid()}", f"other-{os.getpid()}"
    try:
        _collide(tmp_path, inv, a, b, collide, other_id)
    finally:  # whatever failed, nothing of either run outlives the test
        a.run("down", collide, timeout=120)
        b.run("down", other_id, timeout=120)


def _collide(tmp_path: Path, inv: Path, a: Orch, b: Orch, collide: str, other_id: str) -> None:
    up_a = a.run("up", str(inv), "--run-id", collide, "--detach", "--skip-checks", timeout=120)
    assert up_a.returncode == 0, up_a.stderr
    nonce_a = a.run_json(collide)["nonce"]
    assert tagged(collide, nonce_a)

    up_b = b.run("up", str(inv), "--run-id", collide, "--skip-checks", timeout=120)
    assert up_b.returncode == 1, up_b.stderr
    said = " ".join(up_b.stderr.split())
    assert "holds a run of the same id started by another orch up" in said, said
    assert "pick another --run-id" in said, said
    for node in ("n0", "n1"):
        state = node_file(tmp_path, collide, node, "state.json")
        assert state["state"] == "running" and state["nonce"] == nonce_a, (node, state)
        launch = node_file(tmp_path, collide, node, "launch.json")
        assert launch["nonce"] == nonce_a and launch["env"]["ORCH_LAUNCH"] == nonce_a

    logs_b = b.run("logs", collide, timeout=120)
    assert logs_b.returncode == 0, logs_b.stderr
    assert "started pid" not in logs_b.stdout and "step" not in logs_b.stdout, logs_b.stdout[-2000:]
    assert "started pid" in a.run("logs", collide, timeout=120).stdout  # A's own lines: A's to read

    down_b = b.run("down", collide, timeout=120)
    assert down_b.returncode == 0, down_b.stderr
    said = " ".join((down_b.stdout + down_b.stderr).split())  # the console wraps long lines
    assert said.count("holds a run of the same id started by another orch up") == 2 and "left alone" in said, said
    assert all(node_file(tmp_path, collide, n, "state.json")["state"] == "running" for n in ("n0", "n1"))
    assert tagged(collide, nonce_a)

    other = with_port(inv, "other.yaml")
    up_b2 = b.run("up", str(other), "--run-id", other_id, "--detach", "--skip-checks", timeout=120)
    assert up_b2.returncode == 0, up_b2.stderr
    down_a = a.run("down", collide, timeout=120)
    assert down_a.returncode == 0, down_a.stderr
    assert tagged(collide) == []
    assert all(node_file(tmp_path, collide, n, "state.json")["state"] == "stopped" for n in ("n0", "n1"))
    assert all(node_file(tmp_path, other_id, n, "state.json")["state"] == "running" for n in ("n0", "n1"))
    assert json.loads(b.run("status", other_id, "--json").stdout)["state"] == "running"
    assert b.run("down", other_id, timeout=120).returncode == 0
    assert tagged(other_id) == []


def test_a_second_run_on_the_same_master_port_never_joins_the_first(tmp_path: Path) -> None:
    """B on A's master port: B's master cannot bind it and fails; B's node1 reaches A's TCPStore
    but waits under its own rendezvous id and never spawns a worker; A ends correctly."""
    stop = tmp_path / "stop-a"  # A runs until B has failed (at most 150 steps), then ends at its next step
    inv = local_inventory(tmp_path, ddp_job(steps=150, sleep=0.2, stop_file=str(stop)))
    a, b = Orch(tmp_path / "homeA"), Orch(tmp_path / "homeB")
    up_a = a.start(str(inv), "--skip-checks")
    run_a = up_a.wait_running()
    wait_for(lambda: "step 2 " in up_a.out, 90, "A to step")
    # B's master starts its torchrun 8 s late (and then fails to bind A's port): time enough for
    # B's node1 to reach A's TCPStore, which it must not take for its own rendezvous
    doc = yaml.safe_load(inv.read_text())
    python = os.path.abspath(inv.parent / doc["job"]["python"])  # the venv's: not its link resolved
    late = tmp_path / "late-python"
    late.write_text(f'#!/bin/sh\ncase "$*" in *torch.distributed.run*) sleep 8;; esac\nexec {python} "$@"\n')
    late.chmod(0o755)
    doc["nodes"][0]["python"] = str(late)
    inv_b = inv.with_name("b.yaml")
    inv_b.write_text(yaml.safe_dump(doc))
    try:
        up_b = b.run("up", str(inv_b), "--skip-checks", timeout=180)
    finally:
        stop.touch()
        up_a.wait(180)
    run_b = (b.home / "latest").read_text().strip()
    assert up_b.returncode == 1, up_b.stderr
    log_b1 = (tmp_path / "nodes" / run_b / "n1" / "node.log").read_text(errors="replace")
    # torchrun makes its log directory's attempt_N/<local rank>/ as it spawns a worker
    spawned = list((tmp_path / "nodes" / run_b / "n1" / "torchrun").glob("*/attempt_*/*"))
    assert spawned == [], f"B's node1 spawned a worker: {spawned}\n{log_b1[-3000:]}"
    assert up_a.proc.returncode == 0, up_a.err
    assert "stop file seen" in up_a.out, "A ended before B had failed: " + up_a.out[-3000:]
    for rank in (0, 1):
        assert re.search(rf"r{rank} done steps=\d+ allreduce_ok=True", up_a.out), up_a.out[-3000:]
    assert tagged(run_a) == [] and tagged(run_b) == []
