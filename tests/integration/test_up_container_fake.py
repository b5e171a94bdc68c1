"""`orch up` of a `job.container` inventory over `transport: local`, the runtime a fake that runs
the container's command on this host (tests/fake_runtime.py): the whole path a container launch
takes (preflight facts and checks through the runtime, the launch line, the stop hook, the sweep)
with real torchrun and the real agent, and no container left by a success, a Ctrl-C or an agent
killed -9. The real runtimes' own tests need podman or docker; this one needs neither."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from tests import fake_runtime
from tests.ports import job_port
from tests.up_helpers import DDP_JOB, REPO, Orch, ddp_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def runtime(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    state = tmp_path / "containers.json"
    fake_runtime.install(tmp_path / "bin", state, execute=True)
    return state, {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def inventory(tmp_path: Path, job_env: dict[str, str]) -> Path:
    inv = tmp_path / "boxed.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "boxed",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1"}],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", **job_env},
                "job": {
                    "python": sys.executable,
                    "workdir": str(REPO),
                    "run_root": str(tmp_path / "nodes"),
                    "script": DDP_JOB,
                    "nproc_per_node": 1,
                    "stop_grace_s": 5,
                    "container": {"runtime": "podman", "image": "boxed:1", "python": sys.executable},
                },
            }
        )
    )
    return inv


def calls(state: Path) -> list[list[str]]:
    return [json.loads(line) for line in state.with_suffix(".calls").read_text().splitlines()]


def test_a_container_run_succeeds_with_its_merged_log_and_leaves_no_container(
    tmp_path: Path, runtime: tuple[Path, dict[str, str]]
) -> None:
    state, env = runtime
    inv = inventory(tmp_path, ddp_job(steps=3, sleep=0.05))
    orch = Orch(tmp_path / "home", env)
    check = orch.run("check", str(inv), "--only", "software,container", "--json")
    results = json.loads(check.stdout)["results"]
    assert {(r["check"], r["status"]) for r in results} == {("software", "ok"), ("container", "ok")}, results
    facts_runs = [c for c in calls(state) if c[1] == "run"]
    assert facts_runs and all("--rm" in c and "boxed:1" in c for c in facts_runs)  # the job's python, in the image
    # one throw-away container per node answers every question inside the image (there were one per fact)
    names = sorted(c[c.index("--name") + 1].rsplit("-", 2)[-2:][0] for c in facts_runs)
    assert names == ["n0", "n1"] and all(c[c.index("--name") + 1].endswith("-probe") for c in facts_runs), facts_runs
    up = orch.run("up", str(inv), "--skip-checks", timeout=180)
    assert up.returncode == 0, up.stderr[-3000:]
    run_id = (orch.home / "latest").read_text().strip()
    assert "allreduce_ok=True final_sum=" in up.stdout, up.stdout[-2000:]
    launches = [c for c in calls(state) if c[1] == "run" and f"orch.run={run_id}" in c]
    assert len(launches) == 2 and all("--network" in c and "host" in c for c in launches)
    assert fake_runtime.containers(state) == []
    nonce = orch.run_json(run_id)["nodes"][0]["nonce"]
    assert ["podman", "rm", "-f", f"orch-{run_id}-n0-{nonce}"] in calls(state)  # the hook ran at torchrun's exit


@pytest.mark.parametrize("how", ["ctrl-c", "agent killed -9, then orch down"])
def test_no_container_is_left_however_the_run_is_stopped(
    tmp_path: Path, runtime: tuple[Path, dict[str, str]], how: str
) -> None:
    state, env = runtime
    inv = inventory(tmp_path, ddp_job(steps=100000, sleep=0.1))
    orch = Orch(tmp_path / "home", env)
    up = orch.start(str(inv), "--skip-checks", *(["--detach"] if how != "ctrl-c" else []))
    run_id = up.run_id()
    wait_for(
        lambda: len([c for c in fake_runtime.containers(state) if c.get("pgid")]) == 2,
        90,
        "both nodes' containers running",
    )
    if how == "ctrl-c":
        wait_for(lambda: orch.run_json(run_id).get("state") == "running", 90, "the run running")
        up.proc.send_signal(signal.SIGINT)
        assert up.wait(120) == 130, up.err[-2000:]
    else:
        assert up.wait(120) == 0, up.err[-2000:]
        for node in ("n0", "n1"):  # the agent and the runtime's client die; their containers live on
            st = json.loads((tmp_path / "nodes" / run_id / node / "state.json").read_text())
            os.kill(st["agent_pid"], signal.SIGKILL)
            os.killpg(st["pgid"], signal.SIGKILL)
        boxes = fake_runtime.containers(state)
        assert len(boxes) == 2 and all(os.path.exists(f"/proc/{c['pgid']}") for c in boxes)
        down = orch.run("down", run_id)
        assert down.returncode == 0, down.stderr[-2000:]
    left = fake_runtime.containers(state)
    assert left == [], left
