"""`orch exec --container RUN` on the real runtimes (tests/containers.py): the command runs in each
node's own container of the run, and a timeout, Ctrl-C or a lost session stops it inside the
container, not only the runtime's exec client on the host (issue 53 items 5 and 7).

Two `transport: local` nodes share one runtime here (podman's store, or the session's dockerd), as
nodes on one host do: each must find its own container. Over SSH (the podman bed's nodes, a store
each) the tether's stop of a lost session reaches into the container too. The containers'
processes are this machine's too (its process table), so what is left of a command is looked up
in /proc by the command's own words."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster import TestCluster
from tests.containers import Dockerd, PodmanBed, PodmanStore, TestImage, short_dir
from tests.integration.test_up_container import GONE_WITHIN_S, container_keys, ddp_inventory
from tests.ports import job_port
from tests.procs_support import own_sleeps, running
from tests.up_helpers import DDP_JOB, REPO, Orch, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass
class Launched:
    """A detached container run of two nodes: `orch` with the bed's environment, the run id."""

    orch: Orch
    run: str
    runtime: str


@pytest.fixture(scope="module", params=["podman", "docker"])
def local_run(
    request: pytest.FixtureRequest, container_image: TestImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Launched]:
    """Two `transport: local` nodes in containers of one runtime: podman's store, or the session's dockerd."""
    tmp = tmp_path_factory.mktemp(f"exec-{request.param}")
    cleanup = []
    if request.param == "podman":
        base = short_dir("x")
        store = PodmanStore(base, images_from=(container_image.store.graph,))
        env, ps = store.env, ["podman", "ps", "-a", "--format", "{{.Names}}"]
        cleanup.append(lambda: (store.remove_all(), shutil.rmtree(base, ignore_errors=True)))
    else:
        daemon: Dockerd = request.getfixturevalue("dockerd")
        bin_dir = tmp / "bin"  # Debian's client, as the bed's own calls use, whatever else is on PATH
        bin_dir.mkdir()
        (bin_dir / "docker").symlink_to("/usr/bin/docker")
        env = {**daemon.env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        ps = ["/usr/bin/docker", "ps", "-a", "--format", "{{.Names}}"]
    orch = Orch(tmp / "home", env=env)
    run = f"ctr-exec-{request.param}"
    up = orch.run("up", str(inventory(tmp, request.param)), "--run-id", run, "--skip-checks", "--detach", timeout=300)
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
        # --detach returns once the agents run; `RUNTIME run` may still be creating the containers
        # (docker takes a second or more here), and until then exec rightly finds none (125)
        wait_for(
            lambda: orch.run("exec", "--container", run, "--", "true", timeout=60).returncode == 0,
            120,
            f"both nodes' containers of {run} running",
            interval=0.5,
        )
        yield Launched(orch, run, request.param)
    finally:
        down = orch.run("down", run, timeout=180)
        if down.returncode == 1:
            down = orch.run("down", run, timeout=180)
        left = subprocess.run(ps, capture_output=True, text=True, env={**os.environ, **env}, timeout=60).stdout.split()
        for fn in cleanup:
            fn()
    assert down.returncode == 0, down.stdout + down.stderr
    assert [n for n in left if n.startswith(f"orch-{run}")] == [], left


def inventory(tmp_path: Path, runtime: str) -> Path:
    keys = container_keys()
    keys["runtime"] = runtime
    inv = tmp_path / "boxed.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "name": "boxed",
                "transport": "local",
                "nodes": [{"host": "localhost", "name": "n0"}, {"host": "localhost", "name": "n1"}],
                "master": {"port": job_port()},
                "env": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"},
                "job": {
                    "python": sys.executable,
                    "workdir": "/tmp",
                    "run_root": str(tmp_path / "nodes"),
                    "script": DDP_JOB,
                    "nproc_per_node": 1,
                    "stop_grace_s": 3,
                    "args": {"steps": 5000, "sleep": 0.1},
                    "container": keys,
                },
            }
        )
    )
    return inv


def test_nodes_on_one_runtime_each_find_their_own_container(local_run: Launched) -> None:
    """Item 7: `transport: local` (or two nodes on one host) puts both containers in one runtime:
    each node's command runs in its own."""
    inside = local_run.orch.run("exec", "--container", local_run.run, "--json", "--", 'echo "$ORCH_NODE"', timeout=120)
    assert inside.returncode == 0, inside.stdout + inside.stderr
    said = {n["node"]: n["stdout"].strip() for n in json.loads(inside.stdout)["nodes"]}
    assert said == {"n0": "n0", "n1": "n1"}, said


def timed_out(orch: Orch, run: str, words: tuple[str, str], *nodes: str) -> None:
    """`--timeout 2` on a command with a child in the background: exit 124, said once nothing of
    the command is left in the containers (no wait: gone when orch said so)."""
    line = f"{words[0]} & {words[1]}"
    limit = [a for n in nodes for a in ("--nodes", n)]
    timed = orch.run("exec", "--container", run, *limit, "--timeout", "2", "--", line, timeout=180)
    assert timed.returncode == 124, timed.stdout + timed.stderr
    assert running(words[0]) == running(words[1]) == [], f"left running after: {timed.stderr}"
    assert "the command's processes in the container were stopped" in timed.stdout + timed.stderr


def interrupted(orch: Orch, run: str, words: tuple[str, str], count: int) -> None:
    """Ctrl-C while the command runs on every node: exit 130, and the command and its background
    child stop in the containers (after orch has exited: nothing there waits for it)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "exec", "--container", run, "--", f"{words[0]} & {words[1]}"],
        cwd=REPO,
        env=orch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: len(running(words[1])) == count or proc.poll() is not None, 60, "the command on every node")
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wait_for(lambda: running(words[0]) == running(words[1]) == [], 60, "the command stopped in the containers")


def test_a_timeout_stops_the_command_in_the_container(local_run: Launched) -> None:
    """Item 5: `--timeout` once stopped the runtime's exec client on the host and said the command's
    process group was stopped; the command ran on in the container."""
    timed_out(local_run.orch, local_run.run, own_sleeps(987, 986), "n0")


def test_ctrl_c_stops_the_command_in_the_container(local_run: Launched) -> None:
    """Item 5: Ctrl-C (exit 130) once left the command running in the container."""
    interrupted(local_run.orch, local_run.run, own_sleeps(985, 984), 2)


def test_over_ssh_a_timeout_and_a_lost_session_stop_the_command_in_the_container(
    podman_cluster: PodmanBed, cluster: TestCluster, orch: Orch, tmp_path: Path
) -> None:
    """Item 5 over real SSH logins, a podman store per node: the tether's stop of a closed session
    (Ctrl-C) and the timeout reach the command inside each node's container."""
    nodes = ["node1", "node2"]
    inv = ddp_inventory(cluster, tmp_path, nodes, steps=5000)
    res = orch.run("up", str(inv), "--run-id", "ctr-exec-ssh", "--skip-checks", "--detach", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    try:
        wait_for(lambda: all(podman_cluster.containers(n, "orch.run=ctr-exec-ssh") for n in nodes), 180, "containers")
        timed_out(orch, "ctr-exec-ssh", own_sleeps(983, 982))
        interrupted(orch, "ctr-exec-ssh", own_sleeps(981, 980), 2)
    finally:
        down = orch.run("down", "ctr-exec-ssh", timeout=180)
        if down.returncode == 1:
            down = orch.run("down", "ctr-exec-ssh", timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert podman_cluster.wait_no_containers("orch.run=ctr-exec-ssh", within=GONE_WITHIN_S) == {}
