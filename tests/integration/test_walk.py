"""The walk of the inventory through `orch up` (`up:inv`) stays short: a small container-less and a
container inventory (`transport: local`, two nodes, a short gloo job under real torchrun and the
real agent; the container runtime tests/fake_runtime.py, which runs the container's command on this
host) each go through a whole `orch up` in a process of their own, the walk recorded
(tests/walk.py).

The walk: every read of an attribute of the Inventory or of any of its parts (the job, its
container and mounts, the checks, the straggler settings, every node and its SSH options), from
the inventory as loaded to the end of the run, attributed to the function of orchestrator/ that
reads it (`module:qualname` of the calling frame; a comprehension or a lambda is part of the
function it is written in). A **stop** is a distinct reading function, a **room** its module;
walking the stops in the order of their first read, a **climb** is a step into a room visited and
left before. The container inventory's walk: at most `STOPS` stops and `CLIMBS` climbs (it was 82
stops in 19 rooms with 29 climbs before the job's environment became one object, 16 of them
between the plan, the container builders and the preflight's facts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import fake_runtime
from tests.ports import job_port
from tests.up_helpers import DDP_JOB, REPO, ddp_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

STOPS, CLIMBS = 60, 15


def walk(tmp_path: Path, name: str, container: dict[str, Any] | None) -> dict[str, Any]:
    """The walk of one `orch up` of a two-node inventory (`container`: its job.container)."""
    bin_dir = tmp_path / "bin"
    fake_runtime.install(bin_dir, tmp_path / "containers.json", execute=True)
    job: dict[str, Any] = {
        "python": sys.executable,
        "workdir": str(REPO),
        "run_root": str(tmp_path / "nodes"),
        "script": DDP_JOB,
        "nproc_per_node": 1,
        "stop_grace_s": 5,
        **({"container": container} if container else {}),
    }
    inv = tmp_path / f"{name}.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1"}],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", **ddp_job(steps=3, sleep=0.05)},
                "job": job,
            }
        )
    )
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ORCH_HOME": str(tmp_path / "home")}
    env.pop("ORCH_INVENTORY", None)
    ran = subprocess.run(
        [sys.executable, "-m", "tests.walk", str(out), str(inv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    got: dict[str, Any] = json.loads(out.read_text())
    assert got["result"] == "succeeded", got["result"]
    return got


def shown(got: dict[str, Any]) -> str:
    return "\n".join([f"{got['stops']} stops, {got['rooms']} rooms, {got['climbs']} climbs:", *got["climbed"]])


def test_the_inventorys_walk_through_orch_up_stays_short(tmp_path: Path) -> None:
    boxed = walk(tmp_path / "boxed", "boxed", {"runtime": "podman", "image": "boxed:1", "python": sys.executable})
    assert boxed["stops"] <= STOPS and boxed["climbs"] <= CLIMBS, shown(boxed)
    bare = walk(tmp_path / "bare", "bare", None)
    assert bare["stops"] <= boxed["stops"] and bare["climbs"] <= CLIMBS, shown(bare)
    # the container costs the walk its own check's image rows, nothing more: the environment is one object
    assert set(boxed["walk"]) - set(bare["walk"]) <= {"preflight.checks.container:image_findings"}, boxed["walk"]
